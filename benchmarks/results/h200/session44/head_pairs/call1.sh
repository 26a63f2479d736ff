#!/usr/bin/env bash
# Session 44, device call 1 (no Paddle): the FA2-class forward's head pairs (two query heads' 64-row
# blocks a tile; cuda/fwd_grid.h) against one head's 128 rows, one binary (variant hp, the working
# tree; hp0 = the same binary with PADDLE_FLASHMASK_FA2_FWD_HEAD_PAIRS=0, whose kernels' SASS is the
# tree before's). Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/hp/flashmask_harness.xz && chmod +x .gpu_variants/hp/flashmask_harness
xz -dkf .gpu_masks/*.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/summary.txt"
H=.gpu_variants/hp/flashmask_harness
timeout 150 $H --check-fa2 > "$OUT/logs/check_hp.log" 2>&1
stamp "hp check-fa2 (pairs on): exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_hp.log" | tail -1)"
grep -E "FAIL|what\(\)|error" "$OUT/logs/check_hp.log" | head -5 | tee -a "$OUT/summary.txt"
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  timeout 80 $CS --tool $tool --kernel-name kns=flashmask_fwd_kernel $H --check-fa2 > "$OUT/logs/sanitize_fwd_$tool.log" 2>&1
  stamp "hp $tool (forward kernels, --check-fa2): exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/sanitize_fwd_$tool.log" | tail -1)"
done
ARGS=.gpu_masks/args_8k_32k.txt OUT=$OUT/ab128 VARIANTS='hp0 hp' FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=200 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done"
head -9 .gpu_masks/args_8k_32k.txt | grep -E " (causal|causal_document|share_question|sliding_window|short_documents)$" \
  > .gpu_masks/args_8k.txt
for d in 64 96 256; do
  FLASHMASK_HARNESS_DIM=$d ARGS=.gpu_masks/args_8k.txt OUT=$OUT/ab$d VARIANTS='hp0 hp' FAMILIES=fa2 PASSES=2 CHECK=0 \
    BUDGET_S=60 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab${d}_stdout.txt" 2>&1
  stamp "head dim $d A/B done"
done
for d in 128 64 96 256; do cp "$OUT/ab$d/masks_ab_summary.md" "$OUT/masks_ab_summary_hd$d.md" 2>/dev/null; done
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab[0-9]*
stamp "done"
