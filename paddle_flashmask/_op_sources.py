"""Sources and compiler flags of the custom op, shared by setup_ops.py and the JIT loader.

Kept free of imports from the rest of the package so setup_ops.py can read it
before anything is built.
"""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS_DIR = os.path.join(REPO_ROOT, "custom_ops")

# Name of the Python module Paddle generates for the op library.
OP_MODULE_NAME = "paddle_flashmask_ops"

CPU_SOURCES = [
    "paddle/flashmask_op.cc",
    "flashmask/cpu/mask_prep_cpu.cc",
    "flashmask/cpu/flashmask_fwd_cpu.cc",
    "flashmask/cpu/flashmask_bwd_cpu.cc",
]


# CUDA: the framework-neutral kernels (custom_ops/flashmask/cuda), compiled
# when the installed Paddle has CUDA; one instantiation file per config.
CUDA_DIR = os.path.join(OPS_DIR, "flashmask", "cuda")


def cuda_sources():
    return sorted(
        os.path.join(CUDA_DIR, f) for f in os.listdir(CUDA_DIR) if f.endswith(".cu")
    )


def cuda_enabled():
    """Build the CUDA kernels: Paddle has CUDA and PADDLE_FLASHMASK_WITH_CUDA is not 0."""
    if os.environ.get("PADDLE_FLASHMASK_WITH_CUDA", "1") == "0":
        return False
    import paddle

    return bool(paddle.is_compiled_with_cuda())


def source_paths():
    srcs = [os.path.join(OPS_DIR, s) for s in CPU_SOURCES]
    if cuda_enabled():
        srcs += cuda_sources()
    return srcs


def cuda_archs():
    # sm_80 (mma.sync path) and sm_90a (Hopper); PADDLE_FLASHMASK_CUDA_ARCHS="80;90a" style.
    return [a for a in os.environ.get("PADDLE_FLASHMASK_CUDA_ARCHS", "80;90a").split(";") if a]


def nvcc_flags():
    flags = ["-O3", "-std=c++17", "-DFLASHMASK_WITH_CUDA", "--expt-relaxed-constexpr"]
    for arch in cuda_archs():
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    return flags


def header_paths():
    out = []
    for root, _, files in os.walk(OPS_DIR):
        out += [os.path.join(root, f) for f in files if f.endswith((".h", ".cuh"))]
    return sorted(out)


def cxx_flags():
    # The op is compiled on the machine that runs it, so tune for its CPU;
    # PADDLE_FLASHMASK_CPU_ARCH=x86-64-v2 (say) builds a portable binary.
    arch = os.environ.get("PADDLE_FLASHMASK_CPU_ARCH", "native")
    flags = ["-O3", "-std=c++17", f"-march={arch}", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
    if cuda_enabled():
        flags.append("-DFLASHMASK_WITH_CUDA")
        flags += [f"-I{d}" for d in cuda_include_dirs()]
    return flags


def cuda_include_dirs():
    # Paddle's headers include thrust; CUDA >= 13 keeps it under include/cccl.
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    dirs = [os.path.join(home, "include"), os.path.join(home, "include", "cccl")]
    return [d for d in dirs if os.path.isdir(d)]
