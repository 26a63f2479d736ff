#!/usr/bin/env bash
# Session 44, device call 2: the Paddle runtime's first half (.gpu1), then compute-sanitizer racecheck
# on the forward kernels of the final tree's harness (hp2) head dim by head dim (call 1's whole-list
# racecheck ran past its 80 s). Carry [".gpu1", ".gpu_variants"]; call 3 follows at once.
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
bash .gpu1/device-install.sh 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
xz -dkf .gpu_variants/hp2/flashmask_harness.xz && chmod +x .gpu_variants/hp2/flashmask_harness
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for d in 128 64 256 96; do
  FLASHMASK_HARNESS_DIM=$d timeout 100 $CS --tool racecheck --kernel-name kns=flashmask_fwd_kernel \
    .gpu_variants/hp2/flashmask_harness --check-fa2 > "$OUT/racecheck_fwd_hd$d.log" 2>&1
  stamp "racecheck forward kernels, head dim $d: exit $? | $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck_fwd_hd$d.log" | tail -1) | $(grep -E '^[0-9]+ failures' "$OUT/racecheck_fwd_hd$d.log" | tail -1)"
done
