#!/usr/bin/env bash
# Session 51, device call 1 (no Paddle; not run: no device was lent): the FA2-class staged
# backward's 64-key halves (a step whose tile has one wholly masked half runs S/dP and dV/dK on the
# live half's warps only, dQ over its 64 keys) against the tree before (variant base, 483fb03), one
# binary each. --check-fa2 and memcheck of the staged backward with halves first, then the Paddle
# benchmark's mask instances at head dims 128 (3 passes), 64 and 96 (2 passes), 32:8, passes
# interleaved; last, racecheck of the staged backward at head dims 128 and 64 (70 s each: part of
# --check-fa2's list). About 9 min. Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
source "$(dirname "$0")/../../../../device/call_lib.sh"
call_begin
unpack_harness base halves
H=.gpu_variants/halves/flashmask_harness
check_run check_halves 70 $H --check-fa2
sanitize memcheck flashmask_bwd_staged_kernel 100 memcheck_halves $H --check-fa2
grep -v -E "causal_(16384|32768)" .gpu_masks/args_all.txt > .gpu_masks/args_nolong.txt
ab() {  # ab NAME DIM ARGS PASSES BUDGET [VARIANTS]
  FLASHMASK_HARNESS_DIM=$2 FLASHMASK_HARNESS_KV_HEADS=8 ARGS=$3 OUT=$OUT/ab_$1 VARIANTS=${6:-'base halves'} FAMILIES=fa2 \
    PASSES=$4 CHECK=0 BUDGET_S=$5 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab_$1_stdout.txt" 2>&1
  cp "$OUT/ab_$1/masks_ab_summary.md" "$OUT/masks_ab_summary_$1.md" 2>/dev/null
  stamp "$1 (head dim $2) done"
}
ab hd128 128 .gpu_masks/args_all.txt 3 130
ab hd64 64 .gpu_masks/args_nolong.txt 2 60
ab hd96 96 .gpu_masks/args_nolong.txt 2 60
for d in 128 64; do  # the halves change which warps touch P/dS and when: racecheck the staged backward
  FLASHMASK_HARNESS_DIM=$d sanitize racecheck flashmask_bwd_staged_kernel 70 racecheck_hd$d $H --check-fa2
done
pack_logs $(cd "$OUT" && ls -d ab_* 2>/dev/null)
stamp "done"
