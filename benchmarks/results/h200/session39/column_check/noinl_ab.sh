#!/usr/bin/env bash
# Session 39, call 3 (harness only): rows (3c77a60) / cols (column check inlined) / noinl (noinline; hd128 bf16 only).
set -u
T0=$(date +%s); left() { echo $(( ${BUDGET_S:-170} - ($(date +%s) - T0) )); }
cd .gpu_variants
for v in rows cols noinl; do [ -f $v/flashmask_harness ] || xz -d $v/flashmask_harness.xz; chmod +x $v/flashmask_harness; done
for f in masks/sq_part1_r1.i32.xz masks/causal_document_8192.i32.xz masks/share_question_8192.i32.xz masks/sliding_window_32768.i32.xz; do [ -f ${f%.xz} ] || xz -dk $f; done
S=$OUT/noinl_ab.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee $S
M=masks
CASES=("$M/sq_part1_r1.i32 524288 2 0 sq_1M_rank1_part1_padded" "- 8192 0 1 causal" "- 16384 0 1 causal"
  "$M/causal_document_8192.i32 8192 1 1 causal_document" "$M/share_question_8192.i32 8192 1 1 share_question"
  "$M/sliding_window_32768.i32 32768 1 1 sliding_window")
for pass in 1 2; do
  for v in rows cols noinl; do
    for c in "${CASES[@]}"; do
      (( $(left) < 8 )) && { echo "SKIPPED (budget)"; break 3; }
      echo "== $v pass $pass: $(timeout 30 ./$v/flashmask_harness --time-mask-file $c fa2 2>&1 | grep -E '^\| fa2' | cut -d'|' -f3,4,8-11)" | tee -a $S
    done
  done
done
echo "total $(( $(date +%s) - T0 )) s" | tee -a $S
