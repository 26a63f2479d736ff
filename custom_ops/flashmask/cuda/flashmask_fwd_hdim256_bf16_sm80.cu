// Instantiation: fwd, head dim 256, bf16 (one file per config keeps builds parallel).
#include "flashmask_launch.cuh"

namespace flashmask {
namespace cuda {

template <>
void run_fwd_<256, __nv_bfloat16>(const FwdParams& p, cudaStream_t stream) {
  launch_fwd<256, __nv_bfloat16>(p, stream);
}

}  // namespace cuda
}  // namespace flashmask
