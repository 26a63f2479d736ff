// Hopper backward instantiation: head dim 96, fp16.
#include "flashmask_sm90_launch.cuh"

namespace flashmask {
namespace sm90 {
template <>
void run_bwd_<96, __half>(const BwdParams& p, cudaStream_t stream) {
  launch_bwd<96, __half>(p, stream);
}
}  // namespace sm90
}  // namespace flashmask
