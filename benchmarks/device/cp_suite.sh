#!/usr/bin/env bash
# Device call 2 for context parallel on ONE GPU (after `bash .gpu1/device-install.sh` in call 1):
# installs the trimmed Paddle GPU runtime, builds the op for sm_90a, then
#   check: every rank of W = 2 / 4 simulated on the GPU against the single-GPU op (bf16, fp16)
#   probe: which Paddle calls the exchange path may use in this runtime
#   bench: per-rank compute time of a step vs one GPU (64K-1M tokens)
# STAGES="check probe bench"  CP_BENCH_BUDGET_S=330. Carry .gpu2 and .gpu_objs.
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
STAGES=${STAGES:-"check probe bench"}
source benchmarks/device/runtime_env.sh

if [[ " $STAGES " == *" check "* ]]; then
  timeout 240 python3 benchmarks/bench_cp_gpu.py --check --dtypes bfloat16 float16 --world-sizes 2 4 \
    > "$OUT/cp_check.log" 2>&1
  echo "check exit $?"; grep -E "FAIL|^check:|Error|error" "$OUT/cp_check.log" | tail -12
  stamp "check done"
fi

if [[ " $STAGES " == *" probe "* ]]; then
  timeout 60 python3 - > "$OUT/cp_probe.log" 2>&1 <<'PY'
import numpy as np, paddle
g = paddle.CUDAPlace(0)
a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
t = paddle.to_tensor(a, place=g)
e = paddle.empty([5, 7], dtype="float32")
print("empty on", e.place, e.shape)
r = t.reshape([6, 4])
print("reshape right:", np.array_equal(r.numpy(), a.reshape(6, 4)))
PY
  cat "$OUT/cp_probe.log" | grep -v "^W\|^I" | tail -5
fi

if [[ " $STAGES " == *" bench "* ]]; then
  # one process per length (and per mask at 1M): a fresh allocator for the largest cases
  for S in ${CP_LENGTHS:-65536 131072 262144}; do
    python3 benchmarks/bench_cp_gpu.py --bench --dtypes bfloat16 --world-sizes ${CP_WORLD:-2 4} --lengths $S \
      --layouts ${CP_LAYOUTS:-auto} \
      --repeats 2 --out "$OUT/cp_bench.jsonl" 2>&1 | grep -v -E "^W|^I[0-9]" | tee -a "$OUT/cp_bench.log" | grep "^| [a-z]"
  done
  for M in ${CP_1M_MASKS:-causal_document share_question global_sliding_window}; do
    python3 benchmarks/bench_cp_gpu.py --bench --dtypes bfloat16 --world-sizes ${CP_WORLD:-2 4} --lengths 1048576 \
      --masks $M --methods ${CP_1M_METHODS:-allgather ulysses} --repeats 2 --out "$OUT/cp_bench.jsonl" 2>&1 | grep -v -E "^W|^I[0-9]" | tee -a "$OUT/cp_bench.log" | grep "^| [a-z]"
  done
  stamp "bench done"
fi
