#!/usr/bin/env bash
# Session 48, device call 2 (no Paddle): where FlashAttention-2 gains its 3-4% on the sliding window's
# backward. (1) FA2's backward broken into its kernels (torch profiler, fa2_bwd_kernels.py) at 8K and 32K;
# (2) Nsight Compute on each side's main backward kernel for the same two instances (ncu_fa2_peer.sh:
# stalls, opcodes, details), ours = the tree's kernels (variant grp, order switch off).
# Carry [".gpu_variants"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/grp/flashmask_harness.xz && chmod +x .gpu_variants/grp/flashmask_harness
env -u PYTHONPATH -u LD_LIBRARY_PATH timeout 120 python3 benchmarks/device/fa2_bwd_kernels.py \
  sliding_window:8192 sliding_window:32768 causal:8192 > "$OUT/fa2_bwd_kernels.md" 2>&1
stamp "fa2_bwd_kernels exit $?"
OUT=$OUT/ncu CASES="sliding_window:8192 sliding_window:32768" timeout 420 bash benchmarks/device/ncu_fa2_peer.sh grp \
  > "$OUT/ncu_stdout.txt" 2>&1
stamp "ncu exit $?"
# Ours on the same instances through the harness (its row has prep+finish apart from the whole backward).
while read -r name s file; do
  timeout 60 .gpu_variants/grp/flashmask_harness --time-mask-file "$file" "$s" 1 1 "$name" fa2 2>&1 | grep -E "^\| fa2" >> "$OUT/ours_rows.txt"
done < /tmp/fa2_ncu_masks/index.txt
stamp "ours timed"
xz -9 "$OUT/ncu/details.txt" 2>/dev/null
stamp done
