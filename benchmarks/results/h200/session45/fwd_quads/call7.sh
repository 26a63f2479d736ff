#!/usr/bin/env bash
# Session 45, Paddle call (right after `bash .gpu1/device-install.sh`): head quads at head dims 96
# and 256 only (flashmask_launch.cuh, fwd_takes_quads). The Paddle GPU tests of the quads and pairs
# on this tree's objects, then the harness (variant q2, this tree; q20 = the same binary with
# PADDLE_FLASHMASK_FA2_FWD_HEAD_QUADS=0, pairs): --check-fa2, and quads against pairs at head dims
# 96 and 256 on the benchmark's masks at 8K and 32K. Carry [".gpu2", ".gpu_objs", ".gpu_variants",
# ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
source benchmarks/device/runtime_env.sh
stamp "setup done" | tee -a "$OUT/summary.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "head_quads or head_pairs" \
  > "$OUT/logs/gpu_tests_quads_pairs.log" 2>&1
echo "quads/pairs tests exit $?: $(tail -1 "$OUT/logs/gpu_tests_quads_pairs.log" | cut -c1-200)" | tee -a "$OUT/summary.txt"
grep -E "^FAILED" "$OUT/logs/gpu_tests_quads_pairs.log" | head -10 | tee -a "$OUT/summary.txt"
xz -dkf .gpu_variants/q2/flashmask_harness.xz && chmod +x .gpu_variants/q2/flashmask_harness
H=.gpu_variants/q2/flashmask_harness
timeout 100 $H --check-fa2 > "$OUT/logs/check_q2.log" 2>&1
stamp "q2 check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_q2.log" | tail -1)" | tee -a "$OUT/summary.txt"
grep -E "^--time-mask-file" .gpu_masks/args_8k_32k.txt | grep -v " causal$" > .gpu_masks/args_masks.txt
for d in 96 256; do
  FLASHMASK_HARNESS_DIM=$d ARGS=.gpu_masks/args_masks.txt OUT=$OUT/ab$d VARIANTS='q20 q2' FAMILIES=fa2 PASSES=2 \
    CHECK=0 BUDGET_S=80 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab${d}_stdout.txt" 2>&1
  stamp "head dim $d A/B done" | tee -a "$OUT/summary.txt"
  cp "$OUT/ab$d/masks_ab_summary.md" "$OUT/masks_ab_summary_hd$d.md" 2>/dev/null
done
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab[0-9]*
stamp "done" | tee -a "$OUT/summary.txt"
