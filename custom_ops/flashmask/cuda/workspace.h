// Layout of the int32 workspace the caller allocates for a CUDA call
// (block_bounds_elems, FwdParams::block_bounds): the mask's 64-column block
// summaries, then the persistent kernels' tile counters, which each launch
// that uses them zeroes on its stream first, then the sm90 backward's
// per-key-block dK/dV flags (dkv_written_flags), then its per-key-block head
// counts (fitted_head_counts), then its CTA order (bwd_cta_order), then the
// counters of its overlapped finish (bwd_finish_counters), then the sm90
// forward's tile order (fwd_tile_order). Also the
// padding of the sm90 backward's row statistics (BwdParams::row_stats).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../flashmask_params.h"
#include "../mask_bounds.h"
#include "kernel_traits.h"

namespace flashmask {
namespace cuda {

constexpr int kTileCounterInts = 4;  // 16 bytes, after the summaries

// Query rows of each (batch, head) in the sm90 backward's row_stats and tiled
// dq_accum: seqlen_q rounded up to whole 64-row blocks (the kernel's step), so
// every step's rows are one aligned bulk copy (256 bytes of row statistics,
// one dQ tile).
constexpr int kBwdRowBlock = 64;
FLASHMASK_HOST_DEVICE int64_t bwd_padded_rows(int seqlen_q) {
  return (int64_t(seqlen_q) + kBwdRowBlock - 1) / kBwdRowBlock * kBwdRowBlock;
}

// int32 elements of the block summaries (0 without a column mask): the
// [mask batches, Hm, 64-column blocks] BlockBounds table, then one aggregate a
// (mask batch, mask head) row over all its columns (mask_row_aggregates), then
// the row's coarse summaries (mask_coarse_summaries).
int64_t summary_elems(const FwdParams& p);
// The tile counters inside p.block_bounds.
int32_t* tile_counters(const FwdParams& p);

// The summary tables' rows, one per (mask batch, mask head) (mask_summary_row);
// a row's 64-column summaries, and its coarse summaries (kCoarseSummaryBlocks
// of them merged, the last one of a row over what is left).
FLASHMASK_HOST_DEVICE int64_t summary_table_rows(const FwdParams& p) {
  return int64_t(mask_batches(p)) * p.mask.num_heads;
}
FLASHMASK_HOST_DEVICE int summary_blocks(const FwdParams& p) { return (p.seqlen_k + kMaskBlockN - 1) / kMaskBlockN; }
FLASHMASK_HOST_DEVICE int coarse_summaries(const FwdParams& p) {
  return summary_groups_per_row(summary_blocks(p), kCoarseSummaryBlocks);
}

// The summaries' per-row aggregates (encode_block_bounds form), one per
// (mask batch, mask head) row, after the block table; compute_block_bounds
// fills them beside the blocks. A query block that the aggregate of its row
// classifies kSkip sees no key at all (a union's summary only widens, so it
// skips no tile its parts would keep): both forwards then scan no key block
// (rows_see_no_key), where reading every key block's summary cost the Hopper
// forward ~35 us a dead tile at 512K keys.
FLASHMASK_HOST_DEVICE int32_t* mask_row_aggregates(const FwdParams& p) {
  return p.block_bounds + summary_table_rows(p) * summary_blocks(p) * int64_t(sizeof(BlockBounds) / 4);
}

// The coarse summaries, [mask rows, coarse_summaries(p)] in the same encoded
// form, after the row aggregates; compute_block_bounds fills them too. Where
// every column of one hides a query block's rows, so does every column of each
// key block inside it: both forwards pass such runs of keys in one read
// (sm90::build_live_key_blocks, the FA2-class forward's LiveBlockScan step). That is what a row aggregate
// cannot see when each column hides the rows by one of its two intervals but
// not all by the same one (a context-parallel part of global + sliding window).
FLASHMASK_HOST_DEVICE int32_t* mask_coarse_summaries(const FwdParams& p) {
  return mask_row_aggregates(p) + summary_table_rows(p) * kEncodedBoundsInts;
}

// The (batch, head) row's coarse summaries, and how many of them hold keys
// [0, keys): what both forwards' scans read after key blocks that listed
// nothing.
FLASHMASK_HOST_DEVICE const int* row_coarse_summaries(const FwdParams& p, int batch, int head) {
  return mask_coarse_summaries(p) + mask_summary_row(p, batch, head) * coarse_summaries(p) * kEncodedBoundsInts;
}
FLASHMASK_HOST_DEVICE int coarse_summaries_holding(const FwdParams& p, int keys) {
  return std::min(coarse_summaries(p), (keys + kCoarseMaskBlockN - 1) / kCoarseMaskBlockN);
}

// Whether the encoded summary `e` (a row aggregate or a coarse summary) hides
// rows [r0, r1) from every one of its columns. Reads only the four fields that
// decide it (the list builders run on few registers).
FLASHMASK_HOST_DEVICE bool encoded_summary_hides_rows(const int* e, int r0, int r1) {
  // decode_block_bounds' lts_max, lte_min, uts_max, ute_min
  return intervals_cover_rows(-e[1], e[2], -e[5], e[6], r0, r1);
}

// Whether the column mask hides every key from query rows [r0, r1) of the
// (batch, head) row, read from its aggregate: one summary instead of one per
// key block, which is what a block of rows that no column shows (context-
// parallel parts, padding) would otherwise cost at every tile. Needs a column
// mask (p.mask.startend_row_indices set).
FLASHMASK_HOST_DEVICE bool rows_see_no_key(const FwdParams& p, int batch, int head, int r0, int r1) {
  return encoded_summary_hides_rows(
      mask_row_aggregates(p) + mask_summary_row(p, batch, head) * kEncodedBoundsInts, r0, r1);
}

// Keys per flag of dkv_written_flags: the sm90 backward's key block at this
// head dim (BwdTraits::kBlockN: 128, or 64 past head dim 128).
FLASHMASK_HOST_DEVICE int dkv_block(int head_dim) { return head_dim > 128 ? 64 : 128; }
int64_t dkv_flag_elems(const FwdParams& p);
// Under fitted head grouping (BwdParams::fitted_head_groups), where a key
// block's CTA covers its whole GQA group it writes dK/dV straight to dk/dv and
// flags it here, [batch, num_heads_k, ceil(seqlen_k / dkv_block)] int32 (1 =
// written, 0 = left in dk_accum/dv_accum), so bwd_finish converts only the
// others. Every flag is rewritten by each backward. Null without that plan.
int32_t* dkv_written_flags(const BwdParams& p);

// Under fitted head grouping, the query heads that each key block's CTAs
// cover (fitted_head_count of its live query blocks), [batch, num_heads /
// bwd_head_group, ceil(seqlen_k / dkv_block)] int32, written by the sm90
// backward's count pass right before it, so that the CTAs that do not lead a
// sub-group leave at once. Sized for one head per group (the most groups).
// Null without that plan.
int64_t fitted_count_elems(const FwdParams& p);
int32_t* fitted_head_counts(const BwdParams& p);

// Under fitted head grouping, the order in which the sm90 backward's CTAs
// take its grid slots (sm90/bwd_cta_order.cuh), fitted_count_elems int32
// (the grid's slots), then each key block's live query blocks from the count
// pass, indexed as fitted_head_counts. Both rewritten by each backward. Null
// without that plan.
int64_t cta_order_elems(const FwdParams& p);
int32_t* bwd_cta_order(const BwdParams& p);
int32_t* bwd_live_block_counts(const BwdParams& p);

// The sm90 backward's finish (sm90::bwd_finish_kernel) runs beside the main
// kernel's last CTAs: per (batch, kv head) how many query heads x key blocks
// the main kernel has completed, then the finish's next work item. Zeroed by
// the launch; batch * num_heads_k + 1 int32 after the CTA order.
int64_t finish_counter_elems(const FwdParams& p);
int32_t* bwd_finish_counters(const BwdParams& p);

// The sm90 forward's tile order (sm90/fwd_tile_order.cuh), after the finish
// counters, where the call has a column mask: kTileOrderHeaderInts (the heavy
// tiles' number, the threshold), each (mask row, 64-row query block)'s live
// key blocks, then the heavy tiles' indices (at most every tile of 64-row
// blocks: the forward's blocks are at least that). Rewritten by each forward
// that uses it (fwd_heavy_first). Null without a column mask.
// Sized for 64-row or 64-key blocks of the longer side, and a chunk count per
// kFa2OrderChunk ranks, so that the FA2-class kernels' CTA orders
// (fa2_cta_order) fit in the same ints.
constexpr int kTileOrderHeaderInts = 4;
int64_t fwd_tile_order_elems(const FwdParams& p);
int32_t* fwd_tile_order(const FwdParams& p);

// The FA2-class forward's or backward's CTA order (fa2_cta_order.cuh), in the
// same ints as fwd_tile_order (a call runs one family's forward, and each
// backward its own workspace): kTileOrderHeaderInts, each (mask row, block)'s
// live blocks ([mask rows, blocks]: a forward's query blocks, a backward's key
// blocks), the order, one rank per CTA, then the heavy CTAs of each chunk of
// kFa2OrderChunk ranks. Null without a column mask.
constexpr int kFa2OrderChunk = 1024;
inline int32_t* fa2_cta_order(const FwdParams& p) { return fwd_tile_order(p); }

// dQ's conversion passes (FA2-class fa2_dq_tiles_to_dq_kernel, sm90
// dq_tiles_to_dq_kernel) stage a query block's scaled rows in shared memory,
// dq_staging_row_elems apart (16 bytes of padding spread the rows over the
// banks), then write them out with write_staged_dq_rows.
FLASHMASK_HOST_DEVICE constexpr int dq_staging_row_elems(int head_dim) { return head_dim + 8; }

#if defined(__CUDACC__)
// Rows [0, kRows) staged in `rows` to dq's rows from m * kRows (rows past
// seqlen_q left out), in 16-byte chunks row by row over the block's threads;
// element by element where dq's rows are not 16-byte aligned. Columns from
// `cols` on (a multiple of 8: a head dim run on kDim's tiles) are left out.
template <int kRows, int kDim, typename T>
__device__ __forceinline__ void write_staged_dq_rows(T* dq, int64_t row_stride, const T* rows, int m,
                                                     int seqlen_q, int cols = kDim) {
  constexpr int kRowElems = dq_staging_row_elems(kDim);
  constexpr int kChunks = kDim / 8;  // 16-byte chunks per row
  const bool vector_rows = reinterpret_cast<uintptr_t>(dq) % 16 == 0 && row_stride % 8 == 0;
  for (int c = threadIdx.x; c < kRows * kChunks; c += blockDim.x) {
    const int r = c / kChunks, col = c % kChunks * 8;
    const int row = m * kRows + r;
    if (row >= seqlen_q) break;  // chunks go row by row
    if (col >= cols) continue;
    T* dst = dq + row * row_stride + col;
    const T* src = rows + r * kRowElems + col;
    if (vector_rows) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int e = 0; e < 8; ++e) dst[e] = src[e];
    }
  }
}
#endif

}  // namespace cuda
}  // namespace flashmask
