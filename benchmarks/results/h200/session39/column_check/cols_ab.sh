#!/usr/bin/env bash
# Session 39, call 2 (harness only, carry [".gpu_variants"]): the staged backward's per-column check
# of partial query blocks (cols) against the tree before it (rows = 3c77a60). Outputs tarred.
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-300} - ($(date +%s) - T0) )); }
cd .gpu_variants
W=/tmp/cols_out; mkdir -p $W; S=$W/cols_ab.txt
for v in rows cols; do [ -f $v/flashmask_harness ] || xz -d $v/flashmask_harness.xz; chmod +x $v/flashmask_harness; done
for f in masks/*.xz; do [ -f ${f%.xz} ] || xz -dk $f; done
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee $S
timeout 120 ./cols/flashmask_harness --check-fa2 > $W/check_fa2_cols.log 2>&1
echo "check-fa2 cols: exit $? | $(grep -E '^[0-9]+ failures' $W/check_fa2_cols.log | tail -1)" | tee -a $S
M=masks
CASES=("$M/sq_part1_r1.i32 524288 2 0 sq_1M_rank1_part1_padded" "$M/part0_g0.i32 524288 4 0 gw_1M_rank0_part1"
  "$M/causal_document_8192.i32 8192 1 1 causal_document" "$M/share_question_8192.i32 8192 1 1 share_question"
  "$M/sliding_window_8192.i32 8192 1 1 sliding_window" "- 8192 0 1 causal" "- 16384 0 1 causal"
  "$M/sliding_window_32768.i32 32768 1 1 sliding_window" "$M/causal_document_32768.i32 32768 1 1 causal_document")
for pass in 1 2; do
  for v in rows cols; do
    for c in "${CASES[@]}"; do
      echo "== $v pass $pass: $(timeout 60 ./$v/flashmask_harness --time-mask-file $c fa2 2>&1 | grep -E '^\| fa2' | cut -d'|' -f2-12)" | tee -a $S
    done
  done
done
echo "left $(left) s" | tee -a $S
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in rows cols; do
  timeout 60 $NCU --cache-control none --clock-control none --kernel-name-base function \
    --kernel-name "regex:flashmask_(bwd|fwd)" --metrics gpu__time_duration.sum --csv \
    ./$v/flashmask_harness --time-mask-file masks/sq_part1_r1.i32 524288 2 0 sq_part fa2 > $W/ncu_sq_$v.csv 2>&1
  echo "ncu $v exit $?" | tee -a $S
done
CS=/usr/local/cuda/bin/compute-sanitizer
for tool in memcheck racecheck; do
  (( $(left) < 70 )) && { echo "SKIPPED $tool (budget)" | tee -a $S; continue; }
  timeout $(( $(left) - 15 )) $CS --tool $tool --kernel-name kns=flashmask_bwd_staged_kernel ./cols/flashmask_harness --check-fa2 > $W/sanitize_$tool.log 2>&1
  echo "$tool (staged) --check-fa2: exit $? | $(grep -E '^[0-9]+ failures' $W/sanitize_$tool.log | tail -1) | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/sanitize_$tool.log | tail -1)" | tee -a $S
done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee -a $S
echo "total $(( $(date +%s) - T0 )) s" | tee -a $S
tar cf $OUT/cols_out.tar -C $W .
