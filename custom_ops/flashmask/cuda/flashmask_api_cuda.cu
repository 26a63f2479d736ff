// GPU entry points: run the mask preprocessing, then dispatch to the kernel
// instantiation for (head dim, dtype).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../flashmask_api.h"
#include "flashmask_launch.cuh"

namespace flashmask {
namespace cuda {
void compute_block_bounds(const FwdParams& p, cudaStream_t stream);
void bwd_prepare(const BwdParams& p, cudaStream_t stream);
void bwd_finish(const BwdParams& p, cudaStream_t stream);
}  // namespace cuda

namespace {

// Calls launcher.template run<D, T>() for the instantiated (head dim, dtype).
template <typename Params, typename Launcher>
void dispatch(const Params& p, const Launcher& launcher) {
  if (p.dtype == DType::kFloat32) {
    throw std::invalid_argument("flashmask_attention on GPU takes float16 or bfloat16 inputs");
  }
  const bool bf16 = p.dtype == DType::kBFloat16;
  switch (p.head_dim) {
    case 32:
      return bf16 ? launcher.template run<32, __nv_bfloat16>() : launcher.template run<32, __half>();
    case 64:
      return bf16 ? launcher.template run<64, __nv_bfloat16>() : launcher.template run<64, __half>();
    case 128:
      return bf16 ? launcher.template run<128, __nv_bfloat16>()
                  : launcher.template run<128, __half>();
    default:
      throw std::invalid_argument("flashmask_attention on GPU supports head_dim 32, 64 or 128, got " +
                                  std::to_string(p.head_dim));
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

}  // namespace

bool cuda_supports(DType dtype, int head_dim) {
  return dtype != DType::kFloat32 && (head_dim == 32 || head_dim == 64 || head_dim == 128);
}

void run_fwd_cuda(const FwdParams& params, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cuda::compute_block_bounds(params, s);
  dispatch(params, FwdLauncher{params, s});
}

void run_bwd_cuda(const BwdParams& params, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cuda::compute_block_bounds(params, s);
  cuda::bwd_prepare(params, s);
  dispatch(params, BwdLauncher{params, s});
  cuda::bwd_finish(params, s);
}

}  // namespace flashmask
