// Layout of the int32 workspace the caller allocates for a CUDA call
// (block_bounds_elems, FwdParams::block_bounds): the mask's 64-column block
// summaries, then the persistent kernels' tile counters, which each launch
// that uses them zeroes on its stream first.
#pragma once

#include <cstdint>

#include "../flashmask_params.h"

namespace flashmask {
namespace cuda {

constexpr int kTileCounterInts = 4;  // 16 bytes, after the summaries

// int32 elements of the block summaries (0 without a column mask).
int64_t summary_elems(const FwdParams& p);
// The tile counters inside p.block_bounds.
int32_t* tile_counters(const FwdParams& p);

}  // namespace cuda
}  // namespace flashmask
