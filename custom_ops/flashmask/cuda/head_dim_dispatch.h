// The (head dim, dtype) dispatch both kernel families' APIs share: a launcher's
// run<D, T>() runs one pass's instantiation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace flashmask {
namespace cuda {

// Runs launcher.run<D, T>() for D = tile_head_dim when it is one of kDims (the
// family's instantiated tile head dims; cuda::tile_head_dim maps a call's head
// dim onto them), T bf16 or fp16. False when kDims lacks it: the caller says why.
template <int... kDims, typename Launcher>
bool dispatch_head_dim(int tile_head_dim, bool bf16, const Launcher& launcher) {
  auto run = [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    bf16 ? launcher.template run<D, __nv_bfloat16>() : launcher.template run<D, __half>();
    return true;
  };
  return ((tile_head_dim == kDims && run(std::integral_constant<int, kDims>{})) || ...);
}

}  // namespace cuda
}  // namespace flashmask
