// FlashMask classification done ahead of the main loop: for one query block,
// the compact list of key blocks that are not fully masked, each flagged as
// partially masked (elementwise bounds) or unmasked (no mask work). The
// producer loads only the listed blocks and the consumers iterate the same
// list, so a skipped block costs neither a load nor a comparison.
#pragma once

#include <cstdint>

#include "../../flashmask_params.h"
#include "../../mask_bounds.h"
#include "../kernel_traits.h"

namespace flashmask {
namespace sm90 {

constexpr int kLivePartialFlag = 0x8000;  // list entry: key block | flag
constexpr int kMaxListedKeyBlocks = 0x7fff;

__device__ __forceinline__ int live_block_index(uint16_t entry) { return entry & 0x7fff; }
__device__ __forceinline__ bool live_block_partial(uint16_t entry) {
  return (entry & kLivePartialFlag) != 0;
}

// Summary of key tile n (kBlockN columns), merged from the 64-column summaries
// that the preprocessing kernel wrote.
template <int kBlockN>
__device__ __forceinline__ BlockBounds tile_bounds(const BlockBounds* row, int n, int summary_blocks) {
  constexpr int kPer = kBlockN / cuda::kMaskBlockN;
  static_assert(kBlockN % cuda::kMaskBlockN == 0, "key tile spans whole summary blocks");
  BlockBounds s = row[n * kPer];
#pragma unroll
  for (int i = 1; i < kPer; ++i) {
    if (n * kPer + i < summary_blocks) s = merge_block_bounds(s, row[n * kPer + i]);
  }
  return s;
}

// Run by one full warp; returns the number of entries written to `list`
// (ascending key blocks).
template <int kBlockM, int kBlockN>
__device__ int build_live_block_list(const FwdParams& p, int batch, int head, int m_block,
                                     uint16_t* list) {
  const int lane = threadIdx.x % 32;
  const int r0 = m_block * kBlockM;
  const int r1 = min(r0 + kBlockM, p.seqlen_q);
  const int n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  int n_end = n_blocks;
  if (p.mask.causal) {
    const int last_col = r1 - 1 + (p.seqlen_k - p.seqlen_q);  // last key the last row sees
    n_end = last_col < 0 ? 0 : min(n_blocks, last_col / kBlockN + 1);
  }
  const bool has_bounds = p.mask.startend_row_indices != nullptr;
  const int summary_blocks = (p.seqlen_k + cuda::kMaskBlockN - 1) / cuda::kMaskBlockN;
  const BlockBounds* summary =
      has_bounds ? reinterpret_cast<const BlockBounds*>(p.block_bounds) +
                       mask_summary_row(p, batch, head) * summary_blocks
                 : nullptr;
  int count = 0;
  for (int base = 0; base < n_end; base += 32) {
    const int n = base + lane;
    TileKind kind = TileKind::kSkip;
    if (n < n_end) {
      const BlockBounds s = has_bounds ? tile_bounds<kBlockN>(summary, n, summary_blocks)
                                       : empty_block_bounds();
      kind = classify_tile(has_bounds, s, p.mask.causal, p.seqlen_q, p.seqlen_k, r0, r1,
                           n * kBlockN, n * kBlockN + kBlockN);
    }
    const unsigned live = __ballot_sync(0xffffffffu, kind != TileKind::kSkip);
    if (kind != TileKind::kSkip) {
      const int pos = count + __popc(live & ((1u << lane) - 1u));
      list[pos] = uint16_t(n | (kind == TileKind::kPartial ? kLivePartialFlag : 0));
    }
    count += __popc(live);
  }
  return count;
}

}  // namespace sm90
}  // namespace flashmask
