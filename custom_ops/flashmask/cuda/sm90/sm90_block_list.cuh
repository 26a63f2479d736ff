// FlashMask classification done ahead of the main loop: for one query block,
// the compact list of key blocks that are not fully masked, each flagged as
// partially masked (elementwise bounds) or unmasked (no mask work). The
// producer loads only the listed blocks and the consumers iterate the same
// list, so a skipped block costs neither a load nor a comparison.
#pragma once

#include <cstdint>

#include "../../flashmask_params.h"
#include "../../mask_bounds.h"
#include "../kernel_traits.h"
#include "../workspace.h"

namespace flashmask {
namespace sm90 {

constexpr int kLivePartialFlag = 0x8000;  // list entry: key block | flag
constexpr int kMaxListedKeyBlocks = 0x7fff;

// Entries reserved per list in shared memory (16-byte multiples).
__host__ __device__ constexpr int live_list_capacity(int blocks) { return (blocks + 7) / 8 * 8; }

__device__ __forceinline__ int live_block_index(uint16_t entry) { return entry & 0x7fff; }
__device__ __forceinline__ bool live_block_partial(uint16_t entry) {
  return (entry & kLivePartialFlag) != 0;
}

// Compacts the blocks i in [begin, end) whose kind_of(i) is not kSkip into
// `list` in ascending order (partial ones flagged), with each of kThreads
// threads (`tid` 0..kThreads-1, whole warps) classifying one block per round.
// `sync()` is a barrier over exactly those threads; `warp_counts` is
// kThreads / 32 ints of shared memory. After a round that found nothing,
// `skip_ahead(i)` (called by all of them) gives the block to go on from, at or
// after i, with no live block from i up to it (the identity by default).
// Returns the number of entries (in every thread); the list is complete when
// it returns.
template <int kThreads, typename KindOf, typename Sync, typename SkipAhead = NoSkipAhead>
__device__ int compact_live_blocks(int tid, int begin, int end, KindOf kind_of, uint16_t* list,
                                   int* warp_counts, Sync sync, SkipAhead skip_ahead = SkipAhead()) {
  static_assert(kThreads % 32 == 0, "whole warps");
  constexpr int kWarps = kThreads / 32;
  const int lane = tid % 32;
  const int warp = tid / 32;
  int total = 0;
  for (int base = begin; base < end; base += kThreads) {
    const int i = base + tid;
    const TileKind kind = i < end ? kind_of(i) : TileKind::kSkip;
    const unsigned live = __ballot_sync(0xffffffffu, kind != TileKind::kSkip);
    if (lane == 0) warp_counts[warp] = __popc(live);
    sync();
    int before = 0, round = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int c = warp_counts[w];
      before += w < warp ? c : 0;
      round += c;
    }
    if (kind != TileKind::kSkip) {
      list[total + before + __popc(live & ((1u << lane) - 1u))] =
          uint16_t(i | (kind == TileKind::kPartial ? kLivePartialFlag : 0));
    }
    total += round;
    sync();  // warp_counts is rewritten next round; the list is complete
    if (round == 0 && base + kThreads < end) base = skip_ahead(base + kThreads) - kThreads;
  }
  return total;
}

// The first of the coarse summaries [begin, end) (encoded, from `coarse`) that
// does not hide rows [r0, r1) from all its columns (end if none), with
// kThreads threads reading one each a round. Same threads, barrier and scratch
// as compact_live_blocks, and free again when it returns.
template <int kThreads, typename Sync>
__device__ int first_coarse_summary_showing_rows(const int* coarse, int begin, int end, int r0, int r1, int tid,
                                                 int* warp_counts, Sync sync) {
  constexpr int kWarps = kThreads / 32;
  for (int base = begin; base < end; base += kThreads) {
    const int c = base + tid;
    const bool shows = c < end && !cuda::encoded_summary_hides_rows(coarse + c * kEncodedBoundsInts, r0, r1);
    const unsigned found = __ballot_sync(0xffffffffu, shows);
    if (tid % 32 == 0) warp_counts[tid / 32] = found != 0 ? base + tid + __ffs(found) - 1 : end;
    sync();
    int first = end;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) first = min(first, warp_counts[w]);
    sync();  // warp_counts is rewritten next round or by the caller
    if (first < end) return first;
  }
  return end;
}

// The head's row of 64-column block summaries (null without a column mask).
__device__ __forceinline__ const BlockBounds* summary_row(const FwdParams& p, int batch, int head) {
  if (p.mask.startend_row_indices == nullptr) return nullptr;
  return reinterpret_cast<const BlockBounds*>(p.block_bounds) +
         mask_summary_row(p, batch, head) * cuda::summary_blocks(p);
}

// Tile (m, n): skipped, unmasked or partial (mask_bounds.h), from the
// 64-column summaries of its key columns one at a time (classify_tile_parts).
template <int kBlockM, int kBlockN>
__device__ __forceinline__ TileKind classify_block(const FwdParams& p, const BlockBounds* summary,
                                                   int batch, int head, int m, int n) {
  static_assert(kBlockMaskSize % kBlockM == 0 && kBlockMaskSize % kBlockN == 0,
                "a tile lies inside one block_mask block");
  static_assert(kBlockN % cuda::kMaskBlockN == 0, "key tile spans whole summary blocks");
  if (!block_kept(p, batch, head, m * kBlockM, n * kBlockN)) return TileKind::kSkip;
  const int r0 = m * kBlockM, r1 = min(r0 + kBlockM, p.seqlen_q);
  if (summary == nullptr) {
    return classify_tile(false, empty_block_bounds(), p.mask.causal, p.seqlen_q, p.seqlen_k, r0, r1,
                         n * kBlockN, n * kBlockN + kBlockN);
  }
  constexpr int kParts = kBlockN / cuda::kMaskBlockN;
  return classify_tile_parts<kParts>(summary + n * kParts, cuda::kMaskBlockN, p.mask.causal, p.seqlen_q,
                                     p.seqlen_k, r0, r1, n * kBlockN);
}

// Forward: the key blocks query block m_block attends to (kThreads threads,
// see compact_live_blocks).
template <int kThreads, int kBlockM, int kBlockN, typename Sync>
__device__ int build_live_key_blocks(const FwdParams& p, int batch, int head, int m_block,
                                     uint16_t* list, int* warp_counts, int tid, Sync sync) {
  const int n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  int n_end = n_blocks;
  if (p.mask.causal) {  // the causal diagonal ends the range early
    const int r1 = min(m_block * kBlockM + kBlockM, p.seqlen_q);
    const int last_col = r1 - 1 + (p.seqlen_k - p.seqlen_q);
    n_end = last_col < 0 ? 0 : min(n_blocks, last_col / kBlockN + 1);
  }
  const BlockBounds* summary = summary_row(p, batch, head);
  auto kind_of = [&](int n) { return classify_block<kBlockM, kBlockN>(p, summary, batch, head, m_block, n); };
  if (summary == nullptr) return compact_live_blocks<kThreads>(tid, 0, n_end, kind_of, list, warp_counts, sync);
  const int r0 = m_block * kBlockM, r1 = min(r0 + kBlockM, p.seqlen_q);
  // A query block no column shows builds no list (cuda::rows_see_no_key).
  if (cuda::rows_see_no_key(p, batch, head, r0, r1)) return 0;
  // After a round of key blocks that were all skipped, the coarse summaries
  // find the next run of keys that any column shows: the key block holding its
  // first column is where classifying goes on (the blocks passed lie inside
  // coarse summaries whose every column hides these rows).
  auto skip_ahead = [&](int n) {
    const int* coarse = cuda::row_coarse_summaries(p, batch, head);
    const int c_end = cuda::coarse_summaries_holding(p, n_end * kBlockN);
    const int c = first_coarse_summary_showing_rows<kThreads>(coarse, n * kBlockN / cuda::kCoarseMaskBlockN, c_end,
                                                              r0, r1, tid, warp_counts, sync);
    return c >= c_end ? n_end : max(n, c * cuda::kCoarseMaskBlockN / kBlockN);
  };
  return compact_live_blocks<kThreads>(tid, 0, n_end, kind_of, list, warp_counts, sync, skip_ahead);
}

// Forward of a call with no mask at all (not causal, no column or block
// mask; FwdTraits::kWideKeys): every key block, the ragged last one flagged
// partial (its columns past the end are masked). No summaries, so no
// alignment of kBlockN to them. Same contract as build_live_key_blocks.
template <int kThreads, int kBlockN, typename Sync>
__device__ int build_all_key_blocks(const FwdParams& p, uint16_t* list, int tid, Sync sync) {
  const int n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  const bool ragged = p.seqlen_k % kBlockN != 0;
  for (int n = tid; n < n_blocks; n += kThreads) {
    list[n] = uint16_t(n | (ragged && n == n_blocks - 1 ? kLivePartialFlag : 0));
  }
  sync();  // the list is complete
  return n_blocks;
}

// Backward: the query blocks [first, end) that may see key block n_block
// (causal: rows before the diagonal see none of its keys).
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int2 query_block_range(const FwdParams& p, int n_block) {
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  int m_begin = 0;
  if (p.mask.causal) {
    const int first_row = n_block * kBlockN - (p.seqlen_k - p.seqlen_q);
    m_begin = first_row <= 0 ? 0 : min(m_blocks, first_row / kBlockM);
  }
  return make_int2(m_begin, m_blocks);
}

// Backward: the query blocks that see key block n_block (all threads of the CTA).
template <int kThreads, int kBlockM, int kBlockN>
__device__ int build_live_query_blocks(const FwdParams& p, int batch, int head, int n_block,
                                       uint16_t* list, int* warp_counts) {
  const int2 range = query_block_range<kBlockM, kBlockN>(p, n_block);
  const BlockBounds* summary = summary_row(p, batch, head);
  return compact_live_blocks<kThreads>(
      threadIdx.x, range.x, range.y,
      [&](int m) { return classify_block<kBlockM, kBlockN>(p, summary, batch, head, m, n_block); }, list,
      warp_counts, [] { __syncthreads(); });
}

}  // namespace sm90
}  // namespace flashmask
