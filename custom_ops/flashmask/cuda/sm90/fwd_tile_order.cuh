// The order in which the persistent sm90 forward takes its tiles where some
// are much longer than the rest. fwd_tile_of hands tiles out group by group,
// each group's query blocks in reverse, which starts the heaviest query
// blocks of causal masks first. A column mask can put its longest rows
// anywhere: the 16 global rows of global + sliding window lie in query block
// 0, the last tile of each group, so the last group's visit of every key
// block ran alone at the end of the kernel (a 512K-row context-parallel part:
// 47 ms against 32 on the rank without those rows).
// Heavy tiles (more live key blocks than heavy_threshold) go first, then the
// others in fwd_tile_of's order. Two passes before the forward, where the
// call can have such tiles (fwd_heavy_first): fwd_tile_count_kernel counts
// each (mask row, query block)'s live key blocks with the forward's own list
// builder, and fwd_heavy_select_kernel lists the heavy tiles. The forward's
// list builders then draw tile u of that order (fwd_draw_tile): the u-th heavy
// tile, else the next tile of fwd_tile_of's order that is not heavy.
// Workspace (cuda::fwd_tile_order): [heavy tiles, threshold, 2 spare], the
// counts [mask rows, query blocks], the heavy tiles' indices.
#pragma once

#include <cstdint>

#include "../../flashmask_params.h"
#include "../../mask_bounds.h"
#include "../workspace.h"
#include "sm90_block_list.cuh"

namespace flashmask {
namespace sm90 {

struct FwdTile {
  int m_block, head, batch;
};

// Tile t: `heads_together` query heads of one GQA group fastest, then query
// blocks in reverse, then head groups and batch. The heads of a group read the
// same K/V blocks, so tiles handed out side by side fetch each block from HBM
// once; query blocks next, so the CTAs running at once share one head's K/V in
// L2 (which covers it only at short lengths or where neighbouring query blocks
// see the same key blocks), and in reverse, so the heaviest blocks under
// causal masks start first (handed out in order, the light ones fill the gaps
// at the end).
__device__ __forceinline__ FwdTile fwd_tile_of(int t, int query_blocks, int num_heads, int heads_together) {
  const int head_in_group = t % heads_together;
  const int rest = t / heads_together;
  const int m = rest % query_blocks;
  const int groups = num_heads / heads_together;
  const int group_batch = rest / query_blocks;
  return FwdTile{query_blocks - 1 - m, (group_batch % groups) * heads_together + head_in_group,
                 group_batch / groups};
}

constexpr int kTileOrderHeader = cuda::kTileOrderHeaderInts;  // ints before the counts

// The order's counts, [mask rows, query blocks], and its heavy tiles' indices after them.
template <typename Int>
__device__ __forceinline__ Int* tile_counts(Int* order) {
  return order + kTileOrderHeader;
}
template <typename Int>
__device__ __forceinline__ Int* heavy_tiles(Int* order, const FwdParams& p, int query_blocks) {
  return order + kTileOrderHeader + cuda::summary_table_rows(p) * query_blocks;
}

// A tile is heavy past this share of the live key blocks an SM takes over the
// whole call (total / sms), and never at or below kHeavyMinBlocks (128 key
// blocks, 16K keys: no tile of a shorter call is heavy, so short calls run no
// pass; causal and packed masks, whose longest tiles are a small share of an
// SM's work, keep fwd_tile_of's order). PADDLE_FLASHMASK_SM90_FWD_HEAVY_MIN_BLOCKS
// sets that floor (tests lower it to order short calls this way).
constexpr int kHeavyMinBlocks = 128;
constexpr int kHeavyShare = 16;
FLASHMASK_HOST_DEVICE int64_t heavy_threshold(int64_t total_blocks, int sms, int min_blocks) {
  const int64_t share = total_blocks / (int64_t(sms) * kHeavyShare);
  return share > min_blocks ? share : int64_t(min_blocks);
}

// Tile (m_block, head, batch)'s index in fwd_tile_of's order (its inverse).
__device__ __forceinline__ int fwd_tile_index(int m_block, int head, int batch, int query_blocks, int num_heads,
                                              int heads_together) {
  const int groups = num_heads / heads_together;
  const int group_batch = batch * groups + head / heads_together;
  return (group_batch * query_blocks + (query_blocks - 1 - m_block)) * heads_together + head % heads_together;
}

// A (batch, head) that reads mask row `row` (mask_summary_row's inverse: the
// first head of the mask head, the mask batch's own batch).
__device__ __forceinline__ int2 row_representative(const FwdParams& p, int64_t row) {
  const int batch = int(row / p.mask.num_heads), mask_head = int(row % p.mask.num_heads);
  return make_int2(batch, mask_head * (p.num_heads / p.mask.num_heads));
}

// One CTA of kThreads (the forward's list builders' count) per (query block,
// mask row): its live key blocks, as the forward lists them.
template <int kThreads, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(kThreads)
    fwd_tile_count_kernel(FwdParams p, int query_blocks, int32_t* order) {
  extern __shared__ uint16_t scratch_list[];
  __shared__ int warp_counts[kThreads / 32];
  const int m_block = blockIdx.x;
  const int64_t row = blockIdx.y;
  const int2 rep = row_representative(p, row);
  const int live = build_live_key_blocks<kThreads, kBlockM, kBlockN>(
      p, rep.x, rep.y, m_block, scratch_list, warp_counts, threadIdx.x, [] { __syncthreads(); });
  if (threadIdx.x == 0) tile_counts(order)[row * query_blocks + m_block] = live;
}

// One CTA: the threshold, then the heavy tiles (every (batch, head) of a heavy
// (mask row, query block)), the entries in (mask row, query block) order, not
// sorted by their counts, chunk by chunk with a CTA-wide prefix of the tiles
// each entry brings.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    fwd_heavy_select_kernel(FwdParams p, int query_blocks, int heads_together, int sms, int min_blocks,
                            int32_t* order) {
  constexpr int kWarps = kThreads / 32;
  __shared__ int64_t warp_sums[kWarps];
  __shared__ int warp_tiles[kWarps];
  __shared__ int listed;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t entries = cuda::summary_table_rows(p) * query_blocks;
  const int32_t* counts = tile_counts(order);
  int32_t* heavy = heavy_tiles(order, p, query_blocks);
  // (batch, head) pairs per mask row: its heads, and every batch where the
  // mask is shared by the batch.
  const int heads_per_row = p.num_heads / p.mask.num_heads;
  const int batches_per_row = mask_batches(p) == 1 ? p.batch : 1;
  int64_t sum = 0;
  for (int64_t e = threadIdx.x; e < entries; e += kThreads) sum += counts[e];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) warp_sums[warp] = sum;
  if (threadIdx.x == 0) listed = 0;
  __syncthreads();
  int64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  const int64_t threshold = heavy_threshold(total * heads_per_row * batches_per_row, sms, min_blocks);
  const int per_entry = heads_per_row * batches_per_row;
  for (int64_t base = 0; base < entries; base += kThreads) {
    const int64_t e = base + threadIdx.x;
    const bool is_heavy = e < entries && counts[e] > threshold;
    const unsigned ballot = __ballot_sync(0xffffffffu, is_heavy);
    if (lane == 0) warp_tiles[warp] = __popc(ballot);
    __syncthreads();
    int before = listed;
    for (int w = 0; w < warp; ++w) before += warp_tiles[w];
    before += __popc(ballot & ((1u << lane) - 1u));
    if (is_heavy) {
      const int64_t row = e / query_blocks;
      const int m_block = int(e % query_blocks);
      const int2 rep = row_representative(p, row);
      for (int i = 0; i < per_entry; ++i) {
        const int head = rep.y + i % heads_per_row;
        const int batch = batches_per_row == 1 ? rep.x : i / heads_per_row;
        heavy[int64_t(before) * per_entry + i] =
            fwd_tile_index(m_block, head, batch, query_blocks, p.num_heads, heads_together);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < kWarps; ++w) listed += warp_tiles[w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    order[0] = listed * per_entry;
    order[1] = int(threshold < INT32_MAX ? threshold : INT32_MAX);
  }
}

// Tile u of the order (u counts draws: the first wave's CTA indices, then the
// tile counter past them): the u-th heavy tile, else fwd_tile_of's next tile
// that is not heavy, drawing again past heavy ones; num_tiles or more when
// none is left. One thread.
template <typename Draw>
__device__ int fwd_draw_tile(const FwdParams& p, const int32_t* order, int num_heavy, int threshold,
                             int query_blocks, int heads_together, int num_tiles, int u, Draw draw_again) {
  if (num_heavy == 0) return u;  // fwd_tile_of's order, no tile to pass over
  const int32_t* counts = tile_counts(order);
  for (;;) {
    if (u < num_heavy) return heavy_tiles(order, p, query_blocks)[u];
    const int t = u - num_heavy;
    if (t >= num_tiles) return t;
    const FwdTile tile = fwd_tile_of(t, query_blocks, p.num_heads, heads_together);
    if (counts[mask_summary_row(p, tile.batch, tile.head) * query_blocks + tile.m_block] <= threshold) return t;
    u = draw_again();
  }
}

}  // namespace sm90
}  // namespace flashmask
