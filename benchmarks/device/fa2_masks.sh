#!/usr/bin/env bash
# One device call: FlashAttention-2 on the masks it runs natively (varlen causal documents, a causal
# sliding window) and our kernels on the very same instances, for issue 15's mask target (TFLOP/s on
# the unmasked area >= 0.75x plain causal): FA2's own masked-to-causal ratio is the reference for what
# skipping tiles can keep. No Paddle: a cold machine will do.
#   build, on the CPU machine:  bash benchmarks/device/harness/build_variant.sh base
#   device call (run tool):     command "bash benchmarks/device/fa2_masks.sh", carry [".gpu_variants"]
#   VARIANT=base  FAMILIES="fa2 sm90"  PASSES=2
# Order: mask files (bench_fa2_masks.py --masks-only), our pass 1, the FA2 peer (its own checks
# against a dense-mask reference first), our pass 2: clock drift falls on both sides.
# $OUT: fa2_masks.log (nvidia-smi, the peer's checks and table, our harness rows per pass),
# fa2_peer.jsonl, fa2_masks_summary.md (fa2_masks_summary.py, also printed).
set -uo pipefail
cd "$(dirname "$0")/../.." || { echo "FATAL: cd to the repo root"; exit 1; }
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
VARIANT=${VARIANT:-base} FAMILIES=${FAMILIES:-"fa2 sm90"} PASSES=${PASSES:-2}
H=.gpu_variants/$VARIANT/flashmask_harness
[ -f "$H" ] || { echo "FATAL: $H missing (build_variant.sh $VARIANT; carry [\".gpu_variants\"])"; exit 1; }
chmod +x "$H"
MASKS=/tmp/fa2_masks
rm -rf "$MASKS"
LOG=$OUT/fa2_masks.log
: > "$LOG"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
smi() {
  echo "## nvidia-smi $1" >> "$LOG"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >> "$LOG" 2>&1
}
peer() {  # peer ARGS...: the device's plain python3 (torch), none of Paddle's paths
  timeout -k 10 "${PEER_TIMEOUT_S:-300}" env -u PYTHONPATH -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 \
    python3 benchmarks/bench_fa2_masks.py --mask-dir "$MASKS" "$@"
}
ours_pass() {
  echo "## ours pass $1 ($H)" >> "$LOG"
  while read -r name s file; do
    for fam in $FAMILIES; do
      # The harness prints its table header and one row; a failure prints its reason instead.
      timeout -k 5 "${CASE_TIMEOUT_S:-120}" "$H" --time-mask-file "$file" "$s" 1 1 "$name" "$fam" > /tmp/fa2_case.txt 2>&1
      rc=$?
      grep -E '^\| (fa2|sm90) ' /tmp/fa2_case.txt >> "$LOG" \
        || { echo "FAILED: $fam $name $s (exit $rc)"; tail -3 /tmp/fa2_case.txt; } | tee -a "$LOG"
    done
  done < "$MASKS/index.txt"
  stamp "ours pass $1 done"
}

smi before
peer --masks-only >> "$LOG" 2>&1 || { echo "FATAL: bench_fa2_masks.py --masks-only failed"; cat "$LOG"; exit 1; }
stamp "masks: $(wc -l < "$MASKS/index.txt") cases"
ours_pass 1
echo "## fa2 peer" >> "$LOG"
peer --out "$OUT/fa2_peer.jsonl" >> "$LOG" 2>&1
stamp "fa2 peer exit $?"
for p in $(seq 2 "$PASSES"); do ours_pass "$p"; done
smi after
python3 benchmarks/device/fa2_masks_summary.py "$OUT" || echo "FATAL: fa2_masks_summary.py failed"
