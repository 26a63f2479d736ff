#!/usr/bin/env bash
# One device call (after `bash .gpu1/device-install.sh`; carry .gpu2 and .gpu_objs, benchmarks/results
# moved aside): issue 16's cells on the tree's Hopper kernels, FlexAttention (PyTorch 2.11) in the
# same call on the same mask instances. Session 53's H200 calls B1, B2 and its third command in one:
# every mask at 8K/32K (hd128, 5 repeats), 128K causal document / share question, head dim 256,
# head dims 192/128, 16K causal and full, then op_host_block.py (GPU-only and back-to-back pace).
# Each gpu_suite.sh run starts only before its deadline (seconds into the call) so the whole stays
# under the tool's 600 s; its directory comes back in $OUT/logs.tar.xz (a call returns at most 8 files).
set -uo pipefail
source "$(dirname "$0")/call_lib.sh"
call_begin
ran=()
suite() {  # suite NAME LATEST_START_S VAR=VALUE...: gpu_suite.sh into $OUT/NAME
  local name=$1 latest=$2; shift 2
  if (( $(seconds_left "$latest") < 0 )); then stamp "$name skipped (past its start deadline, ${latest} s)"; return; fi
  env OUT="$OUT/$name" "$@" bash benchmarks/device/gpu_suite.sh > "$OUT/logs/$name.stdout" 2>&1
  stamp "$name exit $?"
  grep -E "^[|#]" "$OUT/logs/$name.stdout" | grep -v -- "---" | tail -40
  ran+=("$name")
}
sweep() {  # sweep NAME LATEST_START_S VAR=VALUE...: ours, then Flex, one mask set
  local name=$1 latest=$2; shift 2
  suite "$name" "$latest" STAGES="bench peers" BENCH_KERNELS=sm90 PEER_IMPLS=flex_attention PEER_KV_HEADS=8 \
    BENCH_REPEATS=3 "$@"
}
sweep hd128 60 BENCH_LENGTHS="8192 32768" BENCH_REPEATS=5 BENCH_BUDGET_S=200 PEER_BUDGET_S=170
sweep l128k 330 BENCH_LENGTHS=131072 BENCH_MASKS="causal_document share_question" BENCH_BUDGET_S=100 PEER_BUDGET_S=100
sweep hd256 420 BENCH_DIM=256 BENCH_LENGTHS="8192 32768" BENCH_MASKS="causal causal_document share_question" \
  BENCH_BUDGET_S=60 PEER_BUDGET_S=60
sweep hd192 470 BENCH_DIM=192 BENCH_LENGTHS="8192 32768" BENCH_MASKS="causal_document share_question" \
  BENCH_BUDGET_S=45 PEER_BUDGET_S=45
sweep l16k 480 BENCH_LENGTHS=16384 BENCH_MASKS="causal full" BENCH_REPEATS=5 BENCH_BUDGET_S=30 PEER_BUDGET_S=30
suite probe 520 STAGES=kernels KERNELS_NCU=0 OP_PROBE_LENGTHS="8192 16384 32768" KERNELS_TIMEOUT_S=25
pack_logs "${ran[@]}"
