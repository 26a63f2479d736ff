#!/usr/bin/env bash
# Session 49, device call 4 (no Paddle): compute-sanitizer over --check-fa2 with GQA's per-head dK/dV stores
# at every head dim (variant gha, a superset of the kept rule: 64, 128 and 256, groups up to 4):
# memcheck on every flashmask kernel, racecheck on the staged backward. Carry [".gpu_variants"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/gha/flashmask_harness.xz && chmod +x .gpu_variants/gha/flashmask_harness
timeout 170 compute-sanitizer --tool memcheck --kernel-name kns=flashmask --error-exitcode 9 \
  .gpu_variants/gha/flashmask_harness --check-fa2 > "$OUT/memcheck.log" 2>&1
stamp "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1) | $(grep -E '^[0-9]+ failures' "$OUT/memcheck.log" | tail -1)"
timeout 170 compute-sanitizer --tool racecheck --kernel-name kns=flashmask_bwd_staged --error-exitcode 9 \
  .gpu_variants/gha/flashmask_harness --check-fa2 > "$OUT/racecheck.log" 2>&1
stamp "racecheck exit $?: $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1) | $(grep -E '^[0-9]+ failures' "$OUT/racecheck.log" | tail -1)"
xz -f "$OUT/memcheck.log" "$OUT/racecheck.log"
