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


def source_paths():
    return [os.path.join(OPS_DIR, s) for s in CPU_SOURCES]


def header_paths():
    out = []
    for root, _, files in os.walk(OPS_DIR):
        out += [os.path.join(root, f) for f in files if f.endswith((".h", ".cuh"))]
    return sorted(out)


def cxx_flags():
    # The op is compiled on the machine that runs it, so tune for its CPU;
    # PADDLE_FLASHMASK_CPU_ARCH=x86-64-v2 (say) builds a portable binary.
    arch = os.environ.get("PADDLE_FLASHMASK_CPU_ARCH", "native")
    return ["-O3", "-std=c++17", f"-march={arch}", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
