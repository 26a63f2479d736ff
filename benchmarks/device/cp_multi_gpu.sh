#!/usr/bin/env bash
# Device call 2 on a machine of several GPUs (kinds nvidia-h200-x2/x4/x8), after
# `bash .gpu1/device-install.sh` in call 1: the trimmed Paddle GPU runtime, NCCL found as
# libnccl.so (the device's own, from its plain python3), NVLink multicast off, then
# benchmarks/bench_cp_multi_gpu.py on every GPU: exactness on W ranks and the step, compute,
# exchanges and hidden share per rank. Carry .gpu2 and .gpu_objs.
#   CP_LENGTHS="131072 262144 1048576"  CP_STAGES="--check --bench"
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
bash .gpu2/device-install.sh > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
NCCL_PKG=$(env -u PYTHONPATH python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])")
mkdir -p /root/nccl && ln -sf "$NCCL_PKG/lib/libnccl.so.2" /root/nccl/libnccl.so
source /root/pdgpu/env.sh
export LD_LIBRARY_PATH=/root/nccl:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -f .gpu_objs/cutlass-include.tar.xz ]; then
  mkdir -p /root/cutlass-include && tar xJf .gpu_objs/cutlass-include.tar.xz -C /root/cutlass-include
  export PADDLE_FLASHMASK_CUTLASS_INCLUDE=/root/cutlass-include
fi
[ -d .gpu_objs ] && export PADDLE_FLASHMASK_CUDA_OBJECTS=$PWD/.gpu_objs
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PADDLE_FLASHMASK_CACHE=/root/pfm_cache PYTHONUNBUFFERED=1
export PADDLE_FLASHMASK_CUDA_ARCHS=${PADDLE_FLASHMASK_CUDA_ARCHS:-90a}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import paddle_flashmask as p; p.build()" > "$OUT/build.log" 2>&1 \
  || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
stamp "op built"
N=$(nvidia-smi -L | wc -l); DEVICES=$(seq -s, 0 $((N - 1)))
python3 -m paddle.distributed.launch --devices "$DEVICES" --log_dir "$OUT/log" benchmarks/bench_cp_multi_gpu.py \
  ${CP_STAGES:---check --bench} --lengths ${CP_LENGTHS:-65536 131072 262144 1048576} \
  --out "$OUT/cp_multi_gpu.jsonl" > "$OUT/launch.log" 2>&1
echo "launch exit $?"; grep -E "^\||check on|FAIL|Error" "$OUT/log/workerlog.0" | tail -60
stamp "done"
