#!/usr/bin/env bash
# Nsight Compute on our FA2-class kernels and on FlashAttention-2 itself (torch's, native GQA), same
# shapes (bf16, D=128, 32:8): where a step of ours loses against FA2's (issue 15). For each case
# (default: causal 16K forward and backward, sliding window 32K backward) one launch of each side's
# main kernel, with warp-state, instruction and source-level stall sampling; per kernel the SASS
# lines with the most stall samples and both sides' executed instructions by opcode
# (ncu_sass_summary.py; all kernels in $OUT/stalls.txt), the
# details pages ($OUT/details.txt), and in $OUT/ncu_fa2_peer.tar.xz the source pages as CSV (every
# SASS line with its executed instructions and stall samples) for an offline count by opcode.
# Device call: bash benchmarks/device/ncu_fa2_peer.sh [VARIANT]   (carry [".gpu_variants"])
# CASES="causal:16384" picks the cases; FLASHMASK_HARNESS_DIM=64 profiles another head dim (both
# sides); KINDS="fwd" profiles the causal cases' forward only.
set -u
VARIANT=${1:-base}
H=.gpu_variants/$VARIANT/flashmask_harness
NCU=${NCU:-/usr/local/cuda/bin/ncu}
MASKS=/tmp/fa2_ncu_masks
WORK=/tmp/ncu_fa2_peer
rm -rf "$WORK"; mkdir -p "$OUT" "$WORK"
chmod +x "$H"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/details.txt"
peer_py() { env -u PYTHONPATH -u LD_LIBRARY_PATH python3 "$@"; }
peer_py benchmarks/bench_fa2_masks.py --masks-only --mask-dir "$MASKS" --cases ${CASES:-causal:16384 sliding_window:32768} \
  || { echo "FATAL: masks"; exit 1; }
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats
  --section SourceCounters --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis"
profile() {  # profile TAG KERNEL_REGEX COMMAND...
  local tag=$1 regex=$2; shift 2
  local rep=/tmp/ncu_$tag
  timeout 300 "$NCU" --kernel-name-base function --kernel-name "regex:$regex" --launch-skip 1 --launch-count 1 \
    $SECTIONS -f -o "$rep" "$@" > "$rep.log" 2>&1 || { echo "ncu failed: $tag"; tail -5 "$rep.log"; return; }
  "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$WORK/${tag}_source.csv" 2> /dev/null
  { echo "=== $tag"; python3 benchmarks/device/ncu_sass_summary.py "$WORK/${tag}_source.csv" 40; } >> "$OUT/stalls.txt" 2>&1
  { echo "=== $tag"; "$NCU" -i "$rep.ncu-rep" --page details --print-details all 2> /dev/null; } >> "$OUT/details.txt"
  echo "profiled $tag"
}
while read -r name s file; do
  case "$name" in causal) kinds=${KINDS:-fwd bwd} ;; *) kinds="bwd" ;; esac
  for kind in $kinds; do
    ours_re='^flashmask_fwd_kernel'; fa2_re='flash_fwd_kernel'
    [ "$kind" = bwd ] && ours_re='^flashmask_bwd_staged_kernel' && fa2_re='flash_bwd_dq_dk_dv'
    profile "ours_${kind}_${name}_$s" "$ours_re" "$H" --time-mask-file "$file" "$s" 1 1 "$name" fa2
    profile "fa2_${kind}_${name}_$s" "$fa2_re" env -u PYTHONPATH -u LD_LIBRARY_PATH python3 \
      benchmarks/device/fa2_ncu_case.py "$name" "$s"
    { echo "=== opcodes ${kind}_${name}_$s, A = ours, B = FA2"
      python3 benchmarks/device/ncu_sass_summary.py --opcodes "$WORK/ours_${kind}_${name}_${s}_source.csv" \
        "$WORK/fa2_${kind}_${name}_${s}_source.csv"; } >> "$OUT/stalls.txt" 2>&1
  done
done < "$MASKS/index.txt"
tar cJf "$OUT/ncu_fa2_peer.tar.xz" -C /tmp ncu_fa2_peer
ls -la "$OUT" "$WORK"
