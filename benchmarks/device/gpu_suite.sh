#!/usr/bin/env bash
# Device call 2 (after `bash .gpu1/device-install.sh` in call 1): installs the Paddle GPU
# runtime (../shared/tools/paddle-gpu-runtime), builds the op for sm_90a, runs the GPU
# tests and our benchmark (and, asked for, compute-sanitizer on small op calls). Logs and results go to $OUT.
# The sanitize stage (compute-sanitizer over tests/gpu_sanitize_cases.py inside the Paddle runtime) is
# opt-in: on the runtime of the 192/128 session and on the H100 of 2026-11-27 memcheck died with a
# segmentation fault in Paddle's device init and racecheck/synccheck printed nothing before their timeouts
# (benchmarks/results/h100/v19_final_checks/), costing up to 3 x SANITIZE_TIMEOUT_S of device time. The
# sanitizer runs on the Paddle-free harness instead: ab_sm90.sh CHECKS=0 PASSES=0 SANITIZE=1.
#   STAGES="harness tests sanitize overhead kernels indexcheck hostparts hostprof bench peers"  TEST_SELECT="<pytest -k expression>"  BENCH_BUDGET_S=150
#   OVERHEAD_LENGTHS="8192" OVERHEAD_MASKS="causal short_documents"  (overhead: benchmarks/op_overhead.py,
#   per call / back to back / GPU only / host time of the op on those masks)
#   BENCH_KERNELS="sm90 fa2"  (peers: benchmarks/device/peers.sh in the same call, outside the
#   Paddle runtime's environment: ours and FlexAttention measured in one call)
#   BENCH_LENGTHS="8192"  (the sweep's lengths, default 8192 32768; peers.sh takes it too)
#   BENCH_KV_HEADS="32"  (the sweep's kv heads of the 32 query heads, default 8; peers.sh: PEER_KV_HEADS)
#   BENCH_REPEATS=3  (timed calls per cell of that sweep, the median kept; peers.sh too). Default 9:
#   with 3, one slow sample moved two 32K cells of an H100 call by 0.1x Flex (RESULTS_H100.md)
#   BENCH_DIM=256 BENCH_MASKS="causal causal_document"  (one head dim / fewer masks: the 8K/32K
#   sweep only; peers.sh takes the same variables). BENCH_DIM is the query/key head dim; value's
#   is the one the GPU kernels take with it (BENCH_DIM=192: v 128, MLA; with BENCH_KERNELS=sm90,
#   the FA2-class kernels have no 192) unless BENCH_DIM_V says otherwise.
#   HARNESS_ARGS="--time-hd256"  (the harness timing mode, or --time-hd192 for 192/128; default --time-fwd)
#   BENCH_ROUNDS=3  (with bench and peers: both sweeps 3 times, alternately, records tagged by round;
#   $OUT/rounds_summary.md: each cell's median and range, ours against each peer round by round)
#   CLOCK_LOG_MS=200  (with bench or peers: $OUT/gpu_clocks.csv, nvidia-smi every that many ms: SM
#   clock, power, temperature, clock event reasons; and clock_summary.md, clock_summary.py's reading of
#   that log over each record's timed window). Off by default: the one 8K sweep with a 50 ms log had
#   2x outliers in both sides' per-call times, which the 200 ms calls did not show (NOTES.md).
# (harness: the Paddle-free check of every case, then --time-fwd, the sm90 forward's
# schedules timed interleaved; needs .gpu_objs/flashmask_harness from harness/build.sh)
# Carry .gpu_objs (benchmarks/device/harness/build.sh: the CUDA objects prebuilt on the
# CPU machine, plus cutlass-include.tar.xz, the CuTe headers) to skip most of the build;
# objects that do not match the sources are rebuilt here, in parallel. The objects may travel as
# .gpu_objs/objs.tar.xz (tar -cJf of the *.o files, ~0.7 MB), which runtime_env.sh unpacks.
# Size: a call carries the tracked tree with a runtime half (46 MB) under the tool's 64 MiB, so the
# tree must stay under ~18 MB: keep large raw results xz-compressed (the 2026-11-28 tree, 21.5 MB with
# gzip'd profiles, was refused until they were; timeline_summary.py reads .xz).
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
STAGES=${STAGES-"tests bench"}  # set but empty: none (only the runtime and the op build)
[[ -z "${CLOCK_LOG_MS:-}" || "$CLOCK_LOG_MS" =~ ^[1-9][0-9]*$ ]] \
  || { echo "CLOCK_LOG_MS must be a positive whole number of milliseconds, got '$CLOCK_LOG_MS'"; exit 2; }
ROUNDS=${BENCH_ROUNDS:-1}
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_ROUNDS must be a positive whole number, got '$ROUNDS'"; exit 2; }
if (( ROUNDS > 1 )) && [[ " $STAGES " != *" bench "* || " $STAGES " != *" peers "* ]]; then
  echo "BENCH_ROUNDS=$ROUNDS needs both the bench and peers stages, got STAGES='$STAGES'"; exit 2
fi
source benchmarks/device/runtime_env.sh

if [[ " $STAGES " == *" harness "* ]]; then
  timeout "${HARNESS_TIMEOUT_S:-120}" .gpu_objs/flashmask_harness > "$OUT/harness_check.log" 2>&1
  echo "harness exit $?: $(tail -1 "$OUT/harness_check.log")"
  harness_mode=${HARNESS_ARGS:---time-fwd}
  timeout "${HARNESS_TIME_TIMEOUT_S:-300}" .gpu_objs/flashmask_harness $harness_mode > "$OUT/harness_time${harness_mode//-/_}.log" 2>&1
  echo "harness $harness_mode exit $?"; grep -E "failures|FAIL" "$OUT/harness_time${harness_mode//-/_}.log" | head -5
  stamp "harness done"
fi

if [[ " $STAGES " == *" tests "* ]]; then
  timeout "${TEST_TIMEOUT_S:-420}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py ${TEST_SELECT:+-k "$TEST_SELECT"} \
    > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"; grep -E "passed|failed|Error|error:|assert" "$OUT/gpu_tests.log" | tail -25
  stamp "tests done"
fi

if [[ " $STAGES " == *" sanitize "* ]]; then
  for tool in memcheck racecheck synccheck; do
    timeout "${SANITIZE_TIMEOUT_S:-300}" compute-sanitizer --tool $tool --kernel-name kns=flashmask --error-exitcode 9 \
      python3 tests/gpu_sanitize_cases.py > "$OUT/sanitize_$tool.log" 2>&1
    echo "compute-sanitizer $tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
  done
  stamp "sanitizer done"
fi

if [[ " $STAGES " == *" overhead "* ]]; then
  timeout "${OVERHEAD_TIMEOUT_S:-200}" python3 benchmarks/op_overhead.py --lengths ${OVERHEAD_LENGTHS:-8192} \
    --masks ${OVERHEAD_MASKS:-causal causal_document short_documents} 2>&1 | grep -v -E "^W|^I[0-9]" > "$OUT/op_overhead.log"
  echo "op_overhead exit ${PIPESTATUS[0]}"; grep "^|" "$OUT/op_overhead.log"
  stamp "overhead done"
fi

# kernels: each kernel one backward of the op launches and its duration under Nsight Compute
# (benchmarks/device/op_bwd_kernels.py, causal 8K 32:8 D=128; OP_BWD_WHICH grad, then alone),
# then whether a call of the op waits for the GPU on the host (op_host_block.py; OP_PROBE_LENGTHS="8192 32768"
# for more lengths than 8K, KERNELS_NCU=0 for that probe alone).
if [[ " $STAGES " == *" kernels "* ]]; then
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for which in $( [ "${KERNELS_NCU:-1}" = 1 ] && echo grad alone ); do  # KERNELS_NCU=0: the host probe only
    OP_BWD_WHICH=$which timeout "${KERNELS_TIMEOUT_S:-180}" "$NCU" --profile-from-start off --cache-control none \
      --clock-control none --metrics gpu__time_duration.sum --csv python3 benchmarks/device/op_bwd_kernels.py \
      > "$OUT/op_bwd_kernels_$which.csv" 2>&1
    echo "op_bwd_kernels $which exit $?"
    python3 benchmarks/device/op_bwd_kernels.py --summary "$OUT/op_bwd_kernels_$which.csv"
  done
  # Whether a call waits for the GPU on the host (benchmarks/device/op_host_block.py).
  clock_pid=
  if [ -n "${OP_CLOCK_LOG:-}" ]; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 20 \
      > "$OUT/op_host_block_clocks.csv" 2>&1 &
    clock_pid=$!
  fi
  for seqlen in ${OP_PROBE_LENGTHS:-8192}; do  # one log for them all
    OP_BWD_SEQLEN=$seqlen timeout "${KERNELS_TIMEOUT_S:-180}" python3 benchmarks/device/op_host_block.py 2>&1 \
      | grep -v -E "^W|^I[0-9]" >> "$OUT/op_host_block.log"
    echo "op_host_block $seqlen exit ${PIPESTATUS[0]}"
  done
  [ -n "$clock_pid" ] && kill "$clock_pid" 2>/dev/null
  grep -E "^[|#]" "$OUT/op_host_block.log"
  stamp "kernels done"
fi

# indexcheck: what the op's index check costs a model's layers, checked once against every layer
# (benchmarks/device/op_index_check.py; OP_INDEX_LAYERS, OP_INDEX_SEQLEN).
if [[ " $STAGES " == *" indexcheck "* ]]; then
  timeout "${INDEXCHECK_TIMEOUT_S:-120}" python3 benchmarks/device/op_index_check.py 2>&1 \
    | grep -v -E "^W|^I[0-9]" > "$OUT/op_index_check.log"
  echo "op_index_check exit ${PIPESTATUS[0]}"; grep -E "^[|#]" "$OUT/op_index_check.log"
  stamp "indexcheck done"
fi

# hostparts: a forward call's host microseconds part by part (benchmarks/device/op_host_parts.py).
if [[ " $STAGES " == *" hostparts "* ]]; then
  timeout "${HOSTPARTS_TIMEOUT_S:-120}" python3 benchmarks/device/op_host_parts.py 2>&1 \
    | grep -v -E "^W|^I[0-9]" > "$OUT/op_host_parts.log"
  echo "op_host_parts exit ${PIPESTATUS[0]}"; grep -E "^[|#]" "$OUT/op_host_parts.log"
  stamp "hostparts done"
fi

# hostprof: where a call's host time goes (benchmarks/device/op_host_profile.py under py-spy --native,
# then host_profile_summary.py). py-spy is not on the device: unzip its PyPI wheel into /root/pyspy
# in an earlier call of the same warm machine (HOSTPROF_PYSPY names the binary). HOSTPROF_CALLS:
# call kinds of op_probe_case.py separated by '|' (default "fwd|fwd op alone|bwd paddle.grad").
if [[ " $STAGES " == *" hostprof "* ]]; then
  PYSPY=${HOSTPROF_PYSPY:-/root/pyspy/py-spy}
  IFS='|' read -ra HOSTPROF_KINDS <<< "${HOSTPROF_CALLS:-fwd|fwd op alone|bwd paddle.grad}"
  for kind in "${HOSTPROF_KINDS[@]}"; do
    tag=${kind// /_}
    # The loop's host us a call without the sampler, then the sampled run.
    us=$(timeout 120 python3 benchmarks/device/op_host_profile.py "$kind" 2 2>/dev/null \
         | awk '/^LOOP/ { split($2, c, "="); split($3, s, "="); printf "%.1f", s[2] / c[2] * 1e6 }')
    timeout 180 "$PYSPY" record --native -r 997 -f raw -o "$OUT/hostprof_$tag.txt" -- \
      python3 benchmarks/device/op_host_profile.py "$kind" 3 > "$OUT/hostprof_$tag.log" 2>&1
    echo "hostprof $kind exit $?: ${us:-?} us a call without the sampler"
    [ -s "$OUT/hostprof_$tag.txt" ] && python3 benchmarks/device/host_profile_summary.py "$OUT/hostprof_$tag.txt" \
      ${us:+--us-per-call $us} --min-share 0.02 > "$OUT/hostprof_$tag.md" 2>&1 && head -30 "$OUT/hostprof_$tag.md"
  done
  stamp "hostprof done"
fi

# The clock log of the header (clock_event_reasons is the newer drivers' name; older ones lack it).
CLOCK_LOGGER=
if [[ -n "${CLOCK_LOG_MS:-}" && ( " $STAGES " == *" bench "* || " $STAGES " == *" peers "* ) ]]; then
  fields=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits > /dev/null 2>&1 || fields=${fields%,*}
  nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits -lms "$CLOCK_LOG_MS" > "$OUT/gpu_clocks.csv" 2>&1 &
  CLOCK_LOGGER=$!
fi

bench_sweep() {  # our sweep (round $1, or none)
  python3 benchmarks/bench_gpu.py --lengths ${BENCH_LENGTHS:-8192 32768} --kv-heads ${BENCH_KV_HEADS:-8} --repeats ${BENCH_REPEATS:-9} --gpu-kernels ${BENCH_KERNELS:-sm90 fa2} \
    --dim "${BENCH_DIM:-128}" ${BENCH_DIM_V:+--dim-v $BENCH_DIM_V} ${BENCH_MASKS:+--masks $BENCH_MASKS} ${1:+--round $1} \
    --budget-s "${BENCH_BUDGET_S:-300}" --out "$OUT/gpu_results.jsonl" 2>&1 | grep -v -E "^W|^I[0-9]" | tee -a "$OUT/bench_ours.log" | grep "^| sm90"
}
peer_sweep() {  # the device's plain python3 with PyTorch: none of the Paddle runtime's paths
  env -u PYTHONPATH -u LD_LIBRARY_PATH BENCH_ROUND="${1:-}" bash benchmarks/device/peers.sh
}
# BENCH_ROUNDS=N (with both stages): our sweep and the peers' N times, alternately (ours first in odd
# rounds, the peers first in even ones), each record tagged with its round; then
# benchmarks/rounds_summary.py's medians and ranges into $OUT/rounds_summary.md. Only the narrowed
# sweep (BENCH_* variables) runs per round, not the default extra lengths.
if (( ROUNDS > 1 )); then
  for round in $(seq "$ROUNDS"); do
    if (( round % 2 )); then bench_sweep "$round"; peer_sweep "$round"; else peer_sweep "$round"; bench_sweep "$round"; fi
    stamp "round $round done"
  done
  python3 benchmarks/rounds_summary.py "$OUT/gpu_results.jsonl" "$OUT/peer_results.jsonl" --out "$OUT/rounds_summary.md" \
    && cat "$OUT/rounds_summary.md"
fi
if (( ROUNDS == 1 )) && [[ " $STAGES " == *" bench "* ]]; then
  bench_sweep
fi
if (( ROUNDS == 1 )) && [[ " $STAGES " == *" bench "* && -z "${BENCH_DIM:-}${BENCH_DIM_V:-}${BENCH_MASKS:-}${BENCH_LENGTHS:-}${BENCH_KV_HEADS:-}" ]]; then
  python3 benchmarks/bench_gpu.py --lengths 16384 --kv-heads 8 32 --masks causal --repeats 5 --gpu-kernels ${BENCH_KERNELS:-sm90 fa2} \
    --out "$OUT/gpu_results.jsonl" 2>&1 | grep "^|" | tail -4
  python3 benchmarks/bench_gpu.py --lengths 131072 --kv-heads 8 --masks causal_document share_question sliding_window \
    --repeats 1 --gpu-kernels sm90 --budget-s 60 --out "$OUT/gpu_results.jsonl" 2>&1 | grep "^|" | tail -3
  stamp "bench done"
fi

if (( ROUNDS == 1 )) && [[ " $STAGES " == *" peers "* ]]; then
  peer_sweep
  stamp "peers done"
fi

if [ -n "$CLOCK_LOGGER" ]; then
  kill "$CLOCK_LOGGER" 2>/dev/null; wait "$CLOCK_LOGGER" 2>/dev/null
  results=$(ls "$OUT"/gpu_results.jsonl "$OUT"/peer_results.jsonl 2>/dev/null)
  [ -n "$results" ] && python3 benchmarks/device/clock_summary.py "$OUT/gpu_clocks.csv" $results \
    | tee "$OUT/clock_summary.md" | tail -n +3 | cut -d'|' -f2-4,7-11
fi
