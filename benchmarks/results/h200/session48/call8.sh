#!/usr/bin/env bash
# Session 48, device call 8 (no Paddle): the final tree (per-query-head dK/dV stores for GQA groups of up
# to 4 by default, cuda::fa2_gqa_heads_stored): --check-fa2 as it stands and with
# PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS=0 (the slots), memcheck over --check-fa2, and one A/B pass of the
# head-dim-128 masks against the switch at 0. Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/final/flashmask_harness.xz && chmod +x .gpu_variants/final/flashmask_harness
H=.gpu_variants/final/flashmask_harness
timeout 150 $H --check-fa2 > "$OUT/logs/check_final.log" 2>&1
stamp "final check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_final.log" | tail -1)"
PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS=0 timeout 150 $H --check-fa2 > "$OUT/logs/check_final_slots.log" 2>&1
stamp "final check-fa2, GQA_HEADS=0: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_final_slots.log" | tail -1)"
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
timeout 100 $CS --tool memcheck --kernel-name kns=flashmask $H --check-fa2 > "$OUT/logs/sanitize_memcheck.log" 2>&1
stamp "final memcheck (--check-fa2): exit $? | $(grep -E 'ERROR SUMMARY' "$OUT/logs/sanitize_memcheck.log" | tail -1)"
mkdir -p .gpu_variants/final0 && echo final > .gpu_variants/final0/binary_of && echo "PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS=0" > .gpu_variants/final0/env
ARGS=.gpu_masks/args_all.txt OUT=$OUT/ab128 VARIANTS='final0 final' FAMILIES=fa2 PASSES=2 CHECK=0 BUDGET_S=120 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done"
cp "$OUT/ab128/masks_ab_summary.md" "$OUT/masks_ab_summary_hd128.md" 2>/dev/null
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs ab128 && rm -rf "$OUT/logs" "$OUT/ab128"
stamp "done"
