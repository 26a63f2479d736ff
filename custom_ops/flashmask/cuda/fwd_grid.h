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
// query block query_blocks - 1 - y (the heaviest under causal masks first).
// 32-bit: an ordered launch has fewer than 2^31 CTAs (flashmask_launch.cuh,
// fa2_cta_order_pays), and the kernel decodes its rank with two divisions
// rather than two 64-bit ones.
FLASHMASK_HOST_DEVICE FwdCta fwd_cta_of_rank(const FwdParams& p, int query_blocks, int r) {
  const int rows = r / p.num_heads;
  return FwdCta{query_blocks - 1 - rows % query_blocks, r - rows * p.num_heads, rows / query_blocks};
}

}  // namespace cuda
}  // namespace flashmask
