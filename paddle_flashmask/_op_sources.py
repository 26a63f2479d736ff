"""Sources and compiler flags of the custom op, shared by setup_ops.py and the JIT loader.

Kept free of imports from the rest of the package so setup_ops.py can read it
before anything is built.
"""

import functools
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
    "paddle/cp_ops.cc",
    "flashmask/cpu/cp_ops_cpu.cc",
]


# CUDA: the framework-neutral kernels (custom_ops/flashmask/cuda), compiled
# when the installed Paddle has CUDA; one instantiation file per config.
CUDA_DIR = os.path.join(OPS_DIR, "flashmask", "cuda")


SM90_DIR = os.path.join(CUDA_DIR, "sm90")


def cuda_sources():
    # FA2-class kernels and helpers, the sm90 dispatch (always: it reports
    # whether the Hopper kernels are built) and, for a 90a build, the Hopper
    # kernel instantiations.
    srcs = sorted(os.path.join(CUDA_DIR, f) for f in os.listdir(CUDA_DIR) if f.endswith(".cu"))
    srcs.append(os.path.join(SM90_DIR, "flashmask_sm90_api.cu"))
    if sm90_enabled():
        srcs += sm90_kernel_sources()
    return srcs


def sm90_kernel_sources():
    return sorted(
        os.path.join(SM90_DIR, f)
        for f in os.listdir(SM90_DIR)
        if f.endswith(".cu") and f != "flashmask_sm90_api.cu"
    )


@functools.lru_cache(maxsize=None)
def sm90_built():
    """Whether the op built from these sources has the Hopper kernels (the same decision the
    build takes); None where the sources are absent (an op installed without them). Asked once
    per process, like the build (it stats files and reads the environment: 35 us, on every call
    with gpu_kernel "sm90")."""
    if not os.path.isdir(OPS_DIR):
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sm90_enabled's "no CUTLASS headers" notice
        return cuda_enabled() and sm90_enabled()


def cutlass_include_dir():
    """CUTLASS/CuTe headers: $PADDLE_FLASHMASK_CUTLASS_INCLUDE, else the nvidia-cutlass wheel's."""
    env = os.environ.get("PADDLE_FLASHMASK_CUTLASS_INCLUDE")
    if env:
        return env if os.path.isdir(os.path.join(env, "cute")) else None
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    for root in (spec.submodule_search_locations or []) if spec else []:
        inc = os.path.join(root, "source", "include")
        if os.path.isdir(os.path.join(inc, "cute")):
            return inc
    return None


def sm90_enabled():
    """Hopper kernels: the arch list has 90a and the CuTe headers are installed."""
    if "90a" not in cuda_archs():
        return False
    if cutlass_include_dir() is None:
        import warnings

        warnings.warn(
            "paddle_flashmask: building without the sm90 (Hopper) kernels: CUTLASS/CuTe headers "
            "not found (`pip install --no-deps nvidia-cutlass==4.2.0.0` or set "
            "PADDLE_FLASHMASK_CUTLASS_INCLUDE)",
            stacklevel=2,
        )
        return False
    return True


def cuda_enabled():
    """Build the CUDA kernels: Paddle has CUDA and PADDLE_FLASHMASK_WITH_CUDA is not 0."""
    if os.environ.get("PADDLE_FLASHMASK_WITH_CUDA", "1") == "0":
        return False
    import paddle

    return bool(paddle.is_compiled_with_cuda())


def source_paths():
    # Everything the op is built from (the CUDA sources are compiled to objects
    # separately, in parallel; see compile_cuda_objects).
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
    if sm90_enabled():
        flags += ["-DFLASHMASK_WITH_SM90", f"-I{cutlass_include_dir()}"]
    return flags


def header_paths():
    out = []
    for root, _, files in os.walk(OPS_DIR):
        out += [os.path.join(root, f) for f in files if f.endswith((".h", ".cuh"))]
    return sorted(out)


# Headers no CUDA source includes: the CPU kernels' and the Paddle glue's. Left out of the CUDA
# fingerprint so a CPU-only change keeps the prebuilt CUDA objects (a rebuild of every kernel).
_HOST_ONLY_HEADER_DIRS = (os.path.join(OPS_DIR, "flashmask", "cpu"), os.path.join(OPS_DIR, "paddle"))


def cuda_header_paths():
    return [p for p in header_paths() if os.path.dirname(p) not in _HOST_ONLY_HEADER_DIRS]


def cxx_flags():
    # The op is compiled on the machine that runs it, so tune for its CPU;
    # PADDLE_FLASHMASK_CPU_ARCH=x86-64-v2 (say) builds a portable binary.
    arch = os.environ.get("PADDLE_FLASHMASK_CPU_ARCH", "native")
    flags = ["-O3", "-std=c++17", f"-march={arch}", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
    if cuda_enabled():
        flags += ["-DFLASHMASK_WITH_CUDA", "-DPADDLE_WITH_CUDA"]
        flags += [f"-I{d}" for d in cuda_include_dirs()]
    return flags


def cuda_home():
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"


def nvcc_path():
    path = os.path.join(cuda_home(), "bin", "nvcc")
    if os.path.exists(path):
        return path
    import shutil

    return shutil.which("nvcc") or "nvcc"


def cuda_fingerprint():
    """Hash of what goes into the CUDA objects: sources, headers, nvcc flags (not include paths)."""
    import hashlib

    h = hashlib.sha256()
    for path in cuda_sources() + cuda_header_paths():
        h.update(os.path.relpath(path, OPS_DIR).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(" ".join(f for f in nvcc_flags() if not f.startswith("-I")).encode())
    return h.hexdigest()[:16]


def compile_cuda_objects(out_dir, jobs=None, reuse_dirs=()):
    """Compiles every CUDA source to an object in `out_dir`, in parallel; returns the paths.
    An object found in one of `reuse_dirs` (directories of objects of these very sources and
    flags: their FINGERPRINT matched) is taken as it is, the first directory's first; only
    the others are compiled.

    The kernels are framework-neutral, so the objects need no Paddle: they can be
    built on any machine with the same nvcc and linked into the op elsewhere
    (PADDLE_FLASHMASK_CUDA_OBJECTS, see _loader.py).
    """
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    os.makedirs(out_dir, exist_ok=True)
    flags = nvcc_flags() + ["-Xcompiler", "-fPIC"] + [f"-I{d}" for d in cuda_include_dirs()]

    def one(src):
        name = os.path.basename(src) + ".o"
        for d in reuse_dirs:
            if os.path.exists(os.path.join(d, name)):
                return os.path.join(d, name)
        obj = os.path.join(out_dir, name)
        res = subprocess.run([nvcc_path(), "-c", src, "-o", obj, *flags], check=False, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed on {src}:\n{res.stdout}{res.stderr}")
        return obj

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
        objects = list(pool.map(one, cuda_sources()))
    with open(os.path.join(out_dir, "FINGERPRINT"), "w") as f:
        f.write(cuda_fingerprint())
    return objects


def cuda_link_flags(objects):
    return list(objects) + [f"-L{os.path.join(cuda_home(), 'lib64')}", "-lcudart"]


def cuda_include_dirs():
    # Paddle's headers include thrust; CUDA >= 13 keeps it under include/cccl.
    home = cuda_home()
    dirs = [os.path.join(home, "include"), os.path.join(home, "include", "cccl")]
    return [d for d in dirs if os.path.isdir(d)]
