// Shared-memory staging used by both kernels: async tile loads with zero fill
// for rows past the sequence end, and the per-column mask bounds.
#pragma once

#include "../mask_bounds.h"
#include "dq_tile_layout.h"
#include "mma_utils.cuh"

namespace flashmask {
namespace cuda {

// Copies rows [0, kRows) of a [*, kDim] matrix (row stride `stride`
// elements) into a swizzled tile; rows >= rows_valid become zeros, and so do
// columns >= cols_valid (a multiple of 8: a head dim run on a wider kernel's
// tiles, kernel_traits.h's tile_head_dim).
template <int kRows, int kDim, int kThreads, bool kPaddedCols = false, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t stride,
                                                int rows_valid, int tid, int cols_valid = kDim) {
  constexpr int kChunks = kDim / 8;
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = (i % kChunks) * 8;
    if constexpr (kPaddedCols) {
      const bool valid = r < rows_valid && c < cols_valid;
      // Point at the tile's first element when copying zero bytes.
      cp_async_16(smem + SwizzledTile<kDim>::offset(r, c), valid ? gmem + int64_t(r) * stride + c : gmem, valid);
    } else {
      const bool valid = r < rows_valid;
      // Point at a valid row even when copying zero bytes.
      const T* src = gmem + int64_t(valid ? r : 0) * stride + c;
      cp_async_16(smem + SwizzledTile<kDim>::offset(r, c), src, valid);
    }
  }
}

// The same with the thread's copies unrolled, so that each is the first
// one's address plus immediates (the strided loop above compiled to a real
// loop around every copy, with a division per copy where a row is not a
// power of two chunks):
// - kThreads a multiple of the row's chunks: whole rows per pass, each pass
//   kThreads / kChunks rows down (an immediate in shared memory, one add in
//   global memory);
// - rows of 4-chunk swizzle groups (head dim 96: 12 chunks, which 128 or 256
//   threads do not divide): chunk tid % 4 of each group of rows tid / 4 +
//   kThreads / 4 x pass; the swizzle repeats every 4 chunks and every 8 rows
//   (SwizzledTile::phases_hold), so the groups are +64 bytes and the passes
//   +kThreads / 4 rows.
// Other shapes keep the loop. kPaddedCols (a head dim run on a wider
// kernel's tiles): columns >= cols_valid become zeros, in the stepped form.
//
// In the first form the thread takes its first source address once and steps
// it by a fixed pass stride, a 64-bit add a copy, where the per-row form costs
// a select, a sign extension and a 64-bit multiply-add of the row index (about
// 12 integer instructions a copy; a sixth of the forward's instructions at
// 16K, which ran 14% more instructions than FlashAttention-2's in Nsight
// Compute; NOTES.md, twentieth session). Rows past rows_valid copy zero bytes
// from the first row.
// - kWholeTileFast: whole tiles (rows_valid >= kRows: all but a ragged last
//   block) branch to a form with no validity test at all. The forward's K/V
//   copies take it (+1-3%); around the backward's Q/dO copies the branch cost
//   1-2%, so those run the stepped form for every tile.
template <int kRows, int kDim, int kThreads, bool kWholeTileFast = false, bool kPaddedCols = false, typename T>
__device__ __forceinline__ void copy_tile_async(T* smem, const T* gmem, int64_t stride, int rows_valid, int tid,
                                                int cols_valid = kDim) {
  using Tile = SwizzledTile<kDim>;
  constexpr int kChunks = kDim / 8;
  if constexpr (!kPaddedCols && kThreads % kChunks == 0 && kRows % (kThreads / kChunks) == 0) {
    constexpr int kRowsPerPass = kThreads / kChunks;
    // Where a pass is a whole number of swizzle periods (8 rows) down, each pass's shared-memory
    // address is the first one's plus an immediate (SwizzledTile::phases_hold); computed per
    // row, the swizzle cost 4-5 integer instructions a copy. tid is never negative: unsigned
    // division, no sign fix-up.
    const int r0 = int(unsigned(tid) / kChunks), c = int(unsigned(tid) % kChunks) * 8;
    T* const first_dst = smem + Tile::offset(r0, c);
    auto dst = [&](int pass) {
      if constexpr (kRowsPerPass % 8 == 0) return first_dst + pass * kRowsPerPass * kDim;
      else return smem + Tile::offset(r0 + pass * kRowsPerPass, c);
    };
    if constexpr (kWholeTileFast) {
      if (rows_valid >= kRows) {
        const T* src = gmem + int64_t(r0) * stride + c;
        const int64_t pass_stride = int64_t(kRowsPerPass) * stride;
#pragma unroll
        for (int pass = 0; pass < kRows / kRowsPerPass; ++pass, src += pass_stride) {
          cp_async_16(dst(pass), src, true);
        }
        return;
      }
    }
    // Stepped, with a row past rows_valid copying zero bytes from the first
    // row (a 64-bit select, no branch).
    const T* const first_src = gmem + int64_t(r0) * stride + c;
    const T* src = first_src;
    const int64_t pass_stride = int64_t(kRowsPerPass) * stride;
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass, src += pass_stride) {
      const int r = r0 + pass * kRowsPerPass;
      const bool valid = r < rows_valid;
      // Point at a valid row even when copying zero bytes.
      cp_async_16(dst(pass), valid ? src : first_src, valid);
    }
  } else if constexpr (kChunks % 4 == 0 && kThreads % 32 == 0 && kRows % (kThreads / 4) == 0) {
    constexpr int kRowsPerPass = kThreads / 4;  // a multiple of 8: the swizzle's period in rows
    const int r0 = tid / 4, c0 = (tid % 4) * 8;
    T* const first = smem + Tile::offset(r0, c0);
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
      const int r = r0 + pass * kRowsPerPass;
      const bool valid = r < rows_valid;
      const T* src = gmem + int64_t(valid ? r : 0) * stride + c0;
#pragma unroll
      for (int g = 0; g < kChunks / 4; ++g) {
        // A padded column copies zero bytes from the row's first chunk.
        const bool col_valid = !kPaddedCols || c0 + g * 32 < cols_valid;
        cp_async_16(first + pass * kRowsPerPass * kDim + g * 32, col_valid ? src + g * 32 : src,
                    valid && col_valid);
      }
    }
  } else {
    load_tile_async<kRows, kDim, kThreads, kPaddedCols>(smem, gmem, stride, rows_valid, tid, cols_valid);
  }
}

// The bounds of key columns [c0, c0 + kCols), for partially masked tiles.
// Columns past seqlen_k get an empty mask (the kernels mask them separately).
template <int kCols>
__device__ __forceinline__ void stage_column_bounds(ColumnBounds* smem, const int32_t* columns,
                                                    const MaskParams& mask, int c0, int seqlen_q,
                                                    int seqlen_k, int tid) {
  if (tid < kCols) {
    const int col = c0 + tid;
    smem[tid] = col < seqlen_k ? load_column_bounds(columns + int64_t(col) * mask.col_stride,
                                                    mask.num_cols, mask.causal, seqlen_q)
                               : ColumnBounds{0, 0, 0, 0};
  }
}

// True when query row `row` may not see key column `col` of a partial tile.
__device__ __forceinline__ bool element_masked(const ColumnBounds* bounds, bool has_columns,
                                               bool causal, int causal_offset, int seqlen_k,
                                               int row, int col, int c0) {
  if (col >= seqlen_k) return true;
  if (causal && col > row + causal_offset) return true;
  return has_columns && row_masked(bounds[col - c0], row);
}

// The kernels' walk over their live blocks (key blocks of a query block in
// the forward, query blocks of a key block in the backward): next() returns
// the first live block at or after `from` (`end` if none) and its kind. Each
// warp classifies 32 blocks at once, one per lane (one round of summary loads
// instead of one dependent load per skipped block), and keeps the window's
// live and partial bits for the following calls; every lane of the warp
// holds the same answer. After a window of 32 that holds no live block,
// `skip_ahead(i)` (called by the whole warp) gives the block to go on from, at
// or after i: no block from i up to it is live (the identity by default).
struct LiveBlockScan {
  int base = -64;
  unsigned live = 0, partial = 0;
  template <typename Classify, typename SkipAhead = NoSkipAhead>
  __device__ __forceinline__ int next(int from, int end, int lane, const Classify& classify, TileKind& kind,
                                      const SkipAhead& skip_ahead = SkipAhead()) {
    for (;;) {
      if (from >= end) return end;
      if (from >= base + 32) {
        base = from;
        const TileKind lane_kind = from + lane < end ? classify(from + lane) : TileKind::kSkip;
        live = __ballot_sync(0xffffffffu, lane_kind != TileKind::kSkip);
        partial = __ballot_sync(0xffffffffu, lane_kind == TileKind::kPartial);
        if (live == 0 && base + 32 < end) {
          from = skip_ahead(base + 32);
          continue;
        }
      }
      const unsigned ahead = live & (0xffffffffu << (from - base));
      if (ahead != 0) {
        const int bit = __ffs(ahead) - 1;
        kind = (partial >> bit) & 1u ? TileKind::kPartial : TileKind::kFull;
        return base + bit;
      }
      from = base + 32;
    }
  }
};

// A query step's row statistics, kBlockM LSE then kBlockM delta floats, from
// row_stats (`lse` at the step's first row, `delta` the same rows in the
// delta plane) into shared memory: one 16-byte cp.async each for the first
// kBlockM / 2 threads. Rows from `rows_valid` on (past the (batch, head)'s
// padded rows, which end on a whole 64-row block: only a 128-row step's
// second block) are zero-filled, not read.
template <int kBlockM>
__device__ __forceinline__ void load_row_stats_async(float* smem, const float* lse, const float* delta,
                                                     int rows_valid, int tid) {
  constexpr int kChunks = kBlockM / 4;  // 16-byte chunks per statistic
  if (tid < 2 * kChunks) {
    const int c = (tid % kChunks) * 4;
    const bool valid = c < rows_valid;
    cp_async_16(smem + (tid / kChunks) * kBlockM + c, (tid < kChunks ? lse : delta) + (valid ? c : 0), valid);
  }
}

// Adds a warp's m16n16 block (row_tile, step) of dQ, two m16n8 accumulators,
// to its query block's tile at DQTileLayout::index: each register is one RED
// over 32 consecutive floats, all 8 from one address.
template <int kDim>
__device__ __forceinline__ void add_dq_block(float* tile, const float (*acc)[4], int row_tile, int step,
                                             int lane) {
  using Layout = DQTileLayout<kDim>;
  float* block = tile + Layout::block_offset(row_tile, step) + lane;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) atomicAdd(block + Layout::register_offset(t, e), acc[t][e]);
}

}  // namespace cuda
}  // namespace flashmask
