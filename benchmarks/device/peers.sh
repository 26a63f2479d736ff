#!/usr/bin/env bash
# Device call 3: the PyTorch peers (FlexAttention, SDPA) in the device's plain python3,
# on the same masks and shapes as bench_gpu.py. No Paddle needed, so a cold machine is fine.
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
unset PYTHONPATH
export PYTHONUNBUFFERED=1
# The device line heads bench_peers.log (at most 8 files of $OUT come back from a call).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/bench_peers.log"
# PEER_IMPLS / PEER_KV_HEADS narrow the 8K/32K sweep (e.g. "flex_attention" / "8", to fit in one
# call with gpu_suite.sh's bench stage).
# BENCH_REPEATS (as gpu_suite.sh's: timed calls per cell of that sweep, default 9).
# BENCH_DIM / BENCH_DIM_V / BENCH_MASKS (as gpu_suite.sh's bench stage): that sweep only
# (BENCH_DIM=192: value head dim 128 unless BENCH_DIM_V says otherwise; SDPA's flash backend is
# left out where value's head dim differs).
python3 benchmarks/bench_gpu_peers.py --lengths ${BENCH_LENGTHS:-8192 32768} --kv-heads ${PEER_KV_HEADS:-8 32} --repeats ${BENCH_REPEATS:-9} \
  --impls ${PEER_IMPLS:-flex_attention sdpa_dense_mask sdpa_flash_causal} \
  --dim "${BENCH_DIM:-128}" ${BENCH_DIM_V:+--dim-v $BENCH_DIM_V} ${BENCH_MASKS:+--masks $BENCH_MASKS} \
  ${BENCH_ROUND:+--round $BENCH_ROUND} \
  --budget-s "${PEER_BUDGET_S:-330}" --out "$OUT/peer_results.jsonl" 2>&1 | tee -a "$OUT/bench_peers.log" | grep "^|"
# BENCH_ROUND (gpu_suite.sh's BENCH_ROUNDS): this sweep is one round of several; no extra lengths.
[[ -n "${BENCH_ROUND:-}${BENCH_DIM:-}${BENCH_DIM_V:-}${BENCH_MASKS:-}${BENCH_LENGTHS:-}${BENCH_KV_HEADS:-}" ]] && exit 0
python3 benchmarks/bench_gpu_peers.py --lengths 16384 --kv-heads 8 32 --masks causal --repeats 5 \
  --out "$OUT/peer_results.jsonl" 2>&1 | grep "^|" | tail -4
python3 benchmarks/bench_gpu_peers.py --lengths 131072 --kv-heads 8 --impls flex_attention \
  --masks causal_document share_question sliding_window --repeats 1 --budget-s 100 \
  --out "$OUT/peer_results.jsonl" 2>&1 | grep "^|" | tail -3
