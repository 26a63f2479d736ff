#!/usr/bin/env bash
# Session 48, device call 3 (no Paddle): the FA2-class staged backward's dK/dV epilogue with one
# pointer a row (variant red, the working tree) against the tree before (base, af16a31), on the Paddle
# benchmark's mask instances at 8K and 32K and causal as a column mask at 8K / 16K / 32K (head dim 128),
# and the 8K masks at head dims 64, 96 and 256; first --check-fa2, then compute-sanitizer over
# --check-fa2 (memcheck, synccheck; racecheck at head dim 128). Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
for v in red base; do xz -dkf .gpu_variants/$v/flashmask_harness.xz && chmod +x .gpu_variants/$v/flashmask_harness; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/summary.txt"
H=.gpu_variants/red/flashmask_harness
timeout 150 $H --check-fa2 > "$OUT/logs/check_red.log" 2>&1
stamp "red check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_red.log" | tail -1)"
grep -E "FAIL|what\(\)|error" "$OUT/logs/check_red.log" | head -5 | tee -a "$OUT/summary.txt"
ARGS=.gpu_masks/args_all.txt OUT=$OUT/ab128 VARIANTS='base red' FAMILIES=fa2 PASSES=3 CHECK=0 BUDGET_S=200 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done"
grep -E "_8192" .gpu_masks/args_all.txt > .gpu_masks/args_8k.txt
for d in 64 96 256; do
  FLASHMASK_HARNESS_DIM=$d ARGS=.gpu_masks/args_8k.txt OUT=$OUT/ab$d VARIANTS='base red' FAMILIES=fa2 PASSES=3 CHECK=0 \
    BUDGET_S=60 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab${d}_stdout.txt" 2>&1
  stamp "head dim $d A/B done"
done
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in memcheck synccheck; do
  timeout 100 $CS --tool $tool --kernel-name kns=flashmask $H --check-fa2 > "$OUT/logs/sanitize_$tool.log" 2>&1
  stamp "red $tool (FA2-class kernels, --check-fa2): exit $? | $(grep -E 'ERROR SUMMARY' "$OUT/logs/sanitize_$tool.log" | tail -1)"
done
FLASHMASK_HARNESS_DIM=128 timeout 150 $CS --tool racecheck --kernel-name kns=flashmask_bwd_staged $H --check-fa2 > "$OUT/logs/sanitize_racecheck_hd128.log" 2>&1
stamp "red racecheck (staged backward, --check-fa2, head dim 128): exit $? | $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/logs/sanitize_racecheck_hd128.log" | tail -1)"
for d in 128 64 96 256; do cp "$OUT/ab$d/masks_ab_summary.md" "$OUT/masks_ab_summary_hd$d.md" 2>/dev/null; done
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab[0-9]*
stamp "done"
