// Mask preprocessing, window indices and index validation on the CPU.
#include <algorithm>

#include "../flashmask_api.h"
#include "block_bounds_cpu.h"
#include "parallel.h"
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
    BlockBounds s = empty_block_bounds();
    const int end = std::min(p.seqlen_k, (block + 1) * block_n);
    for (int j = block * block_n; j < end; ++j) {
      extend_block_bounds(
          s, load_column_bounds(cols + j * mask.col_stride, mask.num_cols, mask.causal, p.seqlen_q));
    }
    table_[item] = s;
  });
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
