#!/usr/bin/env bash
# Session 50, device call C (no Paddle): 132cc4c's kernels in the Paddle-free harness (variant cur,
# harness/build.sh of this tree) and the FA2 peer scripts that 132cc4c changed (bench_fa2_masks.random_inputs),
# none of which had run on a GPU: --check-fa2, compute-sanitizer over it (memcheck, synccheck of every
# flashmask kernel; racecheck of the staged backward, whose next-block copies f9f84d0 rewrote),
# fa2_ncu_case.py and fa2_bwd_kernels.py once each, then fa2_masks.sh (FA2's own checks against a dense
# reference, and ours against FA2 on its mask instances, two passes). Carry [".gpu_variants"].
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT/logs"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }
H=.gpu_variants/cur/flashmask_harness
xz -dkf $H.xz && chmod +x $H
timeout 60 $H --check-fa2 > "$OUT/logs/check_fa2.log" 2>&1
stamp "check-fa2 exit $? | $(grep -E '^[0-9]+ failures' "$OUT/logs/check_fa2.log" | tail -1)"
for tool in memcheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --kernel-name kns=flashmask --error-exitcode 9 $H --check-fa2 \
    > "$OUT/logs/$tool.log" 2>&1
  stamp "$tool exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/logs/$tool.log" | tail -1) | $(grep -E '^[0-9]+ failures' "$OUT/logs/$tool.log" | tail -1)"
done
timeout 150 compute-sanitizer --tool racecheck --kernel-name kns=flashmask_bwd_staged_kernel --error-exitcode 9 \
  $H --check-fa2 > "$OUT/logs/racecheck.log" 2>&1
stamp "racecheck (staged backward) exit $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/logs/racecheck.log" | tail -1) | $(grep -cE '^ *(ok|PASS)' "$OUT/logs/racecheck.log") lines"
peer() { env -u PYTHONPATH -u LD_LIBRARY_PATH timeout "$1" python3 "${@:2}"; }
peer 60 benchmarks/device/fa2_ncu_case.py causal_document 8192 > "$OUT/logs/fa2_ncu_case.log" 2>&1
stamp "fa2_ncu_case exit $?"
peer 90 benchmarks/device/fa2_bwd_kernels.py sliding_window:8192 causal_document:8192 > "$OUT/fa2_bwd_kernels.md" 2>&1
stamp "fa2_bwd_kernels exit $?"
OUT=$OUT/fa2_masks VARIANT=cur FAMILIES=fa2 PASSES=2 timeout 240 bash benchmarks/device/fa2_masks.sh \
  > "$OUT/logs/fa2_masks_stdout.txt" 2>&1
stamp "fa2_masks exit $?"
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$OUT/logs"
stamp done
