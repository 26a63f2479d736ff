// Hopper backward instantiation: head dim 96, bf16.
#include "flashmask_sm90_launch.cuh"

namespace flashmask {
namespace sm90 {
template <>
void run_bwd_<96, __nv_bfloat16>(const BwdParams& p, cudaStream_t stream) {
  launch_bwd<96, __nv_bfloat16>(p, stream);
}
}  // namespace sm90
}  // namespace flashmask
