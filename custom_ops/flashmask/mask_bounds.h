// FlashMask semantics in one place: how a key column's indices mask query rows,
// the per-column-block min/max summary, and the three-way tile classification.
// Shared by every backend (host and device), so all of them skip and mask the
// very same tiles.
#pragma once

#include <cstdint>

#include "flashmask_params.h"


namespace flashmask {

// Key column j masks query rows [lts, lte) and [uts, ute).
//   causal, C=1: (LTS)            -> [LTS, Sq)
//   causal, C=2: (LTS, LTE)       -> [LTS, LTE)
//   non-causal, C=2: (LTS, UTE)   -> [LTS, Sq) and [0, UTE)
//   non-causal, C=4: (LTS, LTE, UTS, UTE)
// An unused interval is the empty [0, 0), which never masks anything.
struct ColumnBounds {
  int lts, lte, uts, ute;
};

FLASHMASK_HOST_DEVICE ColumnBounds load_column_bounds(const int32_t* col,
                                                      int num_cols,
                                                      bool causal,
                                                      int seqlen_q) {
  ColumnBounds b{0, 0, 0, 0};
  if (num_cols == 1) {
    b.lts = col[0];
    b.lte = seqlen_q;
  } else if (num_cols == 2 && causal) {
    b.lts = col[0];
    b.lte = col[1];
  } else if (num_cols == 2) {
    b.lts = col[0];
    b.lte = seqlen_q;
    b.ute = col[1];
  } else if (num_cols == 4) {
    b.lts = col[0];
    b.lte = col[1];
    b.uts = col[2];
    b.ute = col[3];
  }
  return b;
}

FLASHMASK_HOST_DEVICE bool row_masked(const ColumnBounds& b, int row) {
  return (row >= b.lts && row < b.lte) || (row >= b.uts && row < b.ute);
}

// A key column's masked query rows as two intervals [start, start + len),
// each tested with one subtraction and one unsigned compare (kernels mask
// partial tiles elementwise with it). Built per column from its bounds, with
// the causal diagonal (rows < col - causal_offset; causal masks leave the
// upper interval unused, C = 1 or 2) and columns past seqlen_k (every row)
// folded in. Causal calls with C = 4 do not fit; the kernels that use this
// refuse them (sm90::fwd_supported).
struct MaskedRows {
  int lo_start;
  unsigned lo_len;
  int hi_start;
  unsigned hi_len;
};

FLASHMASK_HOST_DEVICE MaskedRows masked_rows(const ColumnBounds& b, int col, bool causal,
                                             int causal_offset, int seqlen_k) {
  if (col >= seqlen_k) return MaskedRows{0, 0xffffffffu, 0, 0u};
  MaskedRows m;
  m.lo_start = b.lts;
  m.lo_len = b.lte > b.lts ? unsigned(b.lte - b.lts) : 0u;
  if (causal) {
    const int limit = col - causal_offset;
    m.hi_start = 0;
    m.hi_len = limit > 0 ? unsigned(limit) : 0u;
  } else {
    m.hi_start = b.uts;
    m.hi_len = b.ute > b.uts ? unsigned(b.ute - b.uts) : 0u;
  }
  return m;
}

FLASHMASK_HOST_DEVICE bool row_masked(const MaskedRows& m, int row) {
  return (unsigned(row - m.lo_start) < m.lo_len) | (unsigned(row - m.hi_start) < m.hi_len);
}

// Where a column's masked rows are the complement of one interval, its
// visible rows [start, start + len) take one subtraction and one unsigned
// compare per element instead of two of each: C = 1 (causal or not) and
// non-causal C = 2, every FlashMask but the causal C = 2 bands and C = 4.
FLASHMASK_HOST_DEVICE bool one_visible_interval(int num_cols, bool causal) {
  return num_cols == 1 || (num_cols == 2 && !causal);
}

struct VisibleRows {
  int start;
  unsigned len;
};

// masked_rows' complement for one_visible_interval masks: visible are the rows
// from the causal diagonal (col - causal_offset) or the upper mask's end
// (non-causal C = 2) up to the lower mask's start; nothing past seqlen_k.
FLASHMASK_HOST_DEVICE VisibleRows visible_rows(const ColumnBounds& b, int col, bool causal,
                                               int causal_offset, int seqlen_k) {
  if (col >= seqlen_k) return VisibleRows{0, 0u};
  int start = causal ? col - causal_offset : b.ute;
  start = start > 0 ? start : 0;
  return VisibleRows{start, b.lts > start ? unsigned(b.lts - start) : 0u};
}

FLASHMASK_HOST_DEVICE bool row_masked(const VisibleRows& v, int row) {
  return unsigned(row - v.start) >= v.len;
}

// Min and max of each bound over one block of key columns.
struct BlockBounds {
  int lts_min, lts_max, lte_min, lte_max;
  int uts_min, uts_max, ute_min, ute_max;
};

FLASHMASK_HOST_DEVICE BlockBounds empty_block_bounds() {
  // Identity for the min/max reduction.
  const int big = 0x7fffffff;
  return BlockBounds{big, -big, big, -big, big, -big, big, -big};
}

// Summary of the union of two column sets (also used for kernels whose key
// tile spans several summary blocks).
FLASHMASK_HOST_DEVICE BlockBounds merge_block_bounds(BlockBounds a, const BlockBounds& b) {
  a.lts_min = b.lts_min < a.lts_min ? b.lts_min : a.lts_min;
  a.lts_max = b.lts_max > a.lts_max ? b.lts_max : a.lts_max;
  a.lte_min = b.lte_min < a.lte_min ? b.lte_min : a.lte_min;
  a.lte_max = b.lte_max > a.lte_max ? b.lte_max : a.lte_max;
  a.uts_min = b.uts_min < a.uts_min ? b.uts_min : a.uts_min;
  a.uts_max = b.uts_max > a.uts_max ? b.uts_max : a.uts_max;
  a.ute_min = b.ute_min < a.ute_min ? b.ute_min : a.ute_min;
  a.ute_max = b.ute_max > a.ute_max ? b.ute_max : a.ute_max;
  return a;
}

// A summary as eight minima (each max negated), so that a row's summaries can
// be merged by atomicMin into slots a memset of 0x7f bytes starts at their
// identity: 0x7f7f7f7f stands for "above every row" as 0x7fffffff does (both
// exceed any row index; sequences stop at 2^31 rows), so decoding such a slot
// classifies alike.
constexpr int kEncodedBoundsInts = 8;
constexpr unsigned char kEncodedBoundsIdentityByte = 0x7f;
FLASHMASK_HOST_DEVICE void encode_block_bounds(const BlockBounds& s, int* out) {
  out[0] = s.lts_min, out[1] = -s.lts_max, out[2] = s.lte_min, out[3] = -s.lte_max;
  out[4] = s.uts_min, out[5] = -s.uts_max, out[6] = s.ute_min, out[7] = -s.ute_max;
}
FLASHMASK_HOST_DEVICE BlockBounds decode_block_bounds(const int* in) {
  return BlockBounds{in[0], -in[1], in[2], -in[3], in[4], -in[5], in[6], -in[7]};
}

// Groups of a [rows, blocks_per_row] summary table: each row cut into runs of
// blocks_per_group blocks (the last run of a row may be shorter), numbered row
// by row: group (row, block / blocks_per_group) is row * groups_per_row +
// block / blocks_per_group. blocks_per_group >= blocks_per_row makes a row one
// group (the row aggregates); 32 the coarse summaries (cuda::mask_coarse_summaries).
FLASHMASK_HOST_DEVICE int summary_groups_per_row(int blocks_per_row, int blocks_per_group) {
  return (blocks_per_row + blocks_per_group - 1) / blocks_per_group;
}
FLASHMASK_HOST_DEVICE int64_t summary_group_of(int64_t item, int blocks_per_row, int blocks_per_group) {
  return item / blocks_per_row * summary_groups_per_row(blocks_per_row, blocks_per_group) +
         item % blocks_per_row / blocks_per_group;
}

// The groups that items [first_item, first_item + count) lie in: the first and
// how many (none for count <= 0). The group number grows by at most one from an
// item to the next, so count items span at most count groups: a CTA of the
// prep pass reduces its items' groups in that many shared-memory slots
// (cuda::block_bounds_kernel).
struct SummaryGroupSpan {
  int64_t first;
  int count;
};
FLASHMASK_HOST_DEVICE SummaryGroupSpan summary_groups_spanned(int64_t first_item, int64_t count, int blocks_per_row,
                                                              int blocks_per_group) {
  const int64_t first = summary_group_of(first_item, blocks_per_row, blocks_per_group);
  if (count <= 0) return SummaryGroupSpan{first, 0};
  return SummaryGroupSpan{
      first, int(summary_group_of(first_item + count - 1, blocks_per_row, blocks_per_group) - first + 1)};
}

// Adds one column to a summary: a column is the summary whose min == max.
FLASHMASK_HOST_DEVICE void extend_block_bounds(BlockBounds& s, const ColumnBounds& b) {
  s = merge_block_bounds(s, BlockBounds{b.lts, b.lts, b.lte, b.lte, b.uts, b.uts, b.ute, b.ute});
}

// Where the query head `head` of batch row `batch` finds its mask: the mask
// head it uses (Hm is 1 or Hk), the mask batch row (0 when one mask is
// broadcast over the batch), its [Sk, C] columns and its row of block
// summaries ((mask batch * Hm + mask head) in a [mask batches, Hm, blocks] table).
FLASHMASK_HOST_DEVICE int mask_head_of(const FwdParams& p, int head) {
  return p.mask.num_heads == 1 ? 0 : head / (p.num_heads / p.mask.num_heads);
}
FLASHMASK_HOST_DEVICE int mask_batch_of(const MaskParams& mask, int batch) {
  return mask.batch_stride == 0 ? 0 : batch;
}
FLASHMASK_HOST_DEVICE int mask_batches(const FwdParams& p) {
  return p.mask.batch_stride == 0 ? 1 : p.batch;
}
FLASHMASK_HOST_DEVICE const int32_t* mask_columns(const FwdParams& p, int batch, int head) {
  if (p.mask.startend_row_indices == nullptr) return nullptr;
  return p.mask.startend_row_indices + mask_batch_of(p.mask, batch) * p.mask.batch_stride +
         mask_head_of(p, head) * p.mask.head_stride;
}
FLASHMASK_HOST_DEVICE int64_t mask_summary_row(const FwdParams& p, int batch, int head) {
  return int64_t(mask_batch_of(p.mask, batch)) * p.mask.num_heads + mask_head_of(p, head);
}

// Edge of a block_mask block; every kernel tile lies inside one block (tiles
// are at most 128 and aligned to their size).
constexpr int kBlockMaskSize = 128;

// False when the block_mask masks the block holding the tile that starts at
// query row r0 and key column c0 (its tiles are then skipped like kSkip ones).
FLASHMASK_HOST_DEVICE bool block_kept(const FwdParams& p, int batch, int head, int r0, int c0) {
  const BlockMaskParams& m = p.block_mask;
  if (m.data == nullptr) return true;
  const int mask_head = m.num_heads == 1 ? 0 : head / (p.num_heads / m.num_heads);
  return m.data[batch * m.batch_stride + mask_head * m.head_stride +
                int64_t(r0 / kBlockMaskSize) * m.col_blocks + c0 / kBlockMaskSize] != 0;
}

// The block_mask entries of the query rows starting at r0, one per 128-key block
// (nullptr: no block mask): kernels whose query rows are fixed look it up once.
FLASHMASK_HOST_DEVICE const int32_t* block_mask_row(const FwdParams& p, int batch, int head, int r0) {
  const BlockMaskParams& m = p.block_mask;
  if (m.data == nullptr) return nullptr;
  const int mask_head = m.num_heads == 1 ? 0 : head / (p.num_heads / m.num_heads);
  return m.data + batch * m.batch_stride + mask_head * m.head_stride +
         int64_t(r0 / kBlockMaskSize) * m.col_blocks;
}

enum class TileKind : int {
  kSkip = 0,     // every element masked: no loads, no math
  kPartial = 1,  // some elements masked: apply the bounds elementwise
  kFull = 2,     // nothing masked: no mask work at all
};

// Whether every column's lower interval, or every column's upper one, covers
// all rows [r0, r1), from the summary fields that decide it (a tile's or a
// whole row's: cuda::mask_row_aggregates).
FLASHMASK_HOST_DEVICE bool intervals_cover_rows(int lts_max, int lte_min, int uts_max, int ute_min, int r0,
                                                int r1) {
  return (r0 >= lts_max && r1 <= lte_min) || (r0 >= uts_max && r1 <= ute_min);
}

// The step a live-block scan takes after a window or round that listed
// nothing when it has no summary to pass hidden blocks with: none (the
// FA2-class LiveBlockScan and the Hopper compact_live_blocks).
struct NoSkipAhead {
  FLASHMASK_HOST_DEVICE int operator()(int i) const { return i; }
};

// The first block of `block_rows` query rows at or after block m that the key
// tile summarised by `s` does not hide by one interval alone: every block from
// m up to it lies inside the lower interval of every column ([lts_max,
// lte_min)) or inside the upper one ([uts_max, ute_min)), which classify_tile
// skips. Two steps at most: the block holding an interval's end is not inside
// that interval, and after passing one interval and then the other, the block
// holding the second's end lies past the first's. For a backward that scans a
// key block's query blocks: a key of a global row's prefix hides every other
// row, thousands of query blocks that one subtraction passes.
FLASHMASK_HOST_DEVICE int first_block_not_hidden(const BlockBounds& s, int m, int block_rows) {
  for (int step = 0; step < 2; ++step) {
    const int r0 = m * block_rows, r1 = r0 + block_rows;
    if (r0 >= s.lts_max && r1 <= s.lte_min) {
      m = s.lte_min / block_rows;
    } else if (r0 >= s.uts_max && r1 <= s.ute_min) {
      m = s.ute_min / block_rows;
    } else {
      break;
    }
  }
  return m;
}

// How many of query blocks [m_begin, m_end) (of block_rows rows) the key tile
// summarised by `s` does not hide by one interval alone (the test of
// first_block_not_hidden and classify_tile), at O(1): the blocks wholly
// inside [lts_max, lte_min) or [uts_max, ute_min) taken out. An upper bound on
// the tile's live query blocks (exact where every column hides the same
// rows): what the FA2-class backward's CTA order weighs a key block by
// (cuda/fa2_cta_order.cuh).
FLASHMASK_HOST_DEVICE int query_blocks_not_hidden(const BlockBounds& s, int m_begin, int m_end, int block_rows) {
  // The blocks wholly inside rows [a, b), within [m_begin, m_end): [lo, hi).
  auto inside = [&](int a, int b, int& lo, int& hi) {
    lo = a <= 0 ? m_begin : int((int64_t(a) + block_rows - 1) / block_rows);
    lo = lo < m_begin ? m_begin : lo;
    hi = b / block_rows;
    hi = hi > m_end ? m_end : hi;
    hi = hi < lo ? lo : hi;
  };
  int a0, a1, b0, b1;
  inside(s.lts_max, s.lte_min, a0, a1);
  inside(s.uts_max, s.ute_min, b0, b1);
  const int lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
  const int both = hi > lo ? hi - lo : 0;
  return (m_end - m_begin) - ((a1 - a0) + (b1 - b0) - both);
}

// Classifies the tile of query rows [r0, r1) x key columns [c0, c1), whose
// columns are summarised by `s` when `has_bounds` (no column mask otherwise).
// Conservative by design: when unsure it answers kPartial, whose elementwise
// path is always exact.
FLASHMASK_HOST_DEVICE TileKind classify_tile(bool has_bounds, const BlockBounds& s, bool causal,
                                             int seqlen_q, int seqlen_k, int r0, int r1, int c0,
                                             int c1) {
  bool partial = c1 > seqlen_k;  // ragged last key block: mask the overhang
  if (causal) {
    // Bottom-right alignment: row i sees keys j <= i + (seqlen_k - seqlen_q).
    const int offset = seqlen_k - seqlen_q;
    if (c0 > r1 - 1 + offset) return TileKind::kSkip;
    if (c1 - 1 > r0 + offset) partial = true;
  }
  if (has_bounds) {
    if (intervals_cover_rows(s.lts_max, s.lte_min, s.uts_max, s.ute_min, r0, r1)) return TileKind::kSkip;
    // Every column's interval misses the tile entirely: it starts at or after
    // r1 or ends at or before r0 (an empty interval always qualifies).
    const bool lower_clear = r1 <= s.lts_min || r0 >= s.lte_max || s.lts_min >= s.lte_max;
    const bool upper_clear = r1 <= s.uts_min || r0 >= s.ute_max || s.uts_min >= s.ute_max;
    if (!lower_clear || !upper_clear) partial = true;
  }
  return partial ? TileKind::kPartial : TileKind::kFull;
}

// The kind of a tile made of two column parts of known kinds: skipped when both
// are, unmasked when both are, elementwise otherwise. Exact, and at least as
// precise as classifying the parts' merged summary: columns that each miss the
// tile's rows in their own way (one part's intervals below the rows, the
// other's above) make a merged summary straddle the rows, not the parts.
FLASHMASK_HOST_DEVICE TileKind combine_tile_kinds(TileKind a, TileKind b) {
  return a == b ? a : TileKind::kPartial;
}

// Classifies the tile of query rows [r0, r1) x key columns [c0, c0 + kParts *
// part_cols) from its parts' own summaries (`parts[i]` summarises columns
// c0 + i * part_cols onwards): each part by classify_tile, combined, stopping at
// the first part that leaves the tile partial, so the later parts' summaries are
// not read (the Hopper list builders run on 24 registers: merging the parts'
// summaries first kept 16 loads in flight and spilled; loads behind the branch
// are not hoisted above it). Parts wholly past the keys' end do not exist and
// are not read: alone they are skipped, beside a live part the tile is partial
// (which masks the overhang).
template <int kParts>
FLASHMASK_HOST_DEVICE TileKind classify_tile_parts(const BlockBounds* parts, int part_cols, bool causal,
                                                   int seqlen_q, int seqlen_k, int r0, int r1, int c0) {
  TileKind kind = TileKind::kSkip;
#pragma unroll
  for (int i = 0; i < kParts; ++i) {
    const int p0 = c0 + i * part_cols;
    const TileKind k = p0 >= seqlen_k ? TileKind::kSkip
                                      : classify_tile(true, parts[i], causal, seqlen_q, seqlen_k, r0, r1,
                                                      p0, p0 + part_cols);
    kind = i == 0 ? k : combine_tile_kinds(kind, k);
    if (kind == TileKind::kPartial) break;
  }
  return kind;
}

// Same, with the summary given by pointer (null: no column mask).
FLASHMASK_HOST_DEVICE TileKind classify_tile(const BlockBounds* bounds, bool causal, int seqlen_q,
                                             int seqlen_k, int r0, int r1, int c0, int c1) {
  return classify_tile(bounds != nullptr, bounds != nullptr ? *bounds : empty_block_bounds(),
                       causal, seqlen_q, seqlen_k, r0, r1, c0, c1);
}

}  // namespace flashmask
