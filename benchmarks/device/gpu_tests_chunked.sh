#!/usr/bin/env bash
# The Paddle GPU tests (tests/test_gpu.py) over as many device calls as the device time allows
# (carry .gpu2 and .gpu_objs; the runtime's first half installed by an earlier call). Each call runs
# the tests not yet run on this warm machine (/root/pfm_tests_done.txt), one test function after
# another round-robin (so every function is reached early), in SHARDS pytest processes side by side
# (the float64 CPU references bound a test, not the GPU), until CALL_LIMIT_S.
# HARNESS=1 first: the Paddle-free harness's checks and compute-sanitizer on it (the harness of
# .gpu_variants/$HARNESS_VARIANT, default cur, from harness/build.sh, packed as flashmask_harness.xz;
# carry that directory too). NO_RUNTIME=1: no runtime (a dry run). Logs: $OUT/logs.tar.xz.
set -uo pipefail
source "$(dirname "$0")/call_lib.sh"
call_begin
if [ "${HARNESS:-0}" = 1 ]; then
  V=${HARNESS_VARIANT:-cur}
  unpack_harness "$V"
  H=.gpu_variants/$V/flashmask_harness
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
  check_run check_default 60 "$H"
  for list in fa2 hd96 hd192 hd256; do check_run "check_$list" 60 "$H" "--check-$list"; done
  sanitize memcheck flashmask 100 memcheck "$H"
  sanitize synccheck flashmask 70 synccheck "$H"
  sanitize racecheck sm90 90 racecheck_sm90 "$H"
  sanitize memcheck flashmask 60 memcheck_fa2 "$H" --check-fa2
fi
if [ -z "${NO_RUNTIME:-}" ]; then
  t0=$T0  # runtime_env.sh starts a clock of its own in T0
  source benchmarks/device/runtime_env.sh > "$OUT/logs/runtime.stdout" 2>&1
  T0=$t0
  stamp "runtime and op ready"
fi
DONE=/root/pfm_tests_done.txt; touch $DONE
python3 -m pytest -q -p no:cacheprovider --collect-only tests/test_gpu.py 2>/dev/null | grep "::" > /root/pfm_all_ids.txt
python3 - "$DONE" <<'PY' > /root/pfm_todo.txt
import sys, collections
done = set(open(sys.argv[1]).read().split("\n"))
by_fn = collections.OrderedDict()
for line in open("/root/pfm_all_ids.txt"):
    node = line.strip()
    if node and node not in done:
        by_fn.setdefault(node.split("[")[0], []).append(node)
lists = list(by_fn.values())
while any(lists):
    for l in lists:
        if l:
            print(l.pop(0))
PY
stamp "$(wc -l < /root/pfm_all_ids.txt) tests collected, $(wc -l < /root/pfm_todo.txt) to run"
SHARDS=${SHARDS:-3}
LEFT=$(( $(seconds_left "${CALL_LIMIT_S:-570}") - 15 ))  # 15 s for the bookkeeping and the packing
for k in $(seq 0 $((SHARDS - 1))); do
  awk -v k=$k -v n=$SHARDS 'NR % n == k' /root/pfm_todo.txt > /root/pfm_shard_$k.txt
  OMP_NUM_THREADS=$(( 16 / SHARDS )) timeout -s INT -k 10 $LEFT python3 -c '
import sys, pytest
ids = [l.strip() for l in open(sys.argv[1]) if l.strip()]
sys.exit(pytest.main(["-v", "-p", "no:cacheprovider", "-rfE", *ids]) if ids else 0)' /root/pfm_shard_$k.txt \
    > "$OUT/logs/gpu_tests_shard$k.log" 2>&1 &
done
wait
for k in $(seq 0 $((SHARDS - 1))); do
  sed -nE 's/^(tests\/test_gpu.py::[a-z_0-9]+(\[.*\])?) (PASSED|SKIPPED|FAILED|ERROR).*/\1/p' "$OUT/logs/gpu_tests_shard$k.log" >> $DONE
  stamp "shard $k: $(tail -1 "$OUT/logs/gpu_tests_shard$k.log")"
done
cat "$OUT"/logs/gpu_tests_shard*.log | grep -cE " PASSED" | sed 's/^/PASSED this call: /'
cat "$OUT"/logs/gpu_tests_shard*.log | grep -E " (FAILED|ERROR)" | head -20
stamp "done so far: $(sort -u $DONE | wc -l) of $(wc -l < /root/pfm_all_ids.txt)"
pack_logs
