#!/usr/bin/env bash
# Session 47, device call 2 (no Paddle): variant prt (the working tree: a kernel per partial-tile test at head dims 64, 96
# and 256, one kernel testing at run time at 32 and 128), ptest (call 1) and base (a204a95). Harness cases added:
# non-causal C = 2 and causal C = 4 at 64, 96, 128, 256. Carry [".gpu_variants", ".gpu_masks"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
for v in prt ptest base; do xz -dkf .gpu_variants/$v/flashmask_harness.xz && chmod +x .gpu_variants/$v/flashmask_harness; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/summary.txt"
H=.gpu_variants/prt/flashmask_harness
timeout 150 $H --check-fa2 > "$OUT/logs/check_prt.log" 2>&1
stamp "prt check-fa2: exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_prt.log" | tail -1)"
grep -E "FAIL|what\(\)|error" "$OUT/logs/check_prt.log" | head -5 | tee -a "$OUT/summary.txt"
ARGS=.gpu_masks/args_8k_32k.txt OUT=$OUT/ab128 VARIANTS='base prt' FAMILIES=fa2 PASSES=5 CHECK=0 BUDGET_S=200 \
  bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab128_stdout.txt" 2>&1
stamp "head dim 128 A/B done"
head -5 .gpu_masks/args_8k_32k.txt > .gpu_masks/args_8k.txt
for d in 64 96 256; do
  FLASHMASK_HARNESS_DIM=$d ARGS=.gpu_masks/args_8k.txt OUT=$OUT/ab$d VARIANTS='base ptest prt' FAMILIES=fa2 PASSES=3 CHECK=0 \
    BUDGET_S=60 bash benchmarks/device/masks_ab.sh > "$OUT/logs/ab${d}_stdout.txt" 2>&1
  stamp "head dim $d A/B done"
done
CS=/usr/local/cuda/bin/compute-sanitizer; [ -x "$CS" ] || CS=$(command -v compute-sanitizer)
for tool in memcheck synccheck; do
  timeout 100 $CS --tool $tool --kernel-name kns=flashmask $H --check-fa2 > "$OUT/logs/sanitize_$tool.log" 2>&1
  stamp "prt $tool (FA2-class kernels, --check-fa2): exit $? | $(grep -E 'ERROR SUMMARY' "$OUT/logs/sanitize_$tool.log" | tail -1)"
done
for d in 64 96; do
  FLASHMASK_HARNESS_DIM=$d timeout 120 $CS --tool racecheck --kernel-name kns=flashmask $H --check-fa2 > "$OUT/logs/sanitize_racecheck_hd$d.log" 2>&1
  stamp "prt racecheck (FA2-class kernels, --check-fa2, head dim $d): exit $? | $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/logs/sanitize_racecheck_hd$d.log" | tail -1)"
done
for d in 128 64 96 256; do cp "$OUT/ab$d/masks_ab_summary.md" "$OUT/masks_ab_summary_hd$d.md" 2>/dev/null; done
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" $(cd "$OUT" && ls -d logs ab* 2>/dev/null) && rm -rf "$OUT/logs" "$OUT"/ab[0-9]*
stamp "done"
