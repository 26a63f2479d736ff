#!/usr/bin/env bash
# Session 45, Paddle call (right after `bash .gpu1/device-install.sh`): the Paddle GPU tests that run
# head pairs under the longest-first order (the order's floors at 1: the bitwise test's `ordered`
# cases, the long-CTA tests, whose 8:2 and 6:3 calls now pair), then the other FA2-class tests
# that lower the floors or pair heads. Carry [".gpu2", ".gpu_objs"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
source benchmarks/device/runtime_env.sh
stamp "setup done" | tee -a "$OUT/summary.txt"
run_tests() {  # NAME SECONDS EXPR
  timeout "$2" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "$3" > "$OUT/gpu_tests_$1.log" 2>&1
  echo "$1 exit $?: $(tail -1 "$OUT/gpu_tests_$1.log" | cut -c1-200)" | tee -a "$OUT/summary.txt"
  grep -E "^FAILED|^E .*Error" "$OUT/gpu_tests_$1.log" | head -10 | tee -a "$OUT/summary.txt"
}
run_tests pairs_long 200 "head_pairs or fa2_long_ctas"
left=$(( 560 - ($(date +%s) - T0) ))
run_tests fa2_rest "$left" "fa2 and (many_tiles or order or global or dead or coarse or 99k)"
stamp "done" | tee -a "$OUT/summary.txt"
