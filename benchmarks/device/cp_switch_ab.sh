#!/usr/bin/env bash
# Device call 2 (after `bash .gpu1/device-install.sh`): one allgather switch on (1) and off (0) in
# one call, CP_AB_SWITCH (PADDLE_FLASHMASK_CP_SPACING: received parts spaced out,
# distributed/spacing.py; PADDLE_FLASHMASK_CP_FUSE: group 0's keys in the own keys' call; several
# names, space-separated, set together: "PADDLE_FLASHMASK_SM90_FWD_HEAVY_FIRST
# PADDLE_FLASHMASK_SM90_BWD_CHAINS_FIRST", the Hopper kernels' long tiles first),
# CP_AB_LENGTHS (1048576) tokens, CP_AB_WORLD ranks (2) simulated on one GPU, per-rank pieces
# timed (--parts), kernels CP_AB_KERNELS (sm90 fa2); first (CP_AB_CHECK=1, the default) the GPU
# check of every method. Carry .gpu2 and .gpu_objs. CP_AB_BUDGET_S bounds the timing part.
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
SWITCH=${CP_AB_SWITCH:-PADDLE_FLASHMASK_CP_SPACING}
source benchmarks/device/runtime_env.sh
if [ "${CP_AB_CHECK:-1}" = 1 ]; then
  timeout 200 python3 benchmarks/bench_cp_gpu.py --check --dtypes bfloat16 --world-sizes 2 4 > "$OUT/cp_check.log" 2>&1
  echo "check exit $?"; grep -E "FAIL|^check:|Error|error" "$OUT/cp_check.log" | tail -8
  stamp "check done"
fi
T1=$(date +%s)
for S in ${CP_AB_LENGTHS:-1048576}; do
  for kernel in ${CP_AB_KERNELS:-sm90 fa2}; do
    for value in 1 0; do
      (( $(date +%s) - T1 > ${CP_AB_BUDGET_S:-300} )) && { echo "SKIPPED $S $kernel $SWITCH=$value (budget)"; continue; }
      echo "## S $S kernel $kernel $SWITCH $value" | tee -a "$OUT/cp_switch_ab.log"
      settings=(); for name in $SWITCH; do settings+=("$name=$value"); done
      env "${settings[@]}" timeout 200 python3 benchmarks/bench_cp_gpu.py --bench --dtypes bfloat16 \
        --world-sizes ${CP_AB_WORLD:-2} --lengths $S \
        --masks ${CP_AB_MASKS:-share_question global_sliding_window causal_document} \
        --methods allgather --t1-max 0 --parts --repeats 2 --kernel $kernel 2>&1 | grep -v -E "^W|^I[0-9]" \
        | tee -a "$OUT/cp_switch_ab.log" | grep -E "^\| [a-z]"
      stamp "$S $kernel $SWITCH=$value done"
    done
  done
done
