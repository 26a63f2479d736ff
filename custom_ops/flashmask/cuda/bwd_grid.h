// The FA2-class main backward's grid, shared by its launcher (flashmask_launch.cuh,
// launch_bwd_rows) and its kernels: num_heads rows of key blocks (key blocks fastest),
// then BwdParams::bwd_light_last rows, one per deferred key block, of one CTA per head.
#pragma once

#include "../flashmask_params.h"

namespace flashmask {
namespace cuda {

// The grid's x extent: the key blocks a head row keeps, or the heads of a deferred row.
FLASHMASK_HOST_DEVICE int bwd_grid_x(int key_blocks, int num_heads, int light_last) {
  return light_last > 0 && num_heads > key_blocks - light_last ? num_heads : key_blocks - light_last;
}

// What CTA (x, y) computes; `live` is false for the CTAs that only pad the x extent.
struct BwdCta {
  int n_block;
  int head;
  bool live;
};

FLASHMASK_HOST_DEVICE BwdCta bwd_cta_of(const BwdParams& p, int key_blocks, int x, int y) {
  const int first_deferred = key_blocks - p.bwd_light_last;
  if (y >= p.num_heads) return BwdCta{first_deferred + (y - p.num_heads), x, x < p.num_heads};
  return BwdCta{x, y, x < first_deferred};
}

}  // namespace cuda
}  // namespace flashmask
