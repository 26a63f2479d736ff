// Layout of the int32 workspace the caller allocates for a CUDA call
// (block_bounds_elems, FwdParams::block_bounds): the mask's 64-column block
// summaries, then the persistent kernels' tile counters, which each launch
// that uses them zeroes on its stream first. Also the padding of the sm90
// backward's row statistics (BwdParams::row_stats).
#pragma once

#include <cstdint>

#include "../flashmask_params.h"

namespace flashmask {
namespace cuda {

constexpr int kTileCounterInts = 4;  // 16 bytes, after the summaries

// Rows of each (batch, head) in BwdParams::row_stats: seqlen_q rounded up to
// whole 64-row blocks (the sm90 backward's step), so every step's rows are
// one aligned 256-byte bulk copy.
constexpr int kRowStatsBlock = 64;
FLASHMASK_HOST_DEVICE int64_t bwd_row_stats_padded(int seqlen_q) {
  return (int64_t(seqlen_q) + kRowStatsBlock - 1) / kRowStatsBlock * kRowStatsBlock;
}

// int32 elements of the block summaries (0 without a column mask).
int64_t summary_elems(const FwdParams& p);
// The tile counters inside p.block_bounds.
int32_t* tile_counters(const FwdParams& p);

}  // namespace cuda
}  // namespace flashmask
