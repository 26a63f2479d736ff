// The FA2-class backward's tiled dQ layout (custom_ops/flashmask/cuda/
// dq_tile_layout.h) round trip, on the host: every warp of a kernel's dQ
// split (BwdTraits, the one-split kernel up to head dim 128: row tile warp %
// kDQRowTiles, head-dim slice warp / kDQRowTiles; BwdStagedTraits, the
// FA2-layout kernel, head dim 256 included: row slice warp % kDQWarpsM,
// head-dim slice warp / kDQWarpsM) adds each register of its m16n8 accumulators, placed as the
// PTX ISA defines the mma.m16n8 C fragment, at DQTileLayout::index; the
// conversion reads float i back to DQTileLayout::element(i). For each head
// dim, a step's kStepRows x D matrix (64 rows, or 128 where the FA2-layout
// kernel's step spans two tiles: its m16 row tile r goes to row tile r % 4 of
// the step's tile r / 4) must come back unchanged with every tile float added
// exactly once, and the (batch, head, block) tiles must tile dq_accum.
// (Including the header also runs its compile-time bijection proof.) Prints
// the number of mismatches (0 expected) and the number of checks.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../../custom_ops/flashmask/cuda/dq_tile_layout.h"
#include "../../custom_ops/flashmask/cuda/kernel_traits.h"

using flashmask::cuda::BwdStagedTraits;
using flashmask::cuda::BwdTraits;
using flashmask::cuda::DQTileElement;
using flashmask::cuda::DQTileLayout;
using flashmask::cuda::SmemClass;

// A warp's part of a step's kStepRows x D dQ: m16 row tiles [row_tile0, +
// row_tiles) of the step, 16-column steps [step0, + steps).
struct WarpPart {
  int row_tile0, row_tiles, step0, steps;
};

// The one-split kernel (flashmask_bwd_kernel.cuh): one row tile per warp.
template <int kDim>
struct SplitKernel {
  using Traits = BwdTraits<kDim, uint16_t>;
  static constexpr int kNWarps = Traits::kNWarps;
  static constexpr int kStepRows = Traits::kBlockM;
  static WarpPart part(int warp) {
    constexpr int kSliceSteps = kDim / 16 / Traits::kDQDimSplit;
    return {warp % Traits::kDQRowTiles, 1, (warp / Traits::kDQRowTiles) * kSliceSteps, kSliceSteps};
  }
};

// The FA2-layout kernel (flashmask_bwd_staged_kernel.cuh): kDQWarpsM warps
// along the rows, the rest along the head dim; its default tiles or those of
// the 99 KB GPUs (SmemClass::k99K).
template <int kDim, SmemClass kClass = SmemClass::kDefault>
struct StagedKernel {
  using Traits = BwdStagedTraits<kDim, uint16_t, kClass>;
  static constexpr int kNWarps = Traits::kNWarps;
  static constexpr int kStepRows = Traits::kBlockM;
  static WarpPart part(int warp) {
    constexpr int kQMTiles = Traits::kBlockM / Traits::kDQWarpsM / 16;
    constexpr int kQSteps = kDim / (Traits::kNWarps / Traits::kDQWarpsM) / 16;
    return {(warp % Traits::kDQWarpsM) * kQMTiles, kQMTiles, (warp / Traits::kDQWarpsM) * kQSteps, kQSteps};
  }
};

template <int kDim, typename Kernel>
void round_trip(long& mismatches, long& checked) {
  using Layout = DQTileLayout<kDim>;
  constexpr int kTiles = Kernel::kStepRows / Layout::kRows;  // the step's tiles
  static_assert(Kernel::kStepRows % Layout::kRows == 0, "a step is whole tiles");
  constexpr int kStepFloats = kTiles * Layout::kFloats;
  std::vector<double> x(kStepFloats), tiles(kStepFloats, 0.0);
  std::vector<int> adds(kStepFloats, 0);
  for (int i = 0; i < kStepFloats; ++i) x[i] = 1.0 + i;  // distinct values, row-major over the step
  for (int warp = 0; warp < Kernel::kNWarps; ++warp) {
    const WarpPart w = Kernel::part(warp);
    for (int row_tile = w.row_tile0; row_tile < w.row_tile0 + w.row_tiles; ++row_tile)
      for (int step = w.step0; step < w.step0 + w.steps; ++step)
        for (int t = 0; t < 2; ++t)
          for (int e = 0; e < 4; ++e)
            for (int lane = 0; lane < 32; ++lane) {
              const int row = row_tile * 16 + lane / 4 + (e >= 2 ? 8 : 0);  // groupID (+8)
              const int col = step * 16 + t * 8 + (lane % 4) * 2 + (e & 1);  // threadID_in_group x 2
              const int tile = row_tile / Layout::kRowTiles;
              const int i = Layout::index(row_tile % Layout::kRowTiles, step, t, e, lane);
              if (tile >= kTiles || i < 0 || i >= Layout::kFloats) {
                ++mismatches;
                continue;
              }
              tiles[tile * Layout::kFloats + i] += x[row * kDim + col];
              ++adds[tile * Layout::kFloats + i];
            }
  }
  std::vector<double> back(kStepFloats, 0.0);
  for (int tile = 0; tile < kTiles; ++tile)
    for (int i = 0; i < Layout::kFloats; ++i) {
      const DQTileElement el = Layout::element(i);
      mismatches += adds[tile * Layout::kFloats + i] != 1;
      if (el.row < 0 || el.row >= Layout::kRows || el.col < 0 || el.col >= kDim) {
        ++mismatches;
        continue;
      }
      back[(tile * Layout::kRows + el.row) * kDim + el.col] = tiles[tile * Layout::kFloats + i];
    }
  for (int i = 0; i < kStepFloats; ++i) {
    mismatches += back[i] != x[i];
    ++checked;
  }
}

// Query block m of (batch, head) owns floats [offset, offset + 64 D): over a
// few shapes the tiles must cover the B x H x padded x D floats once.
void tiles_cover_dq_accum(long& mismatches, long& checked) {
  const int dims[] = {32, 64, 96, 128, 256};
  for (int seqlen_q : {1, 63, 64, 65, 200, 4097})
    for (int head_dim : dims) {
      const int batch = 2, heads = 3;
      const int64_t padded = flashmask::cuda::bwd_padded_rows(seqlen_q);
      const int blocks = (seqlen_q + 63) / 64;
      std::vector<int> owners(batch * heads * padded * head_dim, 0);
      for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h)
          for (int m = 0; m < blocks; ++m) {
            const int64_t off = flashmask::cuda::dq_tile_offset(b, h, m, heads, seqlen_q, head_dim);
            for (int64_t k = off; k < off + 64 * head_dim; ++k) {
              if (k < 0 || k >= int64_t(owners.size())) {
                ++mismatches;
                break;
              }
              ++owners[k];
            }
          }
      for (int n : owners) {
        mismatches += n != 1;
        ++checked;
      }
    }
}

int main() {
  long mismatches = 0, checked = 0;
  round_trip<32, SplitKernel<32>>(mismatches, checked);
  round_trip<64, SplitKernel<64>>(mismatches, checked);
  round_trip<96, SplitKernel<96>>(mismatches, checked);
  round_trip<128, SplitKernel<128>>(mismatches, checked);
  round_trip<32, StagedKernel<32>>(mismatches, checked);
  round_trip<64, StagedKernel<64>>(mismatches, checked);
  round_trip<96, StagedKernel<96>>(mismatches, checked);
  round_trip<128, StagedKernel<128>>(mismatches, checked);
  round_trip<256, StagedKernel<256>>(mismatches, checked);
  round_trip<96, StagedKernel<96, SmemClass::k99K>>(mismatches, checked);
  round_trip<64, StagedKernel<64, SmemClass::k99K>>(mismatches, checked);
  round_trip<128, StagedKernel<128, SmemClass::k99K>>(mismatches, checked);
  static_assert(StagedKernel<64>::kStepRows == 128, "head dim 64 takes 128-row steps (two tiles)");
  tiles_cover_dq_accum(mismatches, checked);
  std::printf("%ld %ld\n", mismatches, checked);
  return mismatches != 0;
}
