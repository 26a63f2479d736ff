#!/usr/bin/env bash
# The Paddle GPU tests (tests/test_gpu.py) over as many device calls as the device time allows
# (carry .gpu2 and .gpu_objs; the runtime's first half installed by an earlier call). Each call runs
# the tests not yet run on this warm machine (/root/pfm_tests_done.txt), one test function after
# another round-robin (so every function is reached early), in SHARDS pytest processes side by side
# (the float64 CPU references bound a test, not the GPU), until CALL_LIMIT_S.
# HARNESS=1 first: the Paddle-free harness's checks and compute-sanitizer on it (HARNESS_DIR holds
# flashmask_harness.xz from harness/build.sh; carry it too). NO_RUNTIME=1: no runtime (a dry run).
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el) s] $*" | tee -a "$OUT/summary.txt"; }
S=${HARNESS_DIR:-.gpu_variants/cur}
if [ "${HARNESS:-0}" = 1 ]; then
  mkdir -p "$OUT/harness"
  H=$S/flashmask_harness; xz -dkf $H.xz && chmod +x $H
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
  for mode in default --check-fa2 --check-hd96 --check-hd192 --check-hd256; do
    arg=$mode; [ "$mode" = default ] && arg=
    timeout 60 $H $arg > "$OUT/harness/check${mode}.log" 2>&1
    log "harness $mode exit $? | $(grep -E '^[0-9]+ failures' "$OUT/harness/check${mode}.log" | tail -1)"
  done
  CS=/usr/local/cuda/bin/compute-sanitizer
  san() {  # tool kernel-substring limit harness-args
    local tool=$1 kns=$2 lim=$3; shift 3
    local f="$OUT/harness/${tool}_${kns}${1:-}.log"
    timeout $lim $CS --tool $tool --kernel-name kns=$kns --error-exitcode 9 $H "$@" > "$f" 2>&1
    log "$tool kns=$kns ${1:-default} (limit $lim s) exit $? | $(grep -E '^[0-9]+ failures' "$f" | tail -1) | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -1)"
  }
  san memcheck flashmask 100
  san synccheck flashmask 70
  san racecheck sm90 90
  san memcheck flashmask 60 --check-fa2
  log "harness done"
fi
[ -n "${NO_RUNTIME:-}" ] || { source benchmarks/device/runtime_env.sh > "$OUT/runtime.stdout" 2>&1; log "runtime and op ready"; }
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
log "$(wc -l < /root/pfm_all_ids.txt) tests collected, $(wc -l < /root/pfm_todo.txt) to run"
SHARDS=${SHARDS:-3}
LEFT=$(( ${CALL_LIMIT_S:-570} - $(el) - 15 ))
n=$(ls "$OUT"/gpu_tests_*.log 2>/dev/null | wc -l)
for k in $(seq 0 $((SHARDS - 1))); do
  awk -v k=$k -v n=$SHARDS 'NR % n == k' /root/pfm_todo.txt > /root/pfm_shard_$k.txt
  OMP_NUM_THREADS=$(( 16 / SHARDS )) timeout -s INT -k 10 $LEFT python3 -c '
import sys, pytest
ids = [l.strip() for l in open(sys.argv[1]) if l.strip()]
sys.exit(pytest.main(["-v", "-p", "no:cacheprovider", "-rfE", *ids]) if ids else 0)' /root/pfm_shard_$k.txt \
    > "$OUT/gpu_tests_shard$k.log" 2>&1 &
done
wait
for k in $(seq 0 $((SHARDS - 1))); do
  sed -nE 's/^(tests\/test_gpu.py::[a-z_0-9]+(\[.*\])?) (PASSED|SKIPPED|FAILED|ERROR).*/\1/p' "$OUT/gpu_tests_shard$k.log" >> $DONE
  log "shard $k: $(tail -1 "$OUT/gpu_tests_shard$k.log")"
done
cat "$OUT"/gpu_tests_shard*.log | grep -cE " PASSED" | sed 's/^/PASSED this call: /'
cat "$OUT"/gpu_tests_shard*.log | grep -E " (FAILED|ERROR)" | head -20
log "done so far: $(sort -u $DONE | wc -l) of $(wc -l < /root/pfm_all_ids.txt)"
cd "$OUT" && tar -cJf /root/tests.tar.xz --exclude=summary.txt . && mv /root/tests.tar.xz .
ls | grep -v -e tests.tar.xz -e summary.txt | xargs rm -rf
