// The element test of partially masked tiles in the FA2-class kernels, on
// the device: what each test (partial_test.h) stages for a tile's key columns
// and how it tests an element.
#pragma once

#include "../flashmask_params.h"
#include "../mask_bounds.h"
#include "partial_test.h"
#include "tile_io.cuh"

namespace flashmask {
namespace cuda {

// What kTest stages in shared memory for key columns [c0, c0 + kCols) (one
// ColumnBounds slot a column, the largest of the three forms): thread `tid`
// stages column c0 + tid. Columns past seqlen_k are masked in every row.
template <PartialTest kTest, int kCols>
__device__ __forceinline__ void stage_partial_columns(ColumnBounds* smem, const int32_t* columns,
                                                      const MaskParams& mask, int c0, int seqlen_q, int seqlen_k,
                                                      int causal_offset, int tid) {
  static_assert(kTest != PartialTest::kRunTime, "kRunTime picks one of the others in the kernel");
  if constexpr (kTest == PartialTest::kColumnBounds) {  // the causal diagonal: ColumnBoundsTest
    stage_column_bounds<kCols>(smem, columns, mask, c0, seqlen_q, seqlen_k, tid);
  } else if (tid < kCols) {
    const int col = c0 + tid;
    // Without a column mask: VisibleRows from the diagonal on (causal) or every row; no MaskedRows.
    const ColumnBounds none = kTest == PartialTest::kVisibleRows ? ColumnBounds{seqlen_q, seqlen_q, 0, 0}
                                                                 : ColumnBounds{0, 0, 0, 0};
    const ColumnBounds b = columns != nullptr && col < seqlen_k
                               ? load_column_bounds(columns + int64_t(col) * mask.col_stride, mask.num_cols,
                                                    mask.causal, seqlen_q)
                               : none;
    if constexpr (kTest == PartialTest::kVisibleRows) {
      reinterpret_cast<VisibleRows*>(smem)[tid] = visible_rows(b, col, mask.causal, causal_offset, seqlen_k);
    } else {
      reinterpret_cast<MaskedRows*>(smem)[tid] = masked_rows(b, col, mask.causal, causal_offset, seqlen_k);
    }
  }
}

// The element test over what stage_partial_columns staged: rows_of(key)
// reads a key's staged rows once (key within the tile), test(rows, key, row)
// says whether absolute query row `row` is masked there.
template <typename KeyRows>
struct KeyRowsTest {
  const ColumnBounds* staged;
  __device__ __forceinline__ KeyRows rows_of(int key) const { return reinterpret_cast<const KeyRows*>(staged)[key]; }
  __device__ __forceinline__ bool test(const KeyRows& rows, int, int row) const { return row_masked(rows, row); }
};
struct ColumnBoundsTest {
  const ColumnBounds* staged;
  bool has_columns, causal;
  int causal_offset, seqlen_k, c0;
  __device__ __forceinline__ int rows_of(int) const { return 0; }
  __device__ __forceinline__ bool test(int, int key, int row) const {
    return element_masked(staged, has_columns, causal, causal_offset, seqlen_k, row, c0 + key, c0);
  }
};

template <PartialTest kTest>
__device__ __forceinline__ auto partial_tester(const ColumnBounds* staged, const MaskParams& mask,
                                               int causal_offset, int seqlen_k, int c0) {
  if constexpr (kTest == PartialTest::kVisibleRows) {
    return KeyRowsTest<VisibleRows>{staged};
  } else if constexpr (kTest == PartialTest::kMaskedRows) {
    return KeyRowsTest<MaskedRows>{staged};
  } else {
    static_assert(kTest == PartialTest::kColumnBounds, "kRunTime picks one of the others in the kernel");
    return ColumnBoundsTest{staged, mask.startend_row_indices != nullptr, mask.causal, causal_offset, seqlen_k, c0};
  }
}

}  // namespace cuda
}  // namespace flashmask
