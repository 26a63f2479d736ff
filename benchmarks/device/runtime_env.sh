# Sourced by the device-call scripts (gpu_suite.sh, cp_suite.sh, cp_multi_gpu.sh) after
# `bash .gpu1/device-install.sh` in call 1: installs the trimmed Paddle GPU runtime's second
# half, points the build at the carried CUDA objects and CuTe headers (.gpu_objs, from
# benchmarks/device/harness/build.sh; objects that do not match the sources are rebuilt in
# parallel), builds the op for sm_90a. Needs OUT and defines stamp.
mkdir -p "$OUT"
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
bash .gpu2/device-install.sh > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
source /root/pdgpu/env.sh
if [ -f .gpu_objs/cutlass-include.tar.xz ]; then
  mkdir -p /root/cutlass-include && tar xJf .gpu_objs/cutlass-include.tar.xz -C /root/cutlass-include
  export PADDLE_FLASHMASK_CUTLASS_INCLUDE=/root/cutlass-include
fi
[ -d .gpu_objs ] && export PADDLE_FLASHMASK_CUDA_OBJECTS=$PWD/.gpu_objs
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PADDLE_FLASHMASK_CACHE=/root/pfm_cache PYTHONUNBUFFERED=1
export PADDLE_FLASHMASK_CUDA_ARCHS=${PADDLE_FLASHMASK_CUDA_ARCHS:-90a}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
stamp "runtime ready"
python3 -c "import paddle_flashmask as p; p.build()" > "$OUT/build.log" 2>&1 \
  || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
stamp "op built"
