#!/usr/bin/env bash
# Session 43, device call 1 (moved here after the call; run from any directory) (no Paddle): the persistent FA2-class forward experiment
# (FLASHMASK_EXP_FWD_PERSISTENT, variant pcp) and the forward order's count from the coarse
# summaries (variants pc*, pcp*), against the tree before (base*); *16 = the same binary with
# the order passes' floors at 16K keys / rows. Carry [".gpu_variants", ".gpu_masks"].
# STAGE=time (default): the checks, then the timings; STAGE=sanitize: the checks, then compute-sanitizer.
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
for v in base pc pcp; do xz -dkf .gpu_variants/$v/flashmask_harness.xz && chmod +x .gpu_variants/$v/flashmask_harness; done
xz -dkf .gpu_masks/*.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/summary.txt"
H=.gpu_variants/pcp/flashmask_harness
if [ "${STAGE:-time}" = sanitize ]; then
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in racecheck memcheck synccheck; do
  PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS=1 FLASHMASK_HARNESS_DIM=128 timeout ${SAN_S:-100} $CS --tool $tool \
    --kernel-name kns=flashmask_fwd_kernel $H --check-fa2 > "$OUT/logs/sanitize_pcp_fwd_$tool.log" 2>&1
  stamp "pcp $tool fwd: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/sanitize_pcp_fwd_$tool.log" | tail -1) | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/sanitize_pcp_fwd_$tool.log" | tail -1)"
done
PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS=1 timeout 60 $CS --tool memcheck --kernel-name kns=fa2_ \
  .gpu_variants/pc/flashmask_harness --check-fa2 > "$OUT/logs/sanitize_pc_passes_memcheck.log" 2>&1
stamp "pc memcheck passes: exit $? | $(grep -E 'ERROR SUMMARY' "$OUT/logs/sanitize_pc_passes_memcheck.log" | tail -1)"
else
timeout 150 $H --check-fa2 > "$OUT/logs/check_pcp.log" 2>&1
stamp "pcp check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_pcp.log" | tail -1)"
PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS=1 PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS=1 timeout 150 $H --check-fa2 \
  > "$OUT/logs/check_pcp_min1.log" 2>&1
stamp "pcp check-fa2 floors 1: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_pcp_min1.log" | tail -1)"
timeout 150 .gpu_variants/pc/flashmask_harness --check-fa2 > "$OUT/logs/check_pc.log" 2>&1
stamp "pc check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_pc.log" | tail -1)"
PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS=1 timeout 150 .gpu_variants/pc/flashmask_harness --check-fa2 \
  > "$OUT/logs/check_pc_min1.log" 2>&1
stamp "pc check-fa2 floors 1: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_pc_min1.log" | tail -1)"
OUT=$OUT/ab VARIANTS='base pc pcp base16 pc16 pcp16' FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=300 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/masks_ab_stdout.txt" 2>&1
stamp "masks_ab done"
for pass in 1 2; do for v in base pcp; do
  timeout 90 .gpu_variants/$v/flashmask_harness --time-fa2 > "$OUT/logs/time_fa2_${v}_$pass.log" 2>&1
  stamp "time-fa2 $v pass $pass exit $?"
done; done
fi
cp "$OUT/ab/masks_ab_summary.md" "$OUT/" 2>/dev/null
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab 2>/dev/null) && rm -rf "$OUT/logs" "$OUT/ab"
stamp "done"
