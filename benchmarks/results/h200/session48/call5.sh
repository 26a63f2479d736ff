#!/usr/bin/env bash
# Session 48, device call 5 (no Paddle): the unbranched next-block copies (nb) against base on the
# 99 KB tiles (PADDLE_FLASHMASK_FA2_SMEM_CLASS=99k: the sm86 / sm89 kernels, forced on the H200;
# variants base99 / nb99), head dims 128 and 96 at 8K; then fa2_steps.sh (plain causal against
# torch's FlashAttention-2 in the same call, both variants). Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
for v in nb base; do xz -dkf .gpu_variants/$v/flashmask_harness.xz && chmod +x .gpu_variants/$v/flashmask_harness; done
grep -E "_8192" .gpu_masks/args_all.txt > .gpu_masks/args_8k.txt
for d in 128 96; do
  FLASHMASK_HARNESS_DIM=$d ARGS=.gpu_masks/args_8k.txt OUT=$OUT/ab99_$d VARIANTS='base99 nb99' FAMILIES=fa2 PASSES=3 \
    CHECK=0 BUDGET_S=80 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab99_${d}_stdout.txt" 2>&1
  stamp "99 KB tiles, head dim $d A/B done"
  cp "$OUT/ab99_$d/masks_ab_summary.md" "$OUT/masks_ab_summary_99k_hd$d.md"
done
PADDLE_FLASHMASK_FA2_SMEM_CLASS=99k timeout 150 .gpu_variants/nb/flashmask_harness --check-fa2 > "$OUT/logs/check_nb_99k.log" 2>&1
stamp "nb check-fa2 on the 99 KB tiles: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_nb_99k.log" | tail -1)"
rm -rf .gpu_variants/base99 .gpu_variants/nb99
OUT=$OUT/fa2_steps VARIANTS="base nb" BUDGET_S=330 bash benchmarks/device/fa2_steps.sh > "$OUT/logs/fa2_steps_stdout.txt" 2>&1
stamp "fa2_steps done"
cp "$OUT/fa2_steps/fa2_steps_summary.md" "$OUT/" 2>/dev/null
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab99_* fa2_steps 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab99_* "$OUT/fa2_steps"
stamp "done"
