#!/usr/bin/env bash
# Session 50, device call D (no Paddle): the FA2-class backward's finish in one launch (dQ tiles to dq,
# then GQA's per-query-head dK and dV sums in 16-byte packs; fa2_finish_heads_kernel) against the three
# launches it replaces (variant ff0: the same binary, PADDLE_FLASHMASK_FA2_BWD_FUSED_FINISH=0).
# --check-fa2 and memcheck with the fused finish first, then the Paddle benchmark's mask instances at
# head dims 128, 64 and 256 (32:8), 3 interleaved passes. Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
H=.gpu_variants/ff/flashmask_harness
xz -dkf $H.xz && chmod +x $H
timeout 60 $H --check-fa2 > "$OUT/logs/check_ff.log" 2>&1
stamp "ff check-fa2 exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_ff.log" | tail -1)"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $H --check-fa2 > "$OUT/logs/memcheck_ff.log" 2>&1
stamp "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/logs/memcheck_ff.log" | tail -1) | $(grep -E '^[0-9]+ failures' "$OUT/logs/memcheck_ff.log" | tail -1)"
grep -v -E "causal_(16384|32768)" .gpu_masks/args_all.txt > .gpu_masks/args_nolong.txt
ab() {  # ab NAME DIM ARGS BUDGET
  FLASHMASK_HARNESS_DIM=$2 FLASHMASK_HARNESS_KV_HEADS=8 ARGS=$3 OUT=$OUT/ab_$1 VARIANTS='ff0 ff' FAMILIES=fa2 \
    PASSES=3 CHECK=0 BUDGET_S=$4 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab_$1_stdout.txt" 2>&1
  cp "$OUT/ab_$1/masks_ab_summary.md" "$OUT/masks_ab_summary_$1.md" 2>/dev/null
  stamp "$1 (head dim $2) done"
}
ab hd128 128 .gpu_masks/args_all.txt 110
ab hd64 64 .gpu_masks/args_nolong.txt 60
ab hd256 256 .gpu_masks/args_nolong.txt 90
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab_* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab_*
stamp "done"
