#!/usr/bin/env bash
# Session 50, device call B (after `bash .gpu1/device-install.sh` in call A): the Paddle GPU tests on
# 132cc4c's tree, none of which ran after f9f84d0 (the staged backward's load_next helper: every
# FA2-class backward) and 328b154 (test_gpu.py's set_switch helper). First the tests that use the
# helper (light-last, dK/dV direct stores of both families, GQA heads), then every other `fa2` test
# until the time limit; the ones not reached run by node id in a later call.
# Carry [".gpu2", ".gpu_objs"] with benchmarks/results moved aside (the 64 MiB carry limit).
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
source benchmarks/device/runtime_env.sh
stamp "runtime and op ready"
FIRST="light_last or dkv_direct or gqa_heads"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "$FIRST" > "$OUT/gpu_tests_switches.log" 2>&1
stamp "switch tests exit $?: $(tail -1 "$OUT/gpu_tests_switches.log")"
LEFT=$(( ${CALL_LIMIT_S:-575} - ($(date +%s) - T0) ))
timeout "$LEFT" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "fa2 and not ($FIRST)" -rA \
  > "$OUT/gpu_tests_fa2.log" 2>&1
stamp "fa2 tests exit $?: $(tail -1 "$OUT/gpu_tests_fa2.log")"
grep -c "^PASSED" "$OUT/gpu_tests_fa2.log" | sed 's/^/passed lines: /'
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_fa2.log" | head -20
xz -9 "$OUT/gpu_tests_fa2.log"
