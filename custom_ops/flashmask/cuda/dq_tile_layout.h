// The FA2-class backward's tiled dQ accumulator (BwdParams::dq_accum_tiled):
// dq_accum holds whole 64-row tiles, [batch, num_heads, bwd_padded_rows(seqlen_q)
// / 64, 64 x head_dim] fp32 (the sm90 backward's tiles, in another order
// inside each tile). A warp's dQ += dS K yields m16n16 blocks as two mma.sync
// m16n8 accumulators; each of their 8 registers is one warp-wide RED, and
// this order puts a register's 32 lanes on 32 consecutive floats (128
// contiguous bytes) instead of 8 rows x 4 lanes at stride 2 (8 sectors, half
// used). The kernel adds through `index`, the conversion to dq reads back
// through `element`; host code too (tests/cpp/dq_tile_layout_check.cc).
#pragma once

#include "workspace.h"

namespace flashmask {
namespace cuda {

struct DQTileElement {
  int row;
  int col;
};

template <int kHeadDim>
struct DQTileLayout {
  static constexpr int kRows = kBwdRowBlock;
  static constexpr int kFloats = kRows * kHeadDim;
  static constexpr int kRowTiles = kRows / 16;  // m16 row tiles
  static constexpr int kSteps = kHeadDim / 16;  // 16-column steps (two n8 tiles each)
  static_assert(kHeadDim % 16 == 0 && kRows % 16 == 0, "whole m16n16 blocks");

  // Float of the tile holding accumulator register e (0..3) of n8 tile t
  // (0, 1) of `lane` in the m16n16 block (row_tile, step): blocks in (row
  // tile, step) order, 256 floats each, then one 32-float run per register.
  // In three terms, so that the kernel keeps one address per block (lane
  // included) and reaches the registers' runs with immediate offsets.
  static constexpr int kBlockFloats = 256;
  FLASHMASK_HOST_DEVICE static constexpr int block_offset(int row_tile, int step) {
    return (row_tile * kSteps + step) * kBlockFloats;
  }
  FLASHMASK_HOST_DEVICE static constexpr int register_offset(int t, int e) { return (t * 4 + e) * 32; }
  FLASHMASK_HOST_DEVICE static constexpr int index(int row_tile, int step, int t, int e, int lane) {
    return block_offset(row_tile, step) + register_offset(t, e) + lane;
  }

  // The conversion pass reads the floats in pairs: pair q (0 .. kFloats / 2)
  // starts at the float of an even register of its lane (128 pairs a 256-float
  // block: lane q % 32, n8 tile q / 64 % 2, e = 2 x (q / 32 % 2)); register
  // e + 1, 32 floats further on, holds the next column of the same row.
  static constexpr int kPairs = kFloats / 2;
  FLASHMASK_HOST_DEVICE static constexpr int pair_start(int q) {
    return q / 128 * kBlockFloats + register_offset(q / 64 % 2, q / 32 % 2 * 2) + q % 32;
  }

  // The inverse: which tile element float i holds. Register e of a lane in
  // an m16n8 accumulator is row lane / 4 (+ 8 for e >= 2), column
  // (lane % 4) x 2 + e % 2 (the PTX ISA's mma.m16n8 C fragment).
  FLASHMASK_HOST_DEVICE static constexpr DQTileElement element(int i) {
    const int lane = i % 32, e = i / 32 % 4, t = i / 128 % 2;
    const int step = i / kBlockFloats % kSteps, row_tile = i / (kBlockFloats * kSteps);
    return {row_tile * 16 + (e / 2) * 8 + lane / 4, step * 16 + t * 8 + (lane % 4) * 2 + e % 2};
  }
};

// The first float of query block m's tile of (batch, head) in dq_accum.
FLASHMASK_HOST_DEVICE int64_t dq_tile_offset(int batch, int head, int m, int num_heads, int seqlen_q,
                                             int head_dim) {
  const int64_t tiles_per_head = bwd_padded_rows(seqlen_q) / kBwdRowBlock;
  return ((int64_t(batch) * num_heads + head) * tiles_per_head + m) * kBwdRowBlock * head_dim;
}

// Compile-time proof that the layout is a bijection of the 64 x kHeadDim
// tile: `element` hits every (row, col) exactly once over the kFloats floats,
// `index` hits every float exactly once over the registers of a tile's m16n16
// blocks, and the float it gives a register holds that register's place in
// the fragment.
template <int kHeadDim>
constexpr bool dq_tile_layout_is_bijection() {
  using Layout = DQTileLayout<kHeadDim>;
  bool seen[Layout::kFloats] = {};
  for (int i = 0; i < Layout::kFloats; ++i) {
    const DQTileElement x = Layout::element(i);
    if (x.row < 0 || x.row >= Layout::kRows || x.col < 0 || x.col >= kHeadDim) return false;
    if (seen[x.row * kHeadDim + x.col]) return false;
    seen[x.row * kHeadDim + x.col] = true;
  }
  bool added[Layout::kFloats] = {};
  for (int row_tile = 0; row_tile < Layout::kRowTiles; ++row_tile)
    for (int step = 0; step < Layout::kSteps; ++step)
      for (int t = 0; t < 2; ++t)
        for (int e = 0; e < 4; ++e)
          for (int lane = 0; lane < 32; ++lane) {
            const int i = Layout::index(row_tile, step, t, e, lane);
            if (i < 0 || i >= Layout::kFloats || added[i]) return false;
            added[i] = true;
            const DQTileElement x = Layout::element(i);
            if (x.row != row_tile * 16 + lane / 4 + (e >= 2 ? 8 : 0) ||
                x.col != step * 16 + t * 8 + (lane % 4) * 2 + (e & 1))
              return false;
          }
  return true;
}
// Compile-time proof of what the conversion pass relies on: the pairs cover
// every float once, each starting on an even column whose neighbour is the
// float 32 further on.
template <int kHeadDim>
constexpr bool dq_tile_pairs_are_neighbours() {
  using Layout = DQTileLayout<kHeadDim>;
  bool seen[Layout::kFloats] = {};
  for (int q = 0; q < Layout::kPairs; ++q) {
    const int i = Layout::pair_start(q);
    if (i < 0 || i + 32 >= Layout::kFloats || seen[i] || seen[i + 32]) return false;
    seen[i] = seen[i + 32] = true;
    const DQTileElement a = Layout::element(i), b = Layout::element(i + 32);
    if (a.col % 2 != 0 || b.row != a.row || b.col != a.col + 1) return false;
  }
  return true;
}
static_assert(dq_tile_pairs_are_neighbours<32>() && dq_tile_pairs_are_neighbours<64>() &&
                  dq_tile_pairs_are_neighbours<96>() && dq_tile_pairs_are_neighbours<128>() &&
                  dq_tile_pairs_are_neighbours<256>(),
              "the tiled dQ layout's pairs are neighbouring columns");
static_assert(dq_tile_layout_is_bijection<32>() && dq_tile_layout_is_bijection<64>() &&
                  dq_tile_layout_is_bijection<96>() && dq_tile_layout_is_bijection<128>() &&
                  dq_tile_layout_is_bijection<256>(),
              "the tiled dQ layout is a bijection of the 64 x head_dim tile");

}  // namespace cuda
}  // namespace flashmask
