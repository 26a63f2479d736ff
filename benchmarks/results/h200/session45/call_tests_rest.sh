#!/usr/bin/env bash
# Session 45, Paddle call (right after `bash .gpu1/device-install.sh`): every FA2-class Paddle GPU
# test that call_tests.sh did not run, on the landed tree's objects (f1108ca, fingerprint
# 158a54aabc02bac7). Carry [".gpu2", ".gpu_objs"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
source benchmarks/device/runtime_env.sh
stamp "setup done" | tee -a "$OUT/summary.txt"
left=$(( 570 - ($(date +%s) - T0) ))
timeout "$left" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py \
  -k "fa2 and not (head_pairs or fa2_long_ctas or many_tiles or order or global or dead or coarse or 99k)" \
  > "$OUT/gpu_tests_fa2_rest2.log" 2>&1
echo "fa2 rest exit $? (limit $left s): $(tail -1 "$OUT/gpu_tests_fa2_rest2.log" | cut -c1-200)" | tee -a "$OUT/summary.txt"
grep -E "^FAILED" "$OUT/gpu_tests_fa2_rest2.log" | head -10 | tee -a "$OUT/summary.txt"
xz -9 "$OUT/gpu_tests_fa2_rest2.log"
stamp "done" | tee -a "$OUT/summary.txt"
