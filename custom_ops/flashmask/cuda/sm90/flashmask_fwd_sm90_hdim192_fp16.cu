// Hopper forward instantiation: head dim 192 (value 128), fp16.
#include "flashmask_sm90_launch.cuh"

namespace flashmask {
namespace sm90 {
template <>
void run_fwd_<192, __half>(const FwdParams& p, cudaStream_t stream) {
  launch_fwd<192, __half>(p, stream);
}
}  // namespace sm90
}  // namespace flashmask
