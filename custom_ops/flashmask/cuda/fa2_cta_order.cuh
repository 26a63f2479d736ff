// The order in which the FA2-class kernels' CTAs start where a few of them
// are much longer than the rest. The hardware hands a grid's CTAs out in rank
// order (fwd_grid.h, bwd_grid.h), which suits causal and packed masks: the
// forward's heaviest query blocks of every head first, the backward's key
// blocks of one head side by side. A column mask can put its longest CTAs
// last: the 16 global rows of global + sliding window lie in query block 0,
// the forward's last grid row, and the global keys' key block of the last
// head starts when that head's row does, at the end of the backward. On the
// 1M global + window plan on 2 ranks, rank 0's own forward took 78.5 ms
// against rank 1's 55.3 and its own backward 206 against 161 (NOTES.md,
// forty-first session; the Hopper kernels take their long tiles first since,
// sm90/fwd_tile_order.cuh, sm90/bwd_cta_order.cuh).
// Passes before the kernel, where a call can have such CTAs
// (flashmask_launch.cuh, fa2_fwd_cta_order / fa2_bwd_cta_order), each
// parallel over the call: a count pass writes each (mask row, block)'s live
// blocks, estimated from the mask summaries (the forward's key blocks per
// query block from the coarse summaries, O(keys / 2048); the backward's query
// blocks per key block from the key block's merged summary, O(1)) and adds
// the whole call's live blocks into the header; a flag pass counts each chunk of 1024
// ranks' heavy CTAs (more live blocks than sm90::heavy_threshold of the
// call's); a scatter pass places each rank: the heavy ones first, then the
// others, each part in rank order. The kernel launched after them takes rank
// order[u] as CTA u (FwdParams::cta_order). Where no CTA is heavy the order is
// the ranks themselves. One CTA doing the flags and places of every rank
// cost 40-70 us at 32K (2% of a sliding window's forward).
// Workspace: fa2_cta_order (workspace.h), [header, counts, order, chunk counts].
#pragma once

#include <cstdint>

#include "../flashmask_params.h"
#include "../mask_bounds.h"
#include "bwd_grid.h"
#include "fwd_grid.h"
#include "sm90/fwd_tile_order.cuh"  // heavy_threshold, row_representative
#include "sm90/sm90_block_list.cuh"  // query_block_range
#include "workspace.h"

namespace flashmask {
namespace cuda {

// The floor under the heavy threshold, as rows (forward: keys) of a CTA's
// work: no CTA of a call up to 64K keys (forward) or query rows (backward)
// is heavy, so those calls run no pass. The Hopper kernels' floors are 16K
// (kHeavyMinBlocks 128-key blocks, kChainMinSteps 64-row steps); here the
// passes and the ordered launch cost the other column masks at 32K 1.7-2.9%
// of the forward and up to 1.2% of the backward (H200, NOTES.md forty-second
// session), against 20-47% on global + sliding window, so calls up to 64K
// keep the grid's order unless the floor is lowered (the environment
// switches below) and the longer ones, where the global rows' chains weigh
// most and the passes least (a 512K-row part: 0.2-0.8%), take the order.
constexpr int kFa2HeavyMinRows = 65536;
// The most chunks of kFa2OrderChunk ranks (workspace.h) a call may have: each
// scatter CTA reads every chunk's count.
constexpr int kFa2MaxOrderChunks = 4096;

// The header: the whole call's live blocks as a uint64 at the first 8-byte
// boundary among ints 1-3 (the region is 4-byte aligned), zeroed before the
// count pass.
FLASHMASK_HOST_DEVICE unsigned long long* fa2_order_total(int32_t* region) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(region + 1);
  return reinterpret_cast<unsigned long long*>((at + 7) & ~uintptr_t(7));
}
// The counts, [mask rows, blocks], after the header.
FLASHMASK_HOST_DEVICE int32_t* fa2_order_counts(int32_t* region) { return region + kTileOrderHeaderInts; }
// The order, one rank per CTA, after the counts; then each chunk's heavy CTAs.
FLASHMASK_HOST_DEVICE int32_t* fa2_order_ranks(int32_t* region, const FwdParams& p, int blocks) {
  return fa2_order_counts(region) + summary_table_rows(p) * blocks;
}
FLASHMASK_HOST_DEVICE int32_t* fa2_order_chunk_counts(int32_t* ranks, int64_t ctas) { return ranks + ctas; }
FLASHMASK_HOST_DEVICE int64_t fa2_order_chunks(int64_t ctas) { return (ctas + kFa2OrderChunk - 1) / kFa2OrderChunk; }

// The CTAs (ranks) of one (mask row, block) entry: the heads that read the
// mask row (a CTA of head pairs or quads takes two or four of them), and every
// batch where one mask serves the batch.
template <int kHeadsPerCta = 1>
FLASHMASK_HOST_DEVICE int64_t fa2_ranks_per_entry(const FwdParams& p) {
  return int64_t(p.num_heads / p.mask.num_heads / kHeadsPerCta) * (mask_batches(p) == 1 ? p.batch : 1);
}

// The forward's CTAs by rank (of one head, or of head pairs or quads:
// fwd_grid.h), and the live key blocks of each.
template <int kHeadsPerCta = 1>
struct Fa2FwdOrderGrid {
  FwdParams p;
  int query_blocks;
  FLASHMASK_HOST_DEVICE int64_t ctas() const {
    return int64_t(p.batch) * (p.num_heads / kHeadsPerCta) * query_blocks;
  }
  FLASHMASK_HOST_DEVICE int live_blocks(const int32_t* counts, int64_t rank) const {
    const FwdCta cta = fwd_cta_of_rank<kHeadsPerCta>(p, query_blocks, int(rank));
    return counts[mask_summary_row(p, cta.batch, cta.head) * query_blocks + cta.m_block];
  }
};

// The backward's live CTAs by rank, and the live query blocks of each.
struct Fa2BwdOrderGrid {
  BwdParams p;  // bwd_light_last set as the kernel's launch has it
  int key_blocks;
  FLASHMASK_HOST_DEVICE int64_t ctas() const { return bwd_live_ctas(p, key_blocks); }
  FLASHMASK_HOST_DEVICE int live_blocks(const int32_t* counts, int64_t rank) const {
    const BwdCta cta = bwd_cta_of_rank(p, key_blocks, int(rank));
    return counts[mask_summary_row(p, cta.batch, cta.head) * key_blocks + cta.n_block];
  }
};

// Adds `live` entries' blocks times the ranks an entry stands for into the
// call's total (one thread per CTA or warp calls it).
template <int kHeadsPerCta = 1>
__device__ __forceinline__ void fa2_add_to_total(const FwdParams& p, int live, int32_t* region) {
  if (live > 0) {
    atomicAdd(fa2_order_total(region), static_cast<unsigned long long>(live) * fa2_ranks_per_entry<kHeadsPerCta>(p));
  }
}

// The forward's count pass: one warp per (query block, mask row) entry, the
// key blocks in its causal range that lie in coarse summaries (2048 keys,
// cuda::mask_coarse_summaries) showing any of its rows: an upper bound on its
// live key blocks at 2048-key grain, which is all an order needs (a global
// row's query block shows every run, a window's one or two), into counts and
// the total. In place of the Hopper forward's list builder (one CTA per entry
// classifying every key block, its list in shared memory: 1.5M keys at most,
// mask rows in the grid's y extent): as fast at 8K-512K (forty-third
// session), and no limit but the rank's int32.
template <int kThreads, int kBlockM, int kBlockN, int kHeadsPerCta = 1>
__global__ void __launch_bounds__(kThreads) fa2_fwd_count_kernel(FwdParams p, int query_blocks, int32_t* region) {
  static_assert(kCoarseMaskBlockN % kBlockN == 0, "a coarse summary spans whole key blocks");
  constexpr int kBlocksPerRun = kCoarseMaskBlockN / kBlockN;
  const int lane = threadIdx.x % 32;
  const int64_t entry = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t entries = summary_table_rows(p) * query_blocks;
  int live = 0;
  if (entry < entries) {  // uniform over the warp
    const int64_t row = entry / query_blocks;
    const int m_block = int(entry % query_blocks);
    const int2 rep = sm90::row_representative(p, row);
    const int r0 = m_block * kBlockM, r1 = min(r0 + kBlockM, p.seqlen_q);
    int n_end = (p.seqlen_k + kBlockN - 1) / kBlockN;
    if (p.mask.causal) {  // the causal diagonal ends the range early
      const int last_col = r1 - 1 + (p.seqlen_k - p.seqlen_q);
      n_end = last_col < 0 ? 0 : min(n_end, last_col / kBlockN + 1);
    }
    if (!rows_see_no_key(p, rep.x, rep.y, r0, r1)) {
      const int* coarse = row_coarse_summaries(p, rep.x, rep.y);
      const int runs = coarse_summaries_holding(p, n_end * kBlockN);
      for (int c = lane; c < runs; c += 32) {
        if (!encoded_summary_hides_rows(coarse + c * kEncodedBoundsInts, r0, r1)) {
          live += min(n_end, (c + 1) * kBlocksPerRun) - c * kBlocksPerRun;
        }
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) live += __shfl_xor_sync(0xffffffffu, live, offset);
    if (lane == 0) fa2_order_counts(region)[entry] = live;
  }
  // One add a warp (the total is a sum; its order does not matter).
  if (lane == 0) fa2_add_to_total<kHeadsPerCta>(p, live, region);
}

// The backward's count pass: one thread per (key block, mask row) entry, the
// key block's query blocks of kBlockM rows in its causal range less those its
// merged summary hides (query_blocks_not_hidden, mask_bounds.h: an upper bound
// at O(1); the Hopper backward's list builder reads every query block for
// every key block, 0.8 ms on a 512K-row context-parallel part), into counts
// and the total.
template <int kThreads, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(kThreads) fa2_bwd_count_kernel(FwdParams p, int key_blocks, int32_t* region) {
  const int64_t entry = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t entries = summary_table_rows(p) * key_blocks;
  int live = 0;
  if (entry < entries) {
    const int64_t row = entry / key_blocks;
    const int n_block = int(entry % key_blocks);
    const int summaries = summary_blocks(p);
    const BlockBounds* table = reinterpret_cast<const BlockBounds*>(p.block_bounds) + row * summaries;
    BlockBounds merged = empty_block_bounds();
    for (int b = n_block * (kBlockN / kMaskBlockN); b < min(summaries, (n_block + 1) * (kBlockN / kMaskBlockN)); ++b) {
      merged = merge_block_bounds(merged, table[b]);
    }
    const int2 range = sm90::query_block_range<kBlockM, kBlockN>(p, n_block);
    live = query_blocks_not_hidden(merged, range.x, range.y, kBlockM);
    fa2_order_counts(region)[entry] = live;
  }
  // One add a warp (the total is a sum; its order does not matter).
  for (int offset = 16; offset > 0; offset /= 2) live += __shfl_xor_sync(0xffffffffu, live, offset);
  if (threadIdx.x % 32 == 0) fa2_add_to_total(p, live, region);
}

// The flag pass: chunk blockIdx.x's heavy CTAs (kFa2OrderChunk threads, a rank each).
template <typename Grid>
__global__ void __launch_bounds__(kFa2OrderChunk)
    fa2_order_flag_kernel(Grid grid, int32_t* region, int32_t* ranks, int sms, int min_blocks) {
  const int64_t n = grid.ctas();
  const int64_t threshold = sm90::heavy_threshold(int64_t(*fa2_order_total(region)), sms, min_blocks);
  const int64_t r = int64_t(blockIdx.x) * kFa2OrderChunk + threadIdx.x;
  const bool heavy = r < n && grid.live_blocks(fa2_order_counts(region), r) > threshold;
  const int count = __syncthreads_count(heavy);
  if (threadIdx.x == 0) fa2_order_chunk_counts(ranks, n)[blockIdx.x] = count;
}

// The scatter pass: chunk blockIdx.x's ranks to their places (kFa2OrderChunk
// threads, a rank each): the heavy CTAs of the chunks before it and of all
// (each thread sums a few chunk counts), then each heavy rank after the
// chunk's heavy ranks before it, each other rank after all heavy ones and the
// other ranks before it.
template <typename Grid>
__global__ void __launch_bounds__(kFa2OrderChunk)
    fa2_order_scatter_kernel(Grid grid, int32_t* region, int32_t* ranks, int sms, int min_blocks) {
  constexpr int kWarps = kFa2OrderChunk / 32;
  __shared__ int warp_sums[2][kWarps];
  __shared__ int warp_heavy[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = grid.ctas();
  const int chunks = int(fa2_order_chunks(n));
  const int32_t* chunk_counts = fa2_order_chunk_counts(ranks, n);
  int before = 0, all = 0;
  for (int c = threadIdx.x; c < chunks; c += kFa2OrderChunk) {
    const int count = chunk_counts[c];
    all += count;
    before += c < int(blockIdx.x) ? count : 0;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    before += __shfl_xor_sync(0xffffffffu, before, offset);
    all += __shfl_xor_sync(0xffffffffu, all, offset);
  }
  if (lane == 0) warp_sums[0][warp] = before, warp_sums[1][warp] = all;
  const int64_t threshold = sm90::heavy_threshold(int64_t(*fa2_order_total(region)), sms, min_blocks);
  const int64_t r = int64_t(blockIdx.x) * kFa2OrderChunk + threadIdx.x;
  const bool heavy = r < n && grid.live_blocks(fa2_order_counts(region), r) > threshold;
  const unsigned ballot = __ballot_sync(0xffffffffu, heavy);
  if (lane == 0) warp_heavy[warp] = __popc(ballot);
  __syncthreads();
  int64_t heavy_before = __popc(ballot & ((1u << lane) - 1u)), heavy_all = 0;  // heavy ranks before r, and all
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    heavy_before += (w < warp ? warp_heavy[w] : 0) + warp_sums[0][w];
    heavy_all += warp_sums[1][w];
  }
  if (r < n) ranks[heavy ? heavy_before : heavy_all + (r - heavy_before)] = int32_t(r);
}

}  // namespace cuda
}  // namespace flashmask
