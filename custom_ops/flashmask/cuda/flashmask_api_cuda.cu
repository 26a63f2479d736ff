// GPU entry points: run the mask preprocessing, then dispatch to the kernel
// instantiation for (head dim, dtype).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../flashmask_api.h"
#include "flashmask_launch.cuh"
#include "head_dim_dispatch.h"
#include "workspace.h"
#include "sm90/flashmask_sm90_api.h"

namespace flashmask {
namespace cuda {
void compute_block_bounds(const FwdParams& p, cudaStream_t stream);
void bwd_prepare(const BwdParams& p, cudaStream_t stream);
void bwd_finish(const BwdParams& p, cudaStream_t stream);
}  // namespace cuda

namespace {

// Why a head dim the FA2-class kernels lack did not reach the Hopper ones.
constexpr const char* hopper_only_note =
    " (head dims 192/128 (q, k / v) run on the Hopper kernels only: a compute capability 9.0 GPU, a "
    "build with sm_90a, 16-byte aligned strides, sequences up to 2^18, and not in deterministic mode)";

// Calls launcher.template run<D, T>() for the instantiated (head dim, dtype).
template <typename Params, typename Launcher>
void dispatch(const Params& p, const Launcher& launcher) {
  if (p.dtype == DType::kFloat32) {
    throw std::invalid_argument("flashmask_attention on GPU takes float16 or bfloat16 inputs");
  }
  if (p.value_head_dim() != p.head_dim) {
    throw std::invalid_argument(
        "flashmask_attention: the FA2-class GPU kernels take value with the head_dim of query and key, got " +
        std::to_string(p.head_dim) + "/" + std::to_string(p.value_head_dim()) + hopper_only_note);
  }
  // 80 runs on 96's tiles, padded.
  if (!cuda::dispatch_head_dim<32, 64, 96, 128, 256>(cuda::tile_head_dim(p.head_dim),
                                                     p.dtype == DType::kBFloat16, launcher)) {
    throw std::invalid_argument(
        "flashmask_attention: the FA2-class GPU kernels take head_dim 32, 64, 80, 96, 128 or 256, got " +
        std::to_string(p.head_dim) + (p.head_dim == 192 ? hopper_only_note : ""));
  }
}

struct FwdLauncher {
  const FwdParams& p;
  cudaStream_t stream;
  template <int D, typename T>
  void run() const {
    cuda::run_fwd_<D, T>(p, stream);
  }
};

struct BwdLauncher {
  const BwdParams& p;
  cudaStream_t stream;
  template <int D, typename T>
  void run() const {
    cuda::run_bwd_<D, T>(p, stream);
  }
};

struct BwdDQLauncher {
  const BwdParams& p;
  cudaStream_t stream;
  template <int D, typename T>
  void run() const {
    cuda::run_bwd_dq_<D, T>(p, stream);
  }
};

bool device_is_sm90() {
  return current_device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
         current_device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
}

// The kernel family for this call (see GpuKernel): forcing sm90 where it
// cannot run throws rather than silently measuring the other path. A call the
// Hopper forward takes whose backward has no Hopper kernel (`kernel_available`
// false) runs the FA2-class backward.
template <typename Params>
bool use_sm90(const Params& p, bool kernel_available) {
  if (p.gpu_kernel == GpuKernel::kFA2) return false;
  const bool takes = sm90::compiled() && sm90::fwd_supported(p) && device_is_sm90();
  if (p.gpu_kernel == GpuKernel::kSm90 && !takes) {
    throw std::invalid_argument(
        "flashmask_attention: gpu_kernel='sm90' needs a compute capability 9.0 GPU, a build with "
        "sm_90a (PADDLE_FLASHMASK_CUDA_ARCHS containing 90a, CUTLASS headers installed), "
        "head_dim 64, 80, 96, 128 or 256 (value alike) or 192 with value 128, float16/bfloat16 and 16-byte aligned "
        "strides");
  }
  return takes && kernel_available;
}

}  // namespace

// The (q/k, v) head dims the op takes on GPU (Python's validation alike): 32,
// 64, 80, 96, 128 and 256 with v alike, and 192 with v 128 (MLA). 32 runs on
// the FA2-class kernels only, 192/128 on the Hopper ones only (dispatch says so
// where a call cannot take them); the others on either, 80 on 96's tiles
// (tile_head_dim). A deterministic backward at 256 runs the FA2-class kernels
// (the Hopper backward has no deterministic mode there: sm90::bwd_supported),
// after the Hopper forward where that takes the call.
bool cuda_supports(DType dtype, int head_dim, int head_dim_v) {
  const bool alike = head_dim_v == head_dim && (head_dim == 32 || head_dim == 64 || head_dim == 80 ||
                                                head_dim == 96 || head_dim == 128 || head_dim == 256);
  return dtype != DType::kFloat32 && (alike || (head_dim == 192 && head_dim_v == 128));
}

void run_fwd_cuda(const FwdParams& params, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cuda::compute_block_bounds(params, s);
  if (use_sm90(params, true)) return sm90::run_fwd(params, s);
  dispatch(params, FwdLauncher{params, s});
}

void plan_bwd_cuda(BwdParams& params, int head_group, int group_max_steps) {
  const int group = params.num_heads / params.num_heads_k;
  const bool sm90_bwd = use_sm90(params, sm90::bwd_supported(params));
  params.bwd_head_group = sm90_bwd ? sm90::bwd_head_group(params, head_group) : 1;
  params.bwd_group_max_steps = sm90_bwd ? sm90::bwd_group_max_steps(params, group_max_steps) : 0;
  // One writer per slot: each CTA owns its slot (no zeroing, no atomics).
  // Grouping fitted per key block writes kv-head slots, zeroed and added to.
  const bool fitted = params.fitted_head_groups();
  const bool one_writer = params.deterministic || params.bwd_head_group == group;
  params.accum_heads_k =
      one_writer && !fitted ? params.num_heads / params.bwd_head_group : params.num_heads_k;
  // Every (key block, query head) CTA is the one writer of its dK/dV rows and
  // stores them in the output dtype (the slots below go unused): the sm90
  // kernel without GQA (sm90::bwd_dkv_direct), the FA2-class staged kernel
  // into dk/dv without GQA, and with GQA per query head (dk/dv_heads) for
  // bwd_finish to sum per kv head, as FlashAttention-2 does: in deterministic
  // mode (half the bytes of its per-head fp32 slots) and at head dims 64, 128
  // and 256 for groups of up to 4 (cuda::fa2_gqa_heads_stored: 0-3.5% faster
  // than adding into the kv-head slots, for up to twice their bytes).
  // Otherwise a GQA group's CTAs add into the kv-head slots.
  params.dkv_direct = sm90_bwd ? sm90::bwd_dkv_direct(params)
                               : cuda::use_staged_bwd() && cuda::fa2_dkv_direct() &&
                                     (params.num_heads == params.num_heads_k || params.deterministic ||
                                      cuda::fa2_gqa_heads_stored(params.num_heads, params.num_heads_k,
                                                                 params.head_dim));
  // The sm90 epilogue stores its whole slot even where no query block was
  // live; the FA2-class one only adds what it computed.
  params.dkv_accum_stored = one_writer && sm90_bwd && !fitted && !params.dkv_direct;
  // Both main kernels add dQ into 64-row tiles; the deterministic dQ pass
  // (FA2-class, query-major) writes the row layout.
  params.dq_accum_tiled = !params.deterministic;
  // The accumulator layout above belongs to this family: pin it, so the run
  // (run_bwd_cuda) cannot take the other one.
  params.gpu_kernel = sm90_bwd ? GpuKernel::kSm90 : GpuKernel::kFA2;
}

int64_t bwd_dq_accum_elems(const BwdParams& params) {
  // Tiles have the kernel's head dim (80's are 96's: tile_head_dim); the deterministic pass's rows the call's.
  if (!params.dq_accum_tiled) return int64_t(params.batch) * params.seqlen_q * params.num_heads * params.head_dim;
  return int64_t(params.batch) * cuda::bwd_padded_rows(params.seqlen_q) * params.num_heads *
         cuda::tile_head_dim(params.head_dim);
}

// Both main kernels (sm90 and FA2-class, either mode) read row_stats.
int64_t bwd_row_stats_elems(const BwdParams& params) {
  return 2 * int64_t(params.batch) * params.num_heads * cuda::bwd_padded_rows(params.seqlen_q);
}

int64_t bwd_dkv_heads_elems(const BwdParams& params, bool value) {
  if (!params.dkv_heads_expanded()) return 0;
  return int64_t(params.batch) * params.seqlen_k * params.num_heads *
         (value ? params.value_head_dim() : params.head_dim);
}

void run_bwd_cuda(const BwdParams& params, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cuda::compute_block_bounds(params, s);
  cuda::bwd_prepare(params, s);
  if (use_sm90(params, sm90::bwd_supported(params))) {
    sm90::run_bwd(params, s);
  } else {
    dispatch(params, BwdLauncher{params, s});
  }
  // Deterministic: the main backward left dQ out; compute it query-major.
  if (params.deterministic) dispatch(params, BwdDQLauncher{params, s});
  cuda::bwd_finish(params, s);
}

}  // namespace flashmask
