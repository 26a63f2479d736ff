#!/usr/bin/env bash
# Session 45, device call 3 (no Paddle): the FA2-class staged backward's head pairs (one CTA walks
# a key block's live query blocks for two query heads of a GQA group; cuda/bwd_grid.h) against one
# head a CTA, one binary (variant bp, the working tree; bp0 = the same binary with
# PADDLE_FLASHMASK_FA2_BWD_HEAD_PAIRS=0, whose kernels' SASS is the tree before's).
# Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/bp/flashmask_harness.xz && chmod +x .gpu_variants/bp/flashmask_harness
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/summary.txt"
H=.gpu_variants/bp/flashmask_harness
timeout 120 $H --check-fa2 > "$OUT/logs/check_bp.log" 2>&1
stamp "bp check-fa2 (pairs on): exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_bp.log" | tail -1)"
grep -E "FAIL|what\(\)|error" "$OUT/logs/check_bp.log" | head -5 | tee -a "$OUT/summary.txt"
ARGS=.gpu_masks/args_8k_32k.txt OUT=$OUT/ab128 VARIANTS='bp0 bp' FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=200 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done"
head -5 .gpu_masks/args_8k_32k.txt > .gpu_masks/args_8k.txt
for d in 64 96 256; do
  FLASHMASK_HARNESS_DIM=$d ARGS=.gpu_masks/args_8k.txt OUT=$OUT/ab$d VARIANTS='bp0 bp' FAMILIES=fa2 PASSES=2 CHECK=0 \
    BUDGET_S=60 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab${d}_stdout.txt" 2>&1
  stamp "head dim $d A/B done"
done
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in memcheck racecheck; do
  FLASHMASK_HARNESS_DIM=128 timeout 100 $CS --tool $tool --kernel-name kns=flashmask_bwd_staged_kernel $H --check-fa2 > "$OUT/logs/sanitize_bwd_$tool.log" 2>&1
  stamp "bp $tool (staged backward, --check-fa2, head dim 128): exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/sanitize_bwd_$tool.log" | tail -1)"
done
for d in 128 64 96 256; do cp "$OUT/ab$d/masks_ab_summary.md" "$OUT/masks_ab_summary_hd$d.md" 2>/dev/null; done
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab[0-9]*
stamp "done"
