#!/usr/bin/env bash
# Session 45, device call 8 (no Paddle): compute-sanitizer on the landed quads (head dim 256 of
# --check-fa2, whose H4:1 cases take them; its list has no GQA case at 96). Carry [".gpu_variants"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/q2/flashmask_harness.xz && chmod +x .gpu_variants/q2/flashmask_harness
H=.gpu_variants/q2/flashmask_harness
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in memcheck racecheck; do
  FLASHMASK_HARNESS_DIM=256 timeout 90 $CS --tool $tool --kernel-name kns=flashmask_fwd_kernel $H --check-fa2 > "$OUT/logs/$tool.log" 2>&1
  stamp "q2 $tool (forward kernels, --check-fa2, head dim 256): exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/$tool.log" | tail -1) | $(grep -E '^[0-9]+ failures' "$OUT/logs/$tool.log" | tail -1)"
done
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$OUT/logs"
