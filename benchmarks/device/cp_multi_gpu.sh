#!/usr/bin/env bash
# Device call 2 on a machine of several GPUs (kinds nvidia-h200-x2/x4/x8), after
# `bash .gpu1/device-install.sh` in call 1: the trimmed Paddle GPU runtime, NCCL found as
# libnccl.so (the device's own, from its plain python3), NVLink multicast off, then
# benchmarks/bench_cp_multi_gpu.py on every GPU: exactness on W ranks and the step, compute,
# exchanges and hidden share per rank. Carry .gpu2 and .gpu_objs.
#   CP_LENGTHS="131072 262144 1048576"  CP_STAGES="--check --bench"
#   CP_SPARSE_MODES="1 0": also time allgather with every key sent (PADDLE_FLASHMASK_CP_SPARSE=0)
#   CP_LAYOUTS="chunks local": plan layouts timed for allgather (default: auto)
#   CP_SPLIT_FROM=1048576 CP_MASKS=... CP_METHODS=...: one launch per mask and method from that length
#   CP_EXTRA_ARGS="...": more arguments for the benchmark
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
source benchmarks/device/runtime_env.sh
# NCCL: the device's own (its plain python3's nvidia.nccl) as libnccl.so; no NVLink multicast
NCCL_PKG=$(env -u PYTHONPATH python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])")
mkdir -p /root/nccl && ln -sf "$NCCL_PKG/lib/libnccl.so.2" /root/nccl/libnccl.so
export LD_LIBRARY_PATH=/root/nccl:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
N=$(nvidia-smi -L | wc -l); DEVICES=$(seq -s, 0 $((N - 1)))
# One launch per length: a fresh allocator for each (all lengths in one process ran out of
# memory at 1M on 2 H200s after the 128K/256K cases). From CP_SPLIT_FROM tokens on (default 1M)
# one launch per mask and method as well: at 1M on 2 H200s ulysses' backward and the one-GPU
# baseline of global + window ran out of memory after the masks and methods before them in
# the same process (138 GB held by Paddle's allocator). The exactness check with the first launch.
#   CP_MASKS / CP_METHODS: those split launches' masks (default: the benchmark's but causal, which it skips
#   past 256K) and methods (default allgather: ulysses past 2^19 rows a rank runs the FA2-class kernels)
STAGES=${CP_STAGES:---check --bench}
launch() {  # launch NAME ARGS...: one paddle.distributed.launch of the benchmark
  local name=$1; shift
  PADDLE_FLASHMASK_CP_SPARSE=$SPARSE timeout "${CP_LAUNCH_TIMEOUT_S:-240}" python3 -m paddle.distributed.launch \
    --devices "$DEVICES" --log_dir "$OUT/log_$name" benchmarks/bench_cp_multi_gpu.py $STAGES \
    --layouts ${CP_LAYOUTS:-auto} ${CP_EXTRA_ARGS:-} "$@" --out "$OUT/cp_multi_gpu.jsonl" > "$OUT/launch_$name.log" 2>&1
  echo "launch $name exit $?"
  grep -E "^\||check on|FAIL|Error" "$OUT/log_$name/workerlog.0" | tail -30
  STAGES=--bench
}
for S in ${CP_LENGTHS:-131072 262144 1048576}; do
  for SPARSE in ${CP_SPARSE_MODES:-1}; do
    if [ "$S" -lt "${CP_SPLIT_FROM:-1048576}" ]; then
      launch "${S}_sparse$SPARSE" --lengths "$S"
      continue
    fi
    for MASK in ${CP_MASKS:-causal_document share_question global_sliding_window}; do
      for METHOD in ${CP_METHODS:-allgather}; do
        launch "${S}_sparse${SPARSE}_${MASK}_$METHOD" --lengths "$S" --masks "$MASK" --methods "$METHOD"
      done
    done
  done
done
stamp "done"
