#!/usr/bin/env bash
# Nsight Compute on the Hopper kernels at 32K (harness --profile-32k, D=128, 32:8, bf16): for each
# of short_documents and sliding_window, the forward and the backward main kernel, one launch
# each, with warp-state and source-level stall sampling; writes per kernel the SASS lines with
# the most stall samples (ncu_sass_summary.py) and the details page, under $OUT.
# Device call: bash benchmarks/device/profile_32k.sh [VARIANT]   (carry [".gpu_variants"])
set -u
VARIANT=${1:-head}
H=.gpu_variants/$VARIANT/flashmask_harness
NCU=${NCU:-/usr/local/cuda/bin/ncu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/details.txt"
for c in ${CASES:-short_documents sliding_window}; do  # plain timings first (no profiler)
  "$H" --profile-32k "$c" | grep -E "^\| " | tee -a "$OUT/details.txt"
done
for c in ${CASES:-short_documents sliding_window}; do
  for k in fwd bwd; do
    rep=/tmp/${k}_$c
    timeout 240 "$NCU" --kernel-name-base function --kernel-name "regex:^flashmask_${k}_sm90_kernel" \
      --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section SourceCounters --section LaunchStats -f -o "$rep" "$H" --profile-32k "$c" > "$rep.log" 2>&1 \
      || { echo "ncu failed: $k $c"; tail -5 "$rep.log"; continue; }
    "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> /dev/null
    full=; [ "$c" = short_documents ] && full="$OUT/${k}_${c}_sass.tsv"
    python3 benchmarks/device/ncu_sass_summary.py "$rep.csv" 45 $full > "$OUT/${k}_${c}_stalls.txt" 2>&1
    { echo "=== $k $c"; grep -E "^\| " "$rep.log" | tail -2
      "$NCU" -i "$rep.ncu-rep" --page details 2> /dev/null; } >> "$OUT/details.txt"
  done
done
ls -la "$OUT"
