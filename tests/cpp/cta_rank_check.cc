// The FA2-class grids' CTA ranks (custom_ops/flashmask/cuda/fwd_grid.h,
// bwd_grid.h), on the host: the CTA orders (fa2_cta_order.cuh) permute ranks,
// and an ordered launch runs rank order[u] as CTA u, so rank r must be the
// r-th CTA the hardware would start in the grid's own launch (x fastest, then
// y, then z; the backward's padding CTAs left out). For each shape, walk the
// grids as the hardware does and compare with fwd_cta_of_rank /
// bwd_cta_of_rank (the forward's head pairs' and quads' grids too), and count that
// bwd_live_ctas ranks are every live CTA.
// Prints the number of mismatches (0 expected) and the number of checks.
#include <cstdint>
#include <cstdio>
#include <initializer_list>

#include "../../custom_ops/flashmask/cuda/bwd_grid.h"
#include "../../custom_ops/flashmask/cuda/fwd_grid.h"

using flashmask::BwdParams;
using flashmask::FwdParams;
namespace fc = flashmask::cuda;

// The forward's grid of kHeadsPerCta heads a CTA, walked as the hardware starts it, against
// fwd_cta_of_rank<kHeadsPerCta>.
template <int kHeadsPerCta>
void check_fwd_grid(const FwdParams& f, int blocks, int64_t& mismatches, int64_t& checks) {
  int64_t rank = 0;
  for (int z = 0; z < f.batch; ++z)
    for (int y = 0; y < blocks; ++y)
      for (int x = 0; x < f.num_heads / kHeadsPerCta; ++x, ++rank) {
        const fc::FwdCta c = fc::fwd_cta_of_rank<kHeadsPerCta>(f, blocks, int(rank));
        mismatches += c.m_block != blocks - 1 - y || c.head != kHeadsPerCta * x || c.batch != z;
        ++checks;
      }
}

int main() {
  int64_t mismatches = 0, checks = 0;
  for (int batch : {1, 2, 3}) {
    for (int heads : {1, 4, 6, 32}) {
      for (int blocks : {1, 2, 5, 17, 40}) {
        // Forward: grid (heads / k, query blocks, batch), query blocks in reverse, a CTA named
        // by its first head: one head, pairs and quads.
        FwdParams f;
        f.batch = batch, f.num_heads = heads;
        check_fwd_grid<1>(f, blocks, mismatches, checks);
        if (heads % 2 == 0) check_fwd_grid<2>(f, blocks, mismatches, checks);
        if (heads % 4 == 0) check_fwd_grid<4>(f, blocks, mismatches, checks);
        // Backward: the light-last rows at every deferral the launcher allows.
        for (int light_last : {0, 1, 2, 3, blocks / 2, blocks - 1, blocks}) {
          if (light_last < 0 || light_last > blocks) continue;
          BwdParams b;
          b.batch = batch, b.num_heads = heads, b.bwd_light_last = light_last;
          const int gx = fc::bwd_grid_x(blocks, heads, light_last), gy = heads + light_last;
          int64_t live = 0;
          for (int z = 0; z < batch; ++z)
            for (int y = 0; y < gy; ++y)
              for (int x = 0; x < gx; ++x) {
                const fc::BwdCta g = fc::bwd_cta_of(b, blocks, x, y, z);
                if (!g.live) continue;
                const fc::BwdCta c = fc::bwd_cta_of_rank(b, blocks, int(live++));
                mismatches += !c.live || c.n_block != g.n_block || c.head != g.head || c.batch != z;
                ++checks;
              }
          mismatches += live != fc::bwd_live_ctas(b, blocks) || live != int64_t(batch) * heads * blocks;
          ++checks;
        }
      }
    }
  }
  std::printf("%lld %lld\n", (long long)mismatches, (long long)checks);
  return 0;
}
