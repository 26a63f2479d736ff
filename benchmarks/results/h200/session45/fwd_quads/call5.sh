#!/usr/bin/env bash
# Session 45, device call 5 (no Paddle): the FA2-class forward's head quads (four query heads'
# 32-row blocks a tile where the GQA groups split into fours; cuda/fwd_grid.h) against head pairs
# (64-row blocks of two heads), one binary (variant qd, the working tree; qd0 = the same binary
# with PADDLE_FLASHMASK_FA2_FWD_HEAD_QUADS=0, the tree before's kernels).
# Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/qd/flashmask_harness.xz && chmod +x .gpu_variants/qd/flashmask_harness
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/summary.txt"
H=.gpu_variants/qd/flashmask_harness
timeout 120 $H --check-fa2 > "$OUT/logs/check_qd.log" 2>&1
stamp "qd check-fa2 (quads on): exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_qd.log" | tail -1)"
grep -E "FAIL|what\(\)|error" "$OUT/logs/check_qd.log" | head -5 | tee -a "$OUT/summary.txt"
ARGS=.gpu_masks/args_8k_32k.txt OUT=$OUT/ab128 VARIANTS='qd0 qd' FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=200 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done"
head -5 .gpu_masks/args_8k_32k.txt > .gpu_masks/args_8k.txt
for d in 64 96 256; do
  FLASHMASK_HARNESS_DIM=$d ARGS=.gpu_masks/args_8k.txt OUT=$OUT/ab$d VARIANTS='qd0 qd' FAMILIES=fa2 PASSES=2 CHECK=0 \
    BUDGET_S=60 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab${d}_stdout.txt" 2>&1
  stamp "head dim $d A/B done"
done
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in memcheck racecheck; do
  FLASHMASK_HARNESS_DIM=128 timeout 100 $CS --tool $tool --kernel-name kns=flashmask_fwd_kernel $H --check-fa2 > "$OUT/logs/sanitize_fwd_$tool.log" 2>&1
  stamp "qd $tool (forward kernels, --check-fa2, head dim 128): exit $? | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/sanitize_fwd_$tool.log" | tail -1)"
done
for d in 128 64 96 256; do cp "$OUT/ab$d/masks_ab_summary.md" "$OUT/masks_ab_summary_hd$d.md" 2>/dev/null; done
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab[0-9]*
stamp "done"
