// The Hopper forward's TMA epilogue (FwdTraits::kTmaStoreO) stores a consumer
// warpgroup's rows of O panel by panel from the tile's Q buffer, at
// FwdTraits::out_panel_offset, through SmemLayoutOPanel. Those must address
// exactly the elements SmemLayoutQ gives the same (row, column) of that buffer
// (where stmatrix wrote them), swizzle included. Host code: compiled by nvcc,
// run by tests/test_cuda_compile.py; prints "<mismatches> <checks>".
#include <cstdio>

#include "../../custom_ops/flashmask/cuda/sm90/sm90_kernel_traits.h"

using namespace flashmask::sm90;

template <int kHeadDim>
void check(long& mismatches, long& checks) {
  using Traits = FwdTraits<kHeadDim, cutlass::bfloat16_t>;
  static_assert(Traits::kTmaStoreO, "head dims 64, 96 and 128 store O with TMA");
  typename Traits::SmemLayoutQ q;
  typename Traits::SmemLayoutOPanel panel;
  for (int buffer = 0; buffer < Traits::kQBuffers; ++buffer)
    for (int wg = 0; wg < Traits::kNumMmaWarpGroups; ++wg)
      for (int j = 0; j < Traits::kHeadDimV / Traits::kPanelCols; ++j)
        for (int r = 0; r < Traits::kOutRows; ++r)
          for (int c = 0; c < Traits::kPanelCols; ++c) {
            const int in_q = q(wg * Traits::kOutRows + r, j * Traits::kPanelCols + c, buffer);
            const int in_panel = Traits::out_panel_offset(buffer, j, wg) + panel(r, c);
            mismatches += in_q != in_panel;
            ++checks;
          }
}

int main() {
  long mismatches = 0, checks = 0;
  check<64>(mismatches, checks);
  check<96>(mismatches, checks);
  check<128>(mismatches, checks);
  static_assert(!FwdTraits<192, cutlass::bfloat16_t>::kTmaStoreO && !FwdTraits<256, cutlass::half_t>::kTmaStoreO,
                "192/128 and 256 store O from registers");
  std::printf("%ld %ld\n", mismatches, checks);
  return 0;
}
