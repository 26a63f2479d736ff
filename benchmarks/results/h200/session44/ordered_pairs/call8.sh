#!/usr/bin/env bash
# Session 44, device call 8 (no Paddle): head pairs under the longest-first CTA order (variant hp3:
# the pairs' own count / flag / scatter passes over 64-row blocks and an ordered pair kernel; hp0 =
# the same binary with PADDLE_FLASHMASK_FA2_FWD_HEAD_PAIRS=0, the tree before's kernels). Checks with
# the order's floors at 1 (every column-masked case ordered), then 128K masks (past the 64K floor).
# Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/hp3/flashmask_harness.xz && chmod +x .gpu_variants/hp3/flashmask_harness
xz -dkf .gpu_masks/*.xz
H=.gpu_variants/hp3/flashmask_harness
export PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS=1 PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS=1
timeout 100 $H --check-fa2 > "$OUT/logs/check_floors1.log" 2>&1
stamp "hp3 check-fa2, floors 1: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_floors1.log" | tail -1)"
grep -E "FAIL|what\(\)" "$OUT/logs/check_floors1.log" | head -5 | tee -a "$OUT/summary.txt"
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in memcheck racecheck; do
  FLASHMASK_HARNESS_DIM=128 timeout 60 $CS --tool $tool --kernel-name kns=fa2_ $H --check-fa2 > "$OUT/logs/$tool.log" 2>&1
  stamp "$tool order passes, head dim 128, floors 1: exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/$tool.log" | tail -1)"
done
FLASHMASK_HARNESS_DIM=128 timeout 60 $CS --tool memcheck --kernel-name kns=flashmask_fwd_kernel $H --check-fa2 \
  > "$OUT/logs/memcheck_fwd.log" 2>&1
stamp "memcheck forward kernels, head dim 128, floors 1: exit $? | $(grep -E 'ERROR SUMMARY' "$OUT/logs/memcheck_fwd.log" | tail -1)"
unset PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS
ARGS=.gpu_masks/args_128k.txt OUT=$OUT/ab VARIANTS='hp0 hp3' FAMILIES=fa2 PASSES=2 CHECK=0 BUDGET_S=200 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab_stdout.txt" 2>&1
stamp "128K A/B done"
cp "$OUT/ab/masks_ab_summary.md" "$OUT/masks_ab_summary_128k.md" 2>/dev/null; cat "$OUT/masks_ab_summary_128k.md"
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs ab && rm -rf "$OUT/logs" "$OUT/ab"
stamp "done"
