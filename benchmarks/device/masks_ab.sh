#!/usr/bin/env bash
# One device call: harness variants (.gpu_variants, harness/build_variant.sh; env variants too,
# variants.sh) on the Paddle benchmark's own mask instances, both kernel families, passes interleaved
# (v1, v2, v1, v2: clock drift falls on all alike); first each variant's default check list (the
# Hopper and FA2-class kernels against the CPU reference). No Paddle: a cold machine will do.
#   the masks: python3 benchmarks/device/dump_bench_masks.py .gpu_masks S MASK ... >> .gpu_masks/args.txt
#              (the files, and one "--time-mask-file FILE S C CAUSAL NAME" line each)
#   device call (run tool): command "VARIANTS='main new' bash benchmarks/device/masks_ab.sh",
#                           carry [".gpu_variants", ".gpu_masks"]
#   VARIANTS (required)  FAMILIES="fa2 sm90"  PASSES=2  BUDGET_S=330 (stages that would start later are
#   skipped)  CHECK=1 (0: no default check)
# $OUT: masks_ab.log (the rows, "variant | pass | <harness row>"), check_<variant>.log,
# masks_ab_summary.md (masks_ab_summary.py: backward and prep+finish ms per mask, family and variant).
# Time on an H200: the check ~20 s a variant; a pass of 10 masks x 2 families ~7 s a variant.
set -uo pipefail
cd "$(dirname "$0")/../.." || { echo "FATAL: cd to the repo root"; exit 1; }
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
read -ra V <<< "${VARIANTS:?VARIANTS='base new' (directories of .gpu_variants)}"
FAMILIES=${FAMILIES:-"fa2 sm90"} PASSES=${PASSES:-2} BUDGET_S=${BUDGET_S:-330} CHECK=${CHECK:-1}
ARGS=${ARGS:-.gpu_masks/args.txt}  # or another list of the same lines
[ -f "$ARGS" ] || { echo "FATAL: $ARGS missing (dump_bench_masks.py; carry [\".gpu_masks\"])"; exit 1; }
source benchmarks/device/variants.sh  # harness_of, run_variant, check_variants (env variants too)
check_variants "${V[@]}"
T0=$(date +%s)
LOG=$OUT/masks_ab.log
: > "$LOG"
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$LOG" 2>&1

if [ "$CHECK" = 1 ]; then
  for v in "${V[@]}"; do
    run_variant "$v" 120 > "$OUT/check_$v.log" 2>&1
    stamp "$v default check exit $?: $(grep -E '^[0-9]+ failures$' "$OUT/check_$v.log" | tail -1)"
    grep -E " FAIL$|NOT-IDENTICAL|error|what\(\)" "$OUT/check_$v.log" | head -5
  done
fi

for pass in $(seq 1 "$PASSES"); do
  for v in "${V[@]}"; do
    if (( $(left) < 30 )); then stamp "SKIPPED: $v pass $pass (budget)"; continue; fi
    while read -r _ file s cols causal name; do
      for fam in $FAMILIES; do
        row=$(run_variant "$v" 60 --time-mask-file "$file" "$s" "$cols" "$causal" "$name" "$fam" 2>&1 \
              | grep -E "^\| $fam " | tail -1)
        echo "$v | $pass $row" >> "$LOG"
        [ -n "$row" ] || echo "$v | $pass | $fam | $name | $s | NO ROW" | tee -a "$LOG"
      done
    done < "$ARGS"
    stamp "$v pass $pass done"
  done
done
python3 benchmarks/device/masks_ab_summary.py "$LOG" > "$OUT/masks_ab_summary.md" && cat "$OUT/masks_ab_summary.md"
