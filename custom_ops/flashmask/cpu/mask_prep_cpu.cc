// Mask preprocessing, window indices and index validation on the CPU.
#include <algorithm>

#include "../flashmask_api.h"
#include "block_bounds_cpu.h"
#include "parallel.h"
#include "segment_tiles.h"
#include "tile_ops.h"

namespace flashmask {
namespace cpu {

BlockBoundsTable::BlockBoundsTable(const FwdParams& p, int block_n) {
  const MaskParams& mask = p.mask;
  if (mask.startend_row_indices == nullptr || mask.num_cols == 0) return;
  num_blocks_ = ceil_div(p.seqlen_k, block_n);
  const int64_t rows = int64_t(mask_batches(p)) * mask.num_heads;  // = mask_summary_row range
  table_.resize(rows * num_blocks_);
  parallel_for(rows * num_blocks_, p.num_threads, [&](int64_t item, int) {
    const int block = int(item % num_blocks_);
    const int64_t row = item / num_blocks_;
    const int32_t* cols = mask.startend_row_indices +
                          (row / mask.num_heads) * mask.batch_stride +
                          (row % mask.num_heads) * mask.head_stride;
    table_[item] = column_range_bounds(cols, mask, p.seqlen_q, block * block_n,
                                       std::min(p.seqlen_k, (block + 1) * block_n));
  });
}

BlockBounds column_range_bounds(const int32_t* columns, const MaskParams& mask, int seqlen_q, int begin,
                                int end) {
  BlockBounds s = empty_block_bounds();
  for (int j = begin; j < end; ++j) {
    extend_block_bounds(
        s, load_column_bounds(columns + int64_t(j) * mask.col_stride, mask.num_cols, mask.causal, seqlen_q));
  }
  return s;
}

std::vector<int> diagonal_block_starts(const int32_t* columns, int64_t col_stride, int num_cols,
                                       bool causal, int seqlen) {
  // Each column's first and last visible row (an empty column: seqlen and -1).
  std::vector<int> first_seen(seqlen), last_seen(seqlen);
  for (int j = 0; j < seqlen; ++j) {
    const ColumnBounds b = load_column_bounds(columns + int64_t(j) * col_stride, num_cols, causal, seqlen);
    const int lo = causal ? j : 0;
    int first = lo, last = seqlen - 1;
    for (int round = 0; round < 2; ++round) {  // two masked intervals: a row leaves each once
      if (first >= b.lts && first < b.lte) first = b.lte;
      if (first >= b.uts && first < b.ute) first = b.ute;
      if (last >= b.lts && last < b.lte) last = b.lts - 1;
      if (last >= b.uts && last < b.ute) last = b.uts - 1;
    }
    const bool empty = first >= seqlen || last < lo || first > last;
    first_seen[j] = empty ? seqlen : first;
    last_seen[j] = empty ? -1 : last;
  }
  for (int j = seqlen - 2; j >= 0; --j) first_seen[j] = std::min(first_seen[j], first_seen[j + 1]);
  std::vector<int> starts{0};
  int seen_before = -1;  // the last row that sees a key < s
  for (int s = 1; s < seqlen; ++s) {
    seen_before = std::max(seen_before, last_seen[s - 1]);
    if (seen_before < s && first_seen[s] >= s) starts.push_back(s);
  }
  starts.push_back(seqlen);
  return starts;
}

std::vector<RowTile> row_tiles(const FwdParams& p, int block_m) {
  const MaskParams& mask = p.mask;
  const bool per_block = mask.startend_row_indices != nullptr && mask.num_cols > 0 &&
                         p.seqlen_q == p.seqlen_k && p.block_mask.data == nullptr;
  std::vector<std::vector<int>> starts;  // per mask_summary_row
  if (per_block) {
    starts.resize(size_t(mask_batches(p)) * mask.num_heads);
    parallel_for(int64_t(starts.size()), p.num_threads, [&](int64_t row, int) {
      const int32_t* cols = mask.startend_row_indices + (row / mask.num_heads) * mask.batch_stride +
                            (row % mask.num_heads) * mask.head_stride;
      starts[row] = diagonal_block_starts(cols, mask.col_stride, mask.num_cols, mask.causal, p.seqlen_q);
    });
  }
  // Within each (batch, head), whose K/V stay in cache while its tiles run, the
  // heaviest first (parallel_for hands items out in order): under a causal mask a
  // tile's last row sees the keys up to its own position, else all of its keys.
  const int causal_offset = p.seqlen_k - p.seqlen_q;
  auto work = [&](const RowTile& t) {
    const int end = mask.causal ? std::min(t.key_end, t.r0 + t.rows + causal_offset) : t.key_end;
    return end - t.key_start;
  };
  auto heavier = [&](const RowTile& a, const RowTile& b) {
    return work(a) != work(b) ? work(a) > work(b) : a.r0 > b.r0;
  };
  const std::vector<int> whole{0, p.seqlen_q};
  std::vector<RowTile> tiles;
  for (int batch = 0; batch < p.batch; ++batch) {
    for (int head = 0; head < p.num_heads; ++head) {
      const size_t first = tiles.size();
      const std::vector<int>& cuts = per_block ? starts[mask_summary_row(p, batch, head)] : whole;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        const int key_start = per_block ? cuts[k] : 0, key_end = per_block ? cuts[k + 1] : p.seqlen_k;
        for (int r0 = cuts[k]; r0 < cuts[k + 1]; r0 += block_m) {
          tiles.push_back({batch, head, r0, std::min(block_m, cuts[k + 1] - r0), key_start, key_end});
        }
      }
      std::sort(tiles.begin() + first, tiles.end(), heavier);
    }
  }
  return tiles;
}

}  // namespace cpu

void fill_window_indices_cpu(int32_t* dst, int seqlen_q, int seqlen_k, bool causal,
                             int window_left, int window_right) {
  const int cols = causal ? 1 : 2;
  for (int j = 0; j < seqlen_k; ++j) {
    // Rows past j + left are out of the window (LTS); in the non-causal case
    // rows before j - right are too (UTE).
    const int64_t lts = std::min<int64_t>(int64_t(j) + window_left + 1, seqlen_q);
    dst[int64_t(j) * cols] = int32_t(lts);
    if (!causal) {
      const int64_t ute = std::clamp<int64_t>(int64_t(j) - window_right, 0, seqlen_q);
      dst[int64_t(j) * cols + 1] = int32_t(ute);
    }
  }
}

int32_t check_indices_cpu(const int32_t* indices, int64_t num_columns, int num_cols, bool causal,
                          int seqlen_q) {
  int32_t flags = 0;
  const bool has_lower_end = num_cols == 4 || (causal && num_cols == 2);
  for (int64_t c = 0; c < num_columns; ++c) {
    const int32_t* col = indices + c * num_cols;
    for (int k = 0; k < num_cols; ++k) {
      if (col[k] < 0) flags |= kIndexBelowZero;
      if (col[k] > seqlen_q) flags |= kIndexAboveSeqlenQ;
    }
    if (has_lower_end && col[0] > col[1]) flags |= kLowerStartAfterEnd;
    if (num_cols == 4 && col[2] > col[3]) flags |= kUpperStartAfterEnd;
  }
  return flags;
}

}  // namespace flashmask
