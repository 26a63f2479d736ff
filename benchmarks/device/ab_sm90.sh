#!/usr/bin/env bash
# One device call for a change to the Hopper kernels (PART=fwd, the default: the forward;
# PART=bwd: the backward): the new variant's checks (forward: every harness case under the
# default schedule, and again under the serial loop and pingpong, which share the epilogue),
# compute-sanitizer on the new variant, then the kernels timed on causal and the short-list
# masks (--time-fwd-masks / --time-bwd-masks), old and new interleaved over PASSES passes so
# that clock drift hits both alike.
#   OUT=... BASE=hd96b NEW=tmao [PASSES=2] bash benchmarks/device/ab_sm90.sh
#   OUT=... BASE=hd96b NEW=tmao CHECKS=0 PASSES=0 SANITIZE=1 bash benchmarks/device/ab_sm90.sh
#   (SANITIZE_TOOLS="memcheck": that tool alone; default memcheck synccheck racecheck)
# (carry [".gpu_variants"]: .gpu_variants/{BASE,NEW}/flashmask_harness, build_variant.sh builds them)
# CUDNN_PEER=1: after the passes, the FA3-class peer in the same call: SDPA's cuDNN backend on plain
# causal and full (bench_gpu_peers.py --impls sdpa_cudnn, the device's plain python3 without our
# environment; PEER_LENGTHS, default "8192 32768"), per call and back to back, into the summary.
# NEW may name several variants ("ord cap40"), checked and timed each. As in fa2_steps.sh, a
# variant directory may hold `binary_of` (the variant whose binary it runs) and `env` (KEY=VALUE
# lines exported for its runs) instead of its own binary: one build, several settings.
# A backward change: PART=bwd checks the default case list and --check-hd256/192/96 (the
# backward's head dims beside 64/128), times --time-bwd-masks (forward and backward columns)
# and sanitizes the sm90 backward kernels. PART=split: the same checks, timing --time-split-bwd
# (head dims 256 and 192/128 at 8K and 32K) instead.
set -u
PART=${PART:-fwd}
BASE=${BASE:?old variant}
NEW=${NEW:?new variant}
PASSES=${PASSES:-2}
read -ra NEWS <<< "$NEW"
source benchmarks/device/variants.sh  # harness_of, run_variant, check_variants (env variants too)
check_variants "$BASE" "${NEWS[@]}"
mkdir -p "$OUT"
SUMMARY=$OUT/ab_${BASE}_${NEWS[0]}.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee "$SUMMARY"

check() {  # label, variant, env..., then the harness arguments (the variant's env file in a subshell)
  local label=$1 v=$2; shift 2
  local log=$OUT/check_$label.log
  ( if [ -f ".gpu_variants/$v/env" ]; then set -a; source ".gpu_variants/$v/env"; set +a; fi
    exec timeout -k 10 "${RUN_TIMEOUT_S:-240}" env "$@" ) > "$log" 2>&1
  echo "check $label ($v): exit $? | $(grep -E '^[0-9]+ failures' "$log" | tail -1)" | tee -a "$SUMMARY"
}
H_NEW=$(harness_of "${NEWS[0]}")
if [ "${CHECKS:-1}" = 1 ] && [ "$PART" = fwd ]; then
check default "${NEWS[0]}" "$H_NEW"
check serial "${NEWS[0]}" PADDLE_FLASHMASK_SM90_FWD_OVERLAP=0 "$H_NEW"
check pingpong "${NEWS[0]}" PADDLE_FLASHMASK_SM90_FWD_PINGPONG=1 "$H_NEW" --check-hd96
check hd96 "${NEWS[0]}" "$H_NEW" --check-hd96
elif [ "${CHECKS:-1}" = 1 ]; then
check default "${NEWS[0]}" "$H_NEW"
for d in 256 192 96; do check hd$d "${NEWS[0]}" "$H_NEW" --check-hd$d; done
fi
if [ "$PART" = fwd ]; then TIME_MODE=--time-fwd-masks FIELDS=3-4,6,8-9; KERNELS=flashmask_fwd_sm90
elif [ "$PART" = split ]; then TIME_MODE=--time-split-bwd FIELDS=3-4,6,8-11,13; KERNELS=flashmask_bwd_sm90
else TIME_MODE=--time-bwd-masks FIELDS=3-4,6,8-11; KERNELS=flashmask_bwd_sm90; fi

for pass in $(seq "$PASSES"); do  # PASSES=0 with SANITIZE=1: the sanitizer call
  for v in "$BASE" "${NEWS[@]}"; do
    echo "== $v pass $pass" >> "$SUMMARY"
    run_variant "$v" "${RUN_TIMEOUT_S:-240}" $TIME_MODE 2>&1 | grep -E "^\| sm90" | cut -d'|' -f$FIELDS >> "$SUMMARY"
  done
done

if [ "${SANITIZE:-0}" = 1 ]; then  # a call of its own: each tool over the whole case list
  CS=/usr/local/cuda/bin/compute-sanitizer
  KERNELS=${SANITIZE_KERNELS:-$KERNELS}  # a --kernel-name kns= substring: sm90 for every Hopper kernel
  for tool in ${SANITIZE_TOOLS:-memcheck synccheck racecheck}; do
    log=$OUT/sanitize_$tool.log
    timeout "${SANITIZE_TIMEOUT_S:-180}" $CS --tool $tool --kernel-name kns=$KERNELS "$H_NEW" ${SANITIZE_ARGS:-} > "$log" 2>&1
    echo "$tool ($KERNELS) ${SANITIZE_ARGS:-default}: exit $? | $(grep -E '^[0-9]+ failures' "$log" | tail -1) | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)" | tee -a "$SUMMARY"
  done
  # racecheck's hazards by kernel head dim and SASS offset (the known class: the live lists' hand-over).
  grep -E "access at" "$OUT/sanitize_racecheck.log" \
    | sed -E 's/.*(Write|Read) access at .*(Fwd|Bwd)Traits<\(int\)([0-9]+)[^+]*(\+0x[0-9a-f]+).*/\1 \2 D\3 \4/' \
    | sort | uniq -c | sort -rn | head -20 >> "$SUMMARY"
fi
if [ "${CUDNN_PEER:-0}" = 1 ]; then
  echo "== sdpa_cudnn (FA3-class peer): | impl | mask | S | H:Hk | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | ..." >> "$SUMMARY"
  timeout -k 10 "${PEER_TIMEOUT_S:-150}" env -u PYTHONPATH -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 python3 \
    benchmarks/bench_gpu_peers.py --lengths ${PEER_LENGTHS:-8192 32768} --kv-heads 8 --masks causal full \
    --impls sdpa_cudnn --repeats 5 --back-to-back 8 --out "$OUT/cudnn_peer.jsonl" 2>&1 | grep -E "^\| sdpa_cudnn" >> "$SUMMARY"
  echo "cuDNN peer exit ${PIPESTATUS[0]} (back-to-back times in $OUT/cudnn_peer.jsonl)" >> "$SUMMARY"
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader >> "$SUMMARY"
cat "$SUMMARY"
