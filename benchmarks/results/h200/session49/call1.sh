#!/usr/bin/env bash
# Session 49, device call 1 (no Paddle): GQA's dK/dV stored per query head (FA2's epilogue, bwd_finish
# sums each kv head's group) at every head dim and groups up to 8 (variant gha, built from the tree with
# the rule widened), against the fp32 kv-head slots (gha0: the same binary, PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS=0),
# on the Paddle benchmark's mask instances: head dims 64 and 256 at 32:8 (group 4), 128 and 64 at 32:4
# (group 8). --check-fa2 with the widened rule first. Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
xz -dkf .gpu_variants/gha/flashmask_harness.xz && chmod +x .gpu_variants/gha/flashmask_harness
timeout 150 .gpu_variants/gha/flashmask_harness --check-fa2 > "$OUT/logs/check_gha.log" 2>&1
stamp "gha check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_gha.log" | tail -1)"
grep -v -E "causal_(16384|32768)" .gpu_masks/args_all.txt > .gpu_masks/args_nolong.txt
ab() {  # ab NAME DIM KV_HEADS ARGS BUDGET
  FLASHMASK_HARNESS_DIM=$2 FLASHMASK_HARNESS_KV_HEADS=$3 ARGS=$4 OUT=$OUT/ab_$1 VARIANTS='gha0 gha' FAMILIES=fa2 \
    PASSES=3 CHECK=0 BUDGET_S=$5 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab_$1_stdout.txt" 2>&1
  cp "$OUT/ab_$1/masks_ab_summary.md" "$OUT/masks_ab_summary_$1.md" 2>/dev/null
  stamp "$1 (head dim $2, 32:$3) done"
}
ab hd64 64 8 .gpu_masks/args_all.txt 70
ab hd256 256 8 .gpu_masks/args_nolong.txt 120
ab hd128_g8 128 4 .gpu_masks/args_all.txt 90
ab hd64_g8 64 4 .gpu_masks/args_nolong.txt 45
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab_* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab_*
stamp "done"
