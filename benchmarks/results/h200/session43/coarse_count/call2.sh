#!/usr/bin/env bash
# Session 43, device call 2 (no Paddle): the forward order's count from the coarse summaries alone
# (variant c: session 42's fwd_coarse_count.patch on efcbd77, the forward kernel untouched) against
# the tree before (base); c16 / base16 = the same binaries with both order floors at 16K keys / rows,
# c16f = c with the forward's floor only at 16K. Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
for v in base c; do xz -dkf .gpu_variants/$v/flashmask_harness.xz && chmod +x .gpu_variants/$v/flashmask_harness; done
xz -dkf .gpu_masks/*.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/summary.txt"
H=.gpu_variants/c/flashmask_harness
timeout 150 $H --check-fa2 > "$OUT/logs/check_c.log" 2>&1
stamp "c check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_c.log" | tail -1)"
PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS=1 PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS=1 timeout 150 $H --check-fa2 \
  > "$OUT/logs/check_c_min1.log" 2>&1
stamp "c check-fa2 floors 1: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_c_min1.log" | tail -1)"
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in memcheck racecheck; do
  PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS=1 FLASHMASK_HARNESS_DIM=128 timeout 80 $CS --tool $tool --kernel-name kns=fa2_ \
    $H --check-fa2 > "$OUT/logs/sanitize_c_passes_$tool.log" 2>&1
  stamp "c $tool passes: exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/sanitize_c_passes_$tool.log" | tail -1)"
done
OUT=$OUT/ab VARIANTS='base c base16 c16 c16f' FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=300 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/masks_ab_stdout.txt" 2>&1
stamp "masks_ab done"
cp "$OUT/ab/masks_ab_summary.md" "$OUT/" 2>/dev/null
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab 2>/dev/null) && rm -rf "$OUT/logs" "$OUT/ab"
stamp "done"
