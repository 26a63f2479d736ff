// Hopper forward instantiation: head dim 96, bf16.
#include "flashmask_sm90_launch.cuh"

namespace flashmask {
namespace sm90 {
template <>
void run_fwd_<96, __nv_bfloat16>(const FwdParams& p, cudaStream_t stream) {
  launch_fwd<96, __nv_bfloat16>(p, stream);
}
}  // namespace sm90
}  // namespace flashmask
