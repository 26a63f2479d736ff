#!/usr/bin/env bash
# Session 48, device call 6 (no Paddle): the FA2-class forward's next K copy without a branch (variant
# nbf: the last block reloads its own K; head dims 96 and 128) against the tree (nb = 3c09725), on the
# Paddle benchmark's mask instances at 8K and 32K and causal as a column mask (head dim 128) and the
# 8K masks at 96 (64 and 256 unchanged: controls); --check-fa2 first; then fa2_steps.sh (plain
# causal against torch's FlashAttention-2). Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
for v in nbf nb; do xz -dkf .gpu_variants/$v/flashmask_harness.xz && chmod +x .gpu_variants/$v/flashmask_harness; done
timeout 150 .gpu_variants/nbf/flashmask_harness --check-fa2 > "$OUT/logs/check_nbf.log" 2>&1
stamp "nbf check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_nbf.log" | tail -1)"
ARGS=.gpu_masks/args_all.txt OUT=$OUT/ab128 VARIANTS='nb nbf' FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=200 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done"
grep -E "_8192" .gpu_masks/args_all.txt > .gpu_masks/args_8k.txt
for d in 96 64; do
  FLASHMASK_HARNESS_DIM=$d ARGS=.gpu_masks/args_8k.txt OUT=$OUT/ab$d VARIANTS='nb nbf' FAMILIES=fa2 PASSES=3 CHECK=0 \
    BUDGET_S=60 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab${d}_stdout.txt" 2>&1
  stamp "head dim $d A/B done"
done
for d in 128 96 64; do cp "$OUT/ab$d/masks_ab_summary.md" "$OUT/masks_ab_summary_hd$d.md" 2>/dev/null; done
OUT=$OUT/fa2_steps VARIANTS="nb nbf" BUDGET_S=200 bash benchmarks/device/fa2_steps.sh > "$OUT/logs/fa2_steps_stdout.txt" 2>&1
stamp "fa2_steps done"
cp "$OUT/fa2_steps/fa2_steps_summary.md" "$OUT/" 2>/dev/null
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab* fa2_steps 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab[0-9]* "$OUT/fa2_steps"
stamp "done"
