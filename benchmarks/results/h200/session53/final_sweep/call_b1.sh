#!/usr/bin/env bash
# Session 53, call B1 (after `bash .gpu1/device-install.sh`; carry .gpu2 and .gpu_objs; benchmarks/results
# moved aside so the tree fits beside the runtime's half): the Hopper kernels of the final tree (CUDA
# fingerprint 20e25c23d1199750, the kernels of 132cc4c) against FlexAttention, every mask at 8K and
# 32K, head dim 128, 32:8, 5 repeats, ours then Flex in the same call on the same mask instances.
set -uo pipefail
export OUT=${OUT:-/tmp/pfm_out}
STAGES="bench peers" BENCH_KERNELS=sm90 BENCH_LENGTHS="8192 32768" BENCH_REPEATS=5 BENCH_BUDGET_S=260 \
  PEER_IMPLS=flex_attention PEER_KV_HEADS=8 PEER_BUDGET_S=220 bash benchmarks/device/gpu_suite.sh
