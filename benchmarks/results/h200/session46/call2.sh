#!/usr/bin/env bash
# Session 46, device call 2 (no Paddle): call 1 read both of gsum's settings 6-10% slower in the
# backward's main kernel than every session before on the same masks. Here the tree before (base,
# 6b62c2d), gsum's two settings (gsum, gqa0) and gin (gsum with the group sum inlined rather than
# a call) in one call. Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
V="base gqa0 gsum"
for v in base gsum gin; do
  [ -f .gpu_variants/$v/flashmask_harness.xz ] && xz -dkf .gpu_variants/$v/flashmask_harness.xz && chmod +x .gpu_variants/$v/flashmask_harness
done
[ -x .gpu_variants/gin/flashmask_harness ] && V="$V gin"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv,noheader >> "$OUT/summary.txt"
if [ -x .gpu_variants/gin/flashmask_harness ]; then
  timeout 100 .gpu_variants/gin/flashmask_harness --check-fa2 > "$OUT/logs/check_gin.log" 2>&1
  stamp "gin check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_gin.log" | tail -1)"
fi
ARGS=.gpu_masks/args_8k_32k.txt OUT=$OUT/ab128 VARIANTS="$V" FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=200 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done ($V)"
head -5 .gpu_masks/args_8k_32k.txt > .gpu_masks/args_8k.txt
for d in 64 256; do
  FLASHMASK_HARNESS_DIM=$d ARGS=.gpu_masks/args_8k.txt OUT=$OUT/ab$d VARIANTS="$V" FAMILIES=fa2 PASSES=2 CHECK=0 \
    BUDGET_S=80 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab${d}_stdout.txt" 2>&1
  stamp "head dim $d A/B done"
done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/summary.txt"
for d in 128 64 256; do cp "$OUT/ab$d/masks_ab_summary.md" "$OUT/masks_ab_summary_hd$d.md" 2>/dev/null; done
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab[0-9]*
stamp "done"
