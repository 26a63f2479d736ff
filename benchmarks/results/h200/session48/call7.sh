#!/usr/bin/env bash
# Session 48, device call 7 (no Paddle): GQA's dK/dV stored per query head in bf16 outside deterministic
# mode (variant gh1: PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS=1, FlashAttention-2's epilogue, summed per kv head
# by bwd_finish) against the kv-head fp32 slots (gh: the same binary, switch off = the tree's kernels), on
# the Paddle benchmark's mask instances at 8K and 32K and causal as a column mask (head dim 128), and the
# 8K masks at 96; --check-fa2 with the switch on first. Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/gh/flashmask_harness.xz && chmod +x .gpu_variants/gh/flashmask_harness
PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS=1 timeout 150 .gpu_variants/gh/flashmask_harness --check-fa2 > "$OUT/logs/check_gh1.log" 2>&1
stamp "gh1 check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_gh1.log" | tail -1)"
ARGS=.gpu_masks/args_all.txt OUT=$OUT/ab128 VARIANTS='gh gh1' FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=200 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done"
grep -E "_8192" .gpu_masks/args_all.txt > .gpu_masks/args_8k.txt
FLASHMASK_HARNESS_DIM=96 ARGS=.gpu_masks/args_8k.txt OUT=$OUT/ab96 VARIANTS='gh gh1' FAMILIES=fa2 PASSES=3 CHECK=0 \
  BUDGET_S=60 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab96_stdout.txt" 2>&1
stamp "head dim 96 A/B done"
for d in 128 96; do cp "$OUT/ab$d/masks_ab_summary.md" "$OUT/masks_ab_summary_hd$d.md" 2>/dev/null; done
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab[0-9]*
stamp "done"
