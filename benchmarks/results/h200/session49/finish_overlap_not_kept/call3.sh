#!/usr/bin/env bash
# Session 49, device call 3 (no Paddle): the FA2-class backward's finish overlapped with its main kernel's
# last wave (variant fo: the staged kernel's CTAs count themselves done per (batch, kv head), the finish
# launched as its programmatic dependent converts a unit's dQ tiles and sums its dK/dV rows once the unit
# is complete) against the finish after the kernel (fo0: the same binary, PADDLE_FLASHMASK_FA2_BWD_FINISH_OVERLAP=0),
# with the light-last rows (default) and without (L0: PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST=0, under which a
# head's CTAs end with its row). --check-fa2 and memcheck over it with the overlap first.
# Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/fo/flashmask_harness.xz && chmod +x .gpu_variants/fo/flashmask_harness
timeout 100 .gpu_variants/fo/flashmask_harness --check-fa2 > "$OUT/logs/check_fo.log" 2>&1
stamp "fo check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_fo.log" | tail -1)"
grep -E " FAIL$|error|what\(\)" "$OUT/logs/check_fo.log" | head -5
PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST=0 timeout 100 .gpu_variants/fo/flashmask_harness --check-fa2 > "$OUT/logs/check_foL0.log" 2>&1
stamp "fo light-last 0 check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_foL0.log" | tail -1)"
timeout 150 compute-sanitizer --tool memcheck --kernel-name regex:fa2_bwd_finish --error-exitcode 9 \
  .gpu_variants/fo/flashmask_harness --check-fa2 > "$OUT/logs/memcheck_fo.log" 2>&1
stamp "memcheck (finish kernel) exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/logs/memcheck_fo.log" | tail -1)"
grep -E "_8192" .gpu_masks/args_all.txt > .gpu_masks/args_8k.txt
ab() {  # ab NAME DIM ARGS VARIANTS BUDGET
  FLASHMASK_HARNESS_DIM=$2 ARGS=$3 OUT=$OUT/ab_$1 VARIANTS="$4" FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=$5 \
    bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab_$1_stdout.txt" 2>&1
  cp "$OUT/ab_$1/masks_ab_summary.md" "$OUT/masks_ab_summary_$1.md" 2>/dev/null
  stamp "$1 done"
}
ab hd128 128 .gpu_masks/args_all.txt 'fo0 fo' 110
ab hd128_L0 128 .gpu_masks/args_8k.txt 'fo0 fo foL0 fo0L0' 60
ab hd64 64 .gpu_masks/args_8k.txt 'fo0 fo' 30
ab hd256 256 .gpu_masks/args_8k.txt 'fo0 fo' 50
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab_* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab_*
stamp "done"
