// The FA2-class forward's grid, shared by its launcher (flashmask_launch.cuh,
// launch_rows_heads_fastest), its kernel and its CTA order (fa2_cta_order.cuh):
// (heads, query blocks in reverse, batch), heads fastest. A CTA's rank is its
// linear index in the order the hardware hands the grid out.
#pragma once

#include <cstdint>

#include "../flashmask_params.h"

namespace flashmask {
namespace cuda {

struct FwdCta {
  int m_block;
  int head;
  int batch;
};

// The CTA of rank r: r = (batch x query_blocks + y) x num_heads + head, with
// query block query_blocks - 1 - y (the heaviest under causal masks first);
// with head pairs or quads (kHeadsPerCta = 2 or 4, below) num_heads /
// kHeadsPerCta CTAs a grid row, each named by its first head.
// 32-bit: an ordered launch has fewer than 2^31 CTAs (flashmask_launch.cuh,
// fa2_cta_order_pays), and the kernel decodes its rank with two divisions
// rather than two 64-bit ones.
template <int kHeadsPerCta = 1>
FLASHMASK_HOST_DEVICE FwdCta fwd_cta_of_rank(const FwdParams& p, int query_blocks, int r) {
  const int row_ctas = p.num_heads / kHeadsPerCta;
  const int rows = r / row_ctas;
  return FwdCta{query_blocks - 1 - rows % query_blocks, (r - rows * row_ctas) * kHeadsPerCta, rows / query_blocks};
}

// Head pairs (the kernel's kHeadsPerCta = 2): one CTA per (two query heads,
// 64-row query block, batch), the pairs fastest, where both heads of a pair
// read the same K/V head, the same mask head and the same block_mask head
// (heads 2j and 2j + 1, so every group of an even size splits into pairs).
// Both heads' rows then go through every tile together, so 64-row blocks
// meet the mask where one head's 128-row block would: on masks of short
// segments (documents, answers, windows) fewer tiles are partial or half
// dead, at the MMA and K/V traffic per row of the 128-row tile.
// Head quads (kHeadsPerCta = 4): the same with 32-row blocks of four heads
// (4j .. 4j + 3), where the GQA groups split into fours: each warp's 32 rows
// are one head's block.
constexpr int kFwdPairRows = 64;
constexpr int kFwdQuadRows = 32;
// Heads in groups of `heads_a_tile` consecutive ones, each group inside one
// run of `shared_by`'s heads (num_heads / shared_by query heads a run).
inline bool heads_group_up(int num_heads, int shared_by, int heads_a_tile) {
  return shared_by > 0 && num_heads % shared_by == 0 && (num_heads / shared_by) % heads_a_tile == 0;
}
inline bool fwd_heads_share_tiles(const FwdParams& p, int heads_a_tile) {
  return heads_group_up(p.num_heads, p.num_heads_k, heads_a_tile) &&
         (p.mask.startend_row_indices == nullptr || heads_group_up(p.num_heads, p.mask.num_heads, heads_a_tile)) &&
         (p.block_mask.data == nullptr || heads_group_up(p.num_heads, p.block_mask.num_heads, heads_a_tile));
}

}  // namespace cuda
}  // namespace flashmask
