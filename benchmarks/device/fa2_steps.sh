#!/usr/bin/env bash
# One device call for the FA2-class rework (NOTES.md, "Plan for the sm80 rework (issue 15)"):
# every harness variant in .gpu_variants (built here by harness/build_variant.sh, one per version of
# the kernels) checked once (--check-fa2) and timed twice (--time-fa2), interleaved (base, v1, v2,
# base, v1, v2: clock drift hits all alike), the mma.sync peak (--mma-peak), then torch's
# FlashAttention-2 (SDPA flash, causal) on the same shapes. No Paddle needed: a cold machine is fine.
#   build, on the CPU machine:  bash benchmarks/device/harness/build_variant.sh base 7a95a4e
#                               bash benchmarks/device/harness/build_variant.sh step1 <rev>  ...
#   device call (run tool):     command "bash benchmarks/device/fa2_steps.sh", carry [".gpu_variants"]
#   VARIANTS="base step1 step2"  (default: base first, then the other directories, sorted)
#   BUDGET_S=480  (stages that would start later are skipped; the summary is always written)
# A variant directory may hold, instead of (or beside) its binary, `binary_of` (the name of the
# variant whose binary it runs) and `env` (KEY=VALUE lines exported for its runs): one build, two
# settings (e.g. PADDLE_FLASHMASK_FA2_BWD=split against the default), without a second 8 MB binary.
# $OUT (<= 8 files come back): <variant>.log each (check + both time passes), fa2_steps.log
# (nvidia-smi, --mma-peak, the peer) and fa2_steps_summary.md (fa2_steps_summary.py: TFLOP/s per case
# and variant as "pass 1/pass 2", the FA2 peer, check results, the mma peak; also printed at the end).
# So at most 6 variants. A variant whose check fails is still timed and marked FAILED; one whose
# check timed out (a hang) is not timed.
# Time on an H100 (estimated, today's kernels; later steps are faster): --check-fa2 ~5-10 s a
# variant (30 checks; the CPU reference takes ~10 s on 2 cores here, 16 there), --time-fa2 ~3-5 s a
# pass (GPU ~2 s, 7 runs of each: causal 8K/16K at D 64/96/128 ~0.95 s, their 16K D=128 fwd 9.4 +
# bwd 35 ms; D=256 about twice D=128's; the masks ~0.6 s, at 32K mostly causal_document; det 16K
# ~0.4 s), --mma-peak ~1 s, the peer ~100 s (5 python3 processes: D 64/80/96/128/256, torch import
# each): ~10 + N x 10 + 2N x 6 + 80 s, 5 variants ~3.5 min; BUDGET_S and the per-stage timeouts
# bound a hang. --check-fa2 has 8 more checks with head dim 256 (4 cases x 2 modes).
set -uo pipefail
cd "$(dirname "$0")/../.." || { echo "FATAL: cd to the repo root"; exit 1; }
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-480}
CHECK_TIMEOUT_S=${CHECK_TIMEOUT_S:-180} TIME_TIMEOUT_S=${TIME_TIMEOUT_S:-120} PEER_TIMEOUT_S=${PEER_TIMEOUT_S:-150}
T0=$(date +%s)
LOG=$OUT/fa2_steps.log
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }
# Seconds left of the budget (20 s kept for the summary); a stage's limit: its own, or what is left.
left() { echo $(( BUDGET_S - 20 - ($(date +%s) - T0) )); }
limit() { local l; l=$(left); (( l < $1 )) && echo "$l" || echo "$1"; }
smi() {
  { echo "## nvidia-smi $1"
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader 2>&1
  } | tee -a "$LOG"
}

[ -d .gpu_variants ] || { echo "FATAL: no .gpu_variants here (build_variant.sh; carry [\".gpu_variants\"])"; exit 1; }
if [ -n "${VARIANTS:-}" ]; then
  read -ra V <<< "$VARIANTS"
else
  V=()
  [ -d .gpu_variants/base ] && V+=(base)
  for d in $(ls .gpu_variants | LC_ALL=C sort); do [ "$d" != base ] && [ -d ".gpu_variants/$d" ] && V+=("$d"); done
fi
(( ${#V[@]} >= 1 && ${#V[@]} <= 6 )) \
  || { echo "FATAL: ${#V[@]} variants (${V[*]}); 1 to 6 fit the 8 files of \$OUT"; exit 1; }
source benchmarks/device/variants.sh  # harness_of, run_variant, check_variants
check_variants "${V[@]}"
: > "$LOG"
stamp "variants: ${V[*]}"
smi before

# Each variant's log: its check, then its time passes, between markers fa2_steps_summary.py reads.
for v in "${V[@]}"; do
  t=$(limit "$CHECK_TIMEOUT_S")
  echo "## check-fa2" > "$OUT/$v.log"
  if (( $(left) < 10 )); then rc=-1; echo "SKIPPED: $v --check-fa2 (budget)" | tee -a "$LOG"
  else run_variant "$v" "$t" --check-fa2 >> "$OUT/$v.log" 2>&1; rc=$?; fi
  echo "## check-fa2 exit $rc" >> "$OUT/$v.log"
  stamp "$v --check-fa2 exit $rc: $(grep -E '^[0-9]+ failures$' "$OUT/$v.log" | tail -1)"
  grep -E " FAIL$|NOT-IDENTICAL|error|what\(\)" "$OUT/$v.log" | head -5
  (( rc == 124 || rc == 137 )) && echo "TIMEOUT: $v --check-fa2 after $t s: not timed (a hang)" | tee -a "$LOG"
done

echo "## mma-peak" >> "$LOG"
t=$(limit 60)
if (( $(left) >= 10 )); then
  run_variant "${V[0]}" "$t" --mma-peak >> "$LOG" 2>&1
  stamp "--mma-peak exit $?: $(grep '^mma_peak:' "$LOG" | tail -1)"
else
  echo "SKIPPED: --mma-peak (budget)" | tee -a "$LOG"
fi

for pass in 1 2; do
  for v in "${V[@]}"; do
    if grep -qE "^## check-fa2 exit (124|137)$" "$OUT/$v.log"; then continue; fi
    t=$(limit "$TIME_TIMEOUT_S")
    echo "## time-fa2 pass $pass" >> "$OUT/$v.log"
    if (( $(left) < 10 )); then rc=-1; echo "SKIPPED: $v --time-fa2 pass $pass (budget)" | tee -a "$LOG"
    else run_variant "$v" "$t" --time-fa2 >> "$OUT/$v.log" 2>&1; rc=$?; fi
    (( rc != 0 )) && tail -3 "$OUT/$v.log"
    echo "## time-fa2 pass $pass exit $rc" >> "$OUT/$v.log"
    stamp "$v --time-fa2 pass $pass exit $rc"
  done
  smi "after time pass $pass"
done

# torch's FA2 on causal in the device's plain python3, none of Paddle's paths: its native GQA
# (fa2_gqa_causal, the summary's FA2 column, back to back) and SDPA flash with K/V repeated (the
# peer of the earlier calls); records go into fa2_steps.log as 'peer_json:' lines.
PEER_JSON=/tmp/fa2_steps_peers.jsonl
rm -f "$PEER_JSON"
# SKIP_PEER=1 leaves it out (an A/B of our variants only; the peer's figures from an earlier call).
# PEER_KV_HEADS="8 32" also times it without GQA (32:32; the summary's table takes 32:8 only, the
# log's '| fa2_gqa_causal |' rows have both).
PEER_SPECS=("64:8192 16384" "80:8192 16384" "96:8192 16384" "128:8192 16384 32768" "256:8192 16384")
[ "${SKIP_PEER:-0}" = 1 ] && PEER_SPECS=() && echo "SKIPPED: FA2 peer (SKIP_PEER=1)" | tee -a "$LOG"
for spec in "${PEER_SPECS[@]}"; do
  dim=${spec%%:*} lengths=${spec#*:}
  t=$(limit "$PEER_TIMEOUT_S")
  if (( $(left) < 15 )); then echo "SKIPPED: FA2 peer D=$dim (budget)" | tee -a "$LOG"; continue; fi
  echo "## peer D=$dim" >> "$LOG"
  timeout -k 10 "$t" env -u PYTHONPATH -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 python3 benchmarks/bench_gpu_peers.py \
    --lengths $lengths --kv-heads ${PEER_KV_HEADS:-8} --masks causal --impls fa2_gqa_causal sdpa_flash_causal --repeats 5 --back-to-back 8 \
    --dim "$dim" --out "$PEER_JSON" >> "$LOG" 2>&1
  stamp "FA2 peer D=$dim exit $?"
done
[ -f "$PEER_JSON" ] && sed 's/^/peer_json: /' "$PEER_JSON" >> "$LOG"
grep -E "^\| (fa2_gqa|sdpa_flash)_causal" "$LOG"

smi after
stamp "done; summary:"
python3 benchmarks/device/fa2_steps_summary.py "$OUT" "${V[@]}" || echo "FATAL: fa2_steps_summary.py failed"
ls "$OUT"
