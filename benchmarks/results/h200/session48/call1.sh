#!/usr/bin/env bash
# Session 48, device call 1 (no Paddle): the FA2-class backward's GQA group order (variant grp1:
# PADDLE_FLASHMASK_FA2_BWD_GROUP_ORDER=1, the same binary as grp) against the grid's order (grp), on the
# Paddle benchmark's mask instances at 8K and 32K and causal as a column mask at 8K / 16K; first
# --check-fa2 both ways, and memcheck / synccheck over --check-fa2 (the final kernels of af16a31, whose
# review mend had not run on a GPU). Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/grp/flashmask_harness.xz && chmod +x .gpu_variants/grp/flashmask_harness
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/summary.txt"
H=.gpu_variants/grp/flashmask_harness
for setting in 0 1; do
  PADDLE_FLASHMASK_FA2_BWD_GROUP_ORDER=$setting timeout 150 $H --check-fa2 > "$OUT/logs/check_order$setting.log" 2>&1
  stamp "check-fa2, group order $setting: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_order$setting.log" | tail -1)"
  grep -E "FAIL|what\(\)|error" "$OUT/logs/check_order$setting.log" | head -5 | tee -a "$OUT/summary.txt"
done
ARGS=.gpu_masks/args_all.txt OUT=$OUT/ab128 VARIANTS='grp grp1' FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=250 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done"
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in memcheck synccheck; do
  PADDLE_FLASHMASK_FA2_BWD_GROUP_ORDER=1 timeout 100 $CS --tool $tool --kernel-name kns=flashmask $H --check-fa2 > "$OUT/logs/sanitize_$tool.log" 2>&1
  stamp "$tool (FA2-class kernels, --check-fa2, group order 1): exit $? | $(grep -E 'ERROR SUMMARY' "$OUT/logs/sanitize_$tool.log" | tail -1)"
done
cp "$OUT/ab128/masks_ab_summary.md" "$OUT/masks_ab_summary_hd128.md" 2>/dev/null
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs ab128 && rm -rf "$OUT/logs" "$OUT/ab128"
stamp "done"
