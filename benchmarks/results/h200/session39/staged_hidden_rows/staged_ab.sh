#!/usr/bin/env bash
# Session 39, call 1 (harness only, carry [".gpu_variants"]): the FA2-class staged backward with the
# saved patches (session38/fa2_staged_hidden_rows): base (skip/, the tree before d592c22: same
# backward source), rows (patch 1), rowsdq (patches 1+2). Checks, A/B timing on the 1M CP part and
# the issue 15 masks, per-kernel time on the part under Nsight Compute, source-level stalls.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - T0) )); }
cd .gpu_variants
VARS="skip rows rowsdq"
for v in $VARS; do [ -f $v/flashmask_harness ] || xz -d $v/flashmask_harness.xz; chmod +x $v/flashmask_harness; done
for f in masks/*.xz; do [ -f ${f%.xz} ] || xz -dk $f; done
S=$OUT/staged_ab.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee $S
for v in rows rowsdq; do
  timeout 120 ./$v/flashmask_harness --check-fa2 > $OUT/check_fa2_$v.log 2>&1
  echo "check-fa2 $v: exit $? | $(grep -E '^[0-9]+ failures' $OUT/check_fa2_$v.log | tail -1)" | tee -a $S
done
M=masks
CASES=("$M/part0_g0.i32 524288 4 0 cp_part_1M_rank0"
  "$M/causal_document_8192.i32 8192 1 1 causal_document" "$M/share_question_8192.i32 8192 1 1 share_question"
  "$M/sliding_window_8192.i32 8192 1 1 sliding_window" "- 8192 0 1 causal" "- 16384 0 1 causal"
  "$M/sliding_window_32768.i32 32768 1 1 sliding_window" "$M/causal_document_32768.i32 32768 1 1 causal_document")
for pass in 1 2; do
  for v in $VARS; do
    for c in "${CASES[@]}"; do
      echo "== $v pass $pass: $(timeout 120 ./$v/flashmask_harness --time-mask-file $c fa2 2>&1 | grep -E '^\| fa2' | cut -d'|' -f2-12)" | tee -a $S
    done
  done
done
echo "left $(left) s" | tee -a $S
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in $VARS; do
  timeout 90 $NCU --cache-control none --clock-control none --kernel-name-base function \
    --kernel-name "regex:flashmask_bwd" --metrics gpu__time_duration.sum --csv \
    ./$v/flashmask_harness --time-mask-file masks/part0_g0.i32 524288 4 0 cp_part fa2 > $OUT/ncu_bwd_$v.csv 2>&1
  echo "ncu $v exit $? : $(grep -c gpu__time_duration $OUT/ncu_bwd_$v.csv) rows" | tee -a $S
done
for v in skip rowsdq; do
  (( $(left) < 90 )) && { echo "SKIPPED source profile $v (budget)" | tee -a $S; continue; }
  rep=/tmp/staged_part_$v
  timeout 150 "$NCU" --kernel-name-base function --kernel-name "regex:flashmask_bwd_staged_kernel" \
    --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section SourceCounters --section LaunchStats --section MemoryWorkloadAnalysis -f -o "$rep" \
    ./$v/flashmask_harness --time-mask-file masks/part0_g0.i32 524288 4 0 cp_part fa2 > "$OUT/ncu_src_$v.log" 2>&1
  echo "ncu source $v exit $?" | tee -a $S
  "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> /dev/null
  "$NCU" -i "$rep.ncu-rep" --page details > "$OUT/staged_part_details_$v.txt" 2>&1
  (cd .. && python3 benchmarks/device/ncu_sass_summary.py "$rep.csv" 45 > "$OUT/staged_part_stalls_$v.txt" 2>&1)
  xz -k "$rep.csv" && cp "$rep.csv.xz" "$OUT/staged_part_$v.csv.xz"
done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee -a $S
echo "total $(( $(date +%s) - T0 )) s" | tee -a $S
