#!/usr/bin/env bash
# Builds the Paddle-free harness on a CPU machine with nvcc (for sm_90a):
# the CPU kernel sources (the reference) plus the CUDA objects.
#   bash benchmarks/device/harness/build.sh [out_dir]   -> out_dir/flashmask_harness
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-.gpu_objs}
export PADDLE_FLASHMASK_CUDA_ARCHS=${PADDLE_FLASHMASK_CUDA_ARCHS:-90a}
python3 setup_ops.py cuda-objects "$OUT" >/dev/null
CPU="custom_ops/flashmask/cpu/mask_prep_cpu.cc custom_ops/flashmask/cpu/flashmask_fwd_cpu.cc custom_ops/flashmask/cpu/flashmask_bwd_cpu.cc"
nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fopenmp,-march=x86-64-v3 \
  -o "$OUT/flashmask_harness" benchmarks/device/harness/flashmask_harness.cu $CPU "$OUT"/*.o -lpthread
# The CuTe/CUTLASS headers for the op's JIT build on the device (runtime_env.sh unpacks
# them): its python3 has no nvidia-cutlass, and without them the op builds no sm90 kernels.
CUTLASS_INCLUDE=$(python3 -c "from paddle_flashmask import _op_sources as s; print(s.cutlass_include_dir() or '')")
[ -n "$CUTLASS_INCLUDE" ] || { echo "no CUTLASS headers: pip install --no-deps nvidia-cutlass==4.2.0.0" >&2; exit 1; }
tar cJf "$OUT/cutlass-include.tar.xz" -C "$CUTLASS_INCLUDE" cute cutlass
echo "built $OUT/flashmask_harness and $OUT/cutlass-include.tar.xz"
