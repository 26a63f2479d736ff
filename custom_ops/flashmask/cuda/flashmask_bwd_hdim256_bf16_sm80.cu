// Instantiation: bwd, head dim 256, bf16 (one file per config keeps builds parallel).
#include "flashmask_launch.cuh"

namespace flashmask {
namespace cuda {

template <>
void run_bwd_<256, __nv_bfloat16>(const BwdParams& p, cudaStream_t stream) {
  launch_bwd<256, __nv_bfloat16>(p, stream);
}

}  // namespace cuda
}  // namespace flashmask
