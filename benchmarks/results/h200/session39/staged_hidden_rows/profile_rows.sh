#!/usr/bin/env bash
# Source-level stalls of the staged backward (rows build = the tree) on the 1M CP part; outputs in one tarball.
set -u
cd .gpu_variants
[ -f rows/flashmask_harness ] || xz -d rows/flashmask_harness.xz; chmod +x rows/flashmask_harness
[ -f masks/part0_g0.i32 ] || xz -dk masks/part0_g0.i32.xz
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
W=/tmp/prof; mkdir -p $W; rep=$W/staged_part_rows
timeout 200 "$NCU" --kernel-name-base function --kernel-name "regex:flashmask_bwd_staged_kernel" \
  --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy \
  --section SourceCounters --section LaunchStats --section MemoryWorkloadAnalysis -f -o "$rep" \
  ./rows/flashmask_harness --time-mask-file masks/part0_g0.i32 524288 4 0 cp_part fa2 > $W/ncu_src.log 2>&1
echo "ncu exit $?"
"$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> /dev/null
"$NCU" -i "$rep.ncu-rep" --page details > $W/details.txt 2>&1
(cd .. && python3 benchmarks/device/ncu_sass_summary.py "$rep.csv" 45 > $W/stalls.txt 2>&1)
xz -k "$rep.csv"; rm -f "$rep.csv" "$rep.ncu-rep"
tar cf $OUT/profile_rows.tar -C $W .
head -50 $W/stalls.txt; grep -E "Duration|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput|Block Limit" $W/details.txt
