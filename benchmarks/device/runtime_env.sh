# Sourced by the device-call scripts (gpu_suite.sh, cp_suite.sh, cp_multi_gpu.sh) after
# `bash .gpu1/device-install.sh` in call 1: installs the trimmed Paddle GPU runtime's second
# half, points the build at the carried CUDA objects and CuTe headers (.gpu_objs, from
# benchmarks/device/harness/build.sh; objects that do not match the sources are rebuilt in
# parallel), builds the op for sm_90a. Needs OUT and defines stamp. The device line, the
# install's and the build's output go to one file, $OUT/setup.log (at most 8 files of $OUT
# come back from a call: the results keep the rest).
mkdir -p "$OUT"
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
SETUP_LOG=$OUT/setup.log
echo "## install" > "$SETUP_LOG"
bash .gpu2/device-install.sh >> "$SETUP_LOG" 2>&1 || { tail -20 "$SETUP_LOG"; exit 1; }
source /root/pdgpu/env.sh
if [ -f .gpu_objs/cutlass-include.tar.xz ]; then
  mkdir -p /root/cutlass-include && tar xJf .gpu_objs/cutlass-include.tar.xz -C /root/cutlass-include
  export PADDLE_FLASHMASK_CUTLASS_INCLUDE=/root/cutlass-include
fi
# The objects travel as one archive (~0.7 MB, under the carry limit beside the runtime's half);
# a call that carries .gpu_objs again gets a fresh copy without them, so every call unpacks it.
[ -f .gpu_objs/objs.tar.xz ] && tar xJf .gpu_objs/objs.tar.xz -C .gpu_objs
[ -d .gpu_objs ] && export PADDLE_FLASHMASK_CUDA_OBJECTS=$PWD/.gpu_objs
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PADDLE_FLASHMASK_CACHE=/root/pfm_cache PYTHONUNBUFFERED=1
export PADDLE_FLASHMASK_CUDA_ARCHS=${PADDLE_FLASHMASK_CUDA_ARCHS:-90a}
{ echo "## device"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } \
  | tee -a "$SETUP_LOG" | tail -n +2
stamp "runtime ready"
echo "## build" >> "$SETUP_LOG"
python3 -c "import paddle_flashmask as p; p.build()" >> "$SETUP_LOG" 2>&1 \
  || { sed -n '/^## build/,$p' "$SETUP_LOG" | grep -E "error|Error" | head -40; exit 1; }
stamp "op built"
