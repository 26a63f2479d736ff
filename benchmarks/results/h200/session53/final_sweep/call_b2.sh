#!/usr/bin/env bash
# Session 53, call B2 (as B1): issue 16's other cells on the final tree against FlexAttention in the
# same call: 128K causal document and share question (head dim 128, 3 repeats); head dim 256 causal,
# causal document and share question at 8K / 32K; head dims 192 / 128 (MLA) causal document and share
# question at 8K / 32K.
set -uo pipefail
ROOT_OUT=${OUT:-/tmp/pfm_out}
sweep() {  # sweep NAME VAR=VALUE...
  local name=$1; shift
  env OUT="$ROOT_OUT/$name" STAGES="bench peers" BENCH_KERNELS=sm90 PEER_IMPLS=flex_attention PEER_KV_HEADS=8 \
    BENCH_REPEATS=3 "$@" bash benchmarks/device/gpu_suite.sh
}
sweep l128k BENCH_LENGTHS=131072 BENCH_MASKS="causal_document share_question" BENCH_BUDGET_S=150 PEER_BUDGET_S=150
sweep hd256 BENCH_DIM=256 BENCH_LENGTHS="8192 32768" BENCH_MASKS="causal causal_document share_question" \
  BENCH_BUDGET_S=90 PEER_BUDGET_S=90
sweep hd192 BENCH_DIM=192 BENCH_LENGTHS="8192 32768" BENCH_MASKS="causal_document share_question" \
  BENCH_BUDGET_S=70 PEER_BUDGET_S=70
