// The FA2-class main backward's grid, shared by its launcher (flashmask_launch.cuh,
// launch_bwd_rows), its kernels and its CTA order (fa2_cta_order.cuh): num_heads
// rows of key blocks (key blocks fastest), then BwdParams::bwd_light_last rows,
// one per deferred key block, of one CTA per head.
#pragma once

#include "../flashmask_params.h"

namespace flashmask {
namespace cuda {

// The grid's x extent: the key blocks a head row keeps, or the heads of a deferred row.
FLASHMASK_HOST_DEVICE int bwd_grid_x(int key_blocks, int num_heads, int light_last) {
  return light_last > 0 && num_heads > key_blocks - light_last ? num_heads : key_blocks - light_last;
}

// What CTA (x, y, batch) computes; `live` is false for the CTAs that only pad the x extent.
struct BwdCta {
  int n_block;
  int head;
  bool live;
  int batch;
};

FLASHMASK_HOST_DEVICE BwdCta bwd_cta_of(const BwdParams& p, int key_blocks, int x, int y, int batch) {
  const int first_deferred = key_blocks - p.bwd_light_last;
  if (y >= p.num_heads) return BwdCta{first_deferred + (y - p.num_heads), x, x < p.num_heads, batch};
  return BwdCta{x, y, x < first_deferred, batch};
}

// The grid's live CTAs by rank, in the order the hardware hands them out (x
// fastest, then y, then batch; the padding left out): batch x num_heads x
// key_blocks of them. The CTA orders (fa2_cta_order.cuh) permute these ranks,
// and an ordered launch runs one CTA per rank.
FLASHMASK_HOST_DEVICE int64_t bwd_live_ctas(const BwdParams& p, int key_blocks) {
  return int64_t(p.batch) * p.num_heads * key_blocks;
}
// 32-bit: an ordered launch has fewer than 2^31 CTAs (flashmask_launch.cuh,
// fa2_cta_order_pays).
FLASHMASK_HOST_DEVICE BwdCta bwd_cta_of_rank(const BwdParams& p, int key_blocks, int r) {
  const int first_deferred = key_blocks - p.bwd_light_last;
  const int per_batch = p.num_heads * key_blocks;
  const int batch = r / per_batch;
  const int i = r - batch * per_batch;
  const int kept = p.num_heads * first_deferred;  // the head rows, then the deferred rows
  if (i < kept) {
    const int head = i / first_deferred;
    return BwdCta{i - head * first_deferred, head, true, batch};
  }
  const int j = (i - kept) / p.num_heads;
  return BwdCta{first_deferred + j, i - kept - j * p.num_heads, true, batch};
}

}  // namespace cuda
}  // namespace flashmask
