#!/usr/bin/env bash
# Session 50, device call E (no Paddle): racecheck of the staged backward on the head dims that the
# whole-list runs (150-170 s limits) never reached: 256, then 80. The harness of variant ff with its
# fused finish off (= this tree's kernels; the staged kernel is the tree's in either setting).
# Carry [".gpu_variants"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
H=.gpu_variants/ff/flashmask_harness
xz -dkf $H.xz && chmod +x $H
export PADDLE_FLASHMASK_FA2_BWD_FUSED_FINISH=0
for d in 256 80; do
  FLASHMASK_HARNESS_DIM=$d timeout $([ $d = 256 ] && echo 190 || echo 120) compute-sanitizer --tool racecheck \
    --kernel-name kns=flashmask_bwd_staged_kernel --error-exitcode 9 $H --check-fa2 > "$OUT/racecheck_hd$d.log" 2>&1
  stamp "racecheck hd$d exit $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck_hd$d.log" | tail -1) | ok lines $(grep -c ' ok$' "$OUT/racecheck_hd$d.log") | hazard lines $(grep -ci hazard "$OUT/racecheck_hd$d.log") | $(grep -E '^[0-9]+ failures' "$OUT/racecheck_hd$d.log")"
done
xz -9 "$OUT"/racecheck_hd*.log
