#!/usr/bin/env bash
# Session 44, device call 3 (right after call 2): the Paddle GPU tests on the final tree's objects
# (.gpu_objs, fingerprint 9da8b9fd009d505b): the head-pair tests first, then every other FA2-class test.
# Carry [".gpu2", ".gpu_objs"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
source benchmarks/device/runtime_env.sh
stamp "setup done" | tee -a "$OUT/summary.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "head_pairs" > "$OUT/gpu_tests_head_pairs.log" 2>&1
echo "head-pair tests exit $?: $(tail -1 "$OUT/gpu_tests_head_pairs.log")" | tee -a "$OUT/summary.txt"
grep -E "^FAILED|Error" "$OUT/gpu_tests_head_pairs.log" | head -10 | tee -a "$OUT/summary.txt"
left=$(( 560 - ($(date +%s) - T0) ))
timeout $left python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "fa2 and not head_pairs" > "$OUT/gpu_tests_fa2.log" 2>&1
echo "fa2 tests exit $? (limit ${left} s): $(tail -1 "$OUT/gpu_tests_fa2.log" | cut -c1-300)" | tee -a "$OUT/summary.txt"
grep -E "^FAILED" "$OUT/gpu_tests_fa2.log" | head -10 | tee -a "$OUT/summary.txt"
xz -9 "$OUT/gpu_tests_fa2.log"
stamp "done" | tee -a "$OUT/summary.txt"
