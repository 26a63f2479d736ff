#!/usr/bin/env bash
# One device call, no Paddle: the FA2-class CTA orders (custom_ops/flashmask/cuda/fa2_cta_order.cuh)
# checked in the harness with their floors at 1, so that every column-masked case of --check-fa2
# runs the count and order passes and the ordered launches: the check list in both backward kernels
# (staged, split), then compute-sanitizer over it (head dim 128 alone: FLASHMASK_HARNESS_DIM) on
# the passes' kernels (memcheck, synccheck, racecheck) and on the ordered main kernels (memcheck).
#   device call (run tool): command "VARIANT=new bash benchmarks/device/fa2_cta_order_checks.sh",
#                           carry [".gpu_variants"]
# $OUT: check_min1.log, check_min1_split.log, sanitize_*.log, checks_summary.txt
set -uo pipefail
cd "$(dirname "$0")/../.." || { echo "FATAL: cd to the repo root"; exit 1; }
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
VARIANT=${VARIANT:-new}
source benchmarks/device/variants.sh
check_variants "$VARIANT"
H=$(harness_of "$VARIANT")
SUMMARY=$OUT/checks_summary.txt
: > "$SUMMARY"
export PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS=1 PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$SUMMARY" 2>&1

timeout 150 "$H" --check-fa2 > "$OUT/check_min1.log" 2>&1
echo "check-fa2, floors 1: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/check_min1.log" | tail -1)" | tee -a "$SUMMARY"
PADDLE_FLASHMASK_FA2_BWD=split timeout 120 "$H" --check-fa2 > "$OUT/check_min1_split.log" 2>&1
echo "check-fa2 split, floors 1: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/check_min1_split.log" | tail -1)" \
  | tee -a "$SUMMARY"

CS=/usr/local/cuda/bin/compute-sanitizer
[ -x "$CS" ] || CS=$(command -v compute-sanitizer)
sanitize() {  # TOOL KERNEL_SUBSTRING LABEL
  local log=$OUT/sanitize_$3_$1.log
  FLASHMASK_HARNESS_DIM=128 timeout "${SANITIZE_TIMEOUT_S:-150}" $CS --tool "$1" --kernel-name "kns=$2" \
    "$H" --check-fa2 > "$log" 2>&1
  echo "$1 ($2): exit $? | $(grep -E '^[0-9]+ failures' "$log" | tail -1) | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)" \
    | tee -a "$SUMMARY"
  xz -f "$log"
}
for tool in memcheck synccheck racecheck; do sanitize "$tool" fa2_ passes; done
sanitize memcheck tile_count fwd_count
sanitize memcheck flashmask_fwd_kernel fwd
sanitize memcheck flashmask_bwd_staged_kernel bwd
