// MaskedRows (mask_bounds.h) against the direct definition of a masked
// element: for random columns of every index form, the two-interval test the
// sm90 kernels use must mask exactly the rows that the four bounds, the
// causal diagonal and the end of the keys mask; so must VisibleRows' one
// interval on the forms one_visible_interval takes (and those forms must be
// C = 1 and non-causal C = 2 exactly). And the FA2-class kernels' choice
// (cuda::partial_test_of, cuda/partial_test.h) on every form, causal C = 4 and
// no column mask too: the test it picks, from the bounds those kernels stage
// for that test, must mask the same rows. Prints the number of mismatches (0
// expected) and the number of elements checked.
#include <cstdio>
#include <random>

#include "../../custom_ops/flashmask/cuda/partial_test.h"
#include "../../custom_ops/flashmask/mask_bounds.h"

using flashmask::ColumnBounds;
using flashmask::load_column_bounds;
using flashmask::masked_rows;
using flashmask::MaskedRows;
using flashmask::one_visible_interval;
using flashmask::visible_rows;
using flashmask::VisibleRows;
using flashmask::cuda::PartialTest;

int main() {
  std::mt19937 rng(7);
  long mismatches = 0, checked = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int seqlen_q = 1 + int(rng() % 300), seqlen_k = 1 + int(rng() % 300);
    const bool causal = rng() % 2;
    const int forms[2][2] = {{2, 4}, {1, 2}};  // C for non-causal / causal
    const int num_cols = forms[causal][rng() % 2];
    // Index values in [0, seqlen_q], sometimes unordered (an empty interval).
    int idx[4];
    for (int& v : idx) v = int(rng() % (seqlen_q + 1));
    const ColumnBounds b = load_column_bounds(idx, num_cols, causal, seqlen_q);
    const int col = int(rng() % (seqlen_k + 40));  // some columns past the end
    const int offset = seqlen_k - seqlen_q;
    const MaskedRows m = masked_rows(b, col, causal, offset, seqlen_k);
    const bool one_interval = one_visible_interval(num_cols, causal);
    mismatches += one_interval != (num_cols == 1 || (num_cols == 2 && !causal));
    const VisibleRows v = visible_rows(b, col, causal, offset, seqlen_k);
    for (int row = 0; row < seqlen_q; ++row) {
      const bool expected = col >= seqlen_k || (causal && col > row + offset) || flashmask::row_masked(b, row);
      mismatches += flashmask::row_masked(m, row) != expected;
      ++checked;
      if (one_interval) {
        mismatches += flashmask::row_masked(v, row) != expected;
        ++checked;
      }
    }
  }
  // The FA2-class kernels' test a call: C = 0 (no column mask) to 4, causal or not.
  long seen[4] = {0, 0, 0, 0};  // by PartialTest
  for (int trial = 0; trial < 20000; ++trial) {
    const int seqlen_q = 1 + int(rng() % 300), seqlen_k = 1 + int(rng() % 300);
    const bool causal = rng() % 2;
    const int forms[2][3] = {{0, 2, 4}, {0, 1, 2}};
    const int num_cols = trial % 7 == 0 ? 4 : forms[causal][rng() % 3];  // causal C = 4 included
    int idx[4];
    for (int& v : idx) v = int(rng() % (seqlen_q + 1));
    flashmask::MaskParams mask;
    mask.startend_row_indices = num_cols > 0 ? idx : nullptr;
    mask.num_cols = num_cols;
    mask.causal = causal;
    const PartialTest test = flashmask::cuda::partial_test_of(mask);
    mismatches += test == PartialTest::kRunTime;
    mismatches += (test == PartialTest::kColumnBounds) != (causal && num_cols == 4);
    ++seen[int(test)];
    // As the kernels stage a column: its bounds, or without a column mask none
    // (VisibleRows: every row from the diagonal on; MaskedRows: no interval).
    const ColumnBounds none = test == PartialTest::kVisibleRows ? ColumnBounds{seqlen_q, seqlen_q, 0, 0}
                                                                : ColumnBounds{0, 0, 0, 0};
    const ColumnBounds b = num_cols > 0 ? load_column_bounds(idx, num_cols, causal, seqlen_q) : none;
    const int col = int(rng() % (seqlen_k + 40));
    const int offset = seqlen_k - seqlen_q;
    const VisibleRows v = visible_rows(b, col, causal, offset, seqlen_k);
    const MaskedRows m = masked_rows(b, col, causal, offset, seqlen_k);
    for (int row = 0; row < seqlen_q; ++row) {
      const bool in_bounds = num_cols > 0 && flashmask::row_masked(b, row);
      const bool expected = col >= seqlen_k || (causal && col > row + offset) || in_bounds;
      bool got = expected;  // kColumnBounds: the direct definition (element_masked)
      if (test == PartialTest::kVisibleRows) got = flashmask::row_masked(v, row);
      if (test == PartialTest::kMaskedRows) got = flashmask::row_masked(m, row);
      mismatches += got != expected;
      ++checked;
    }
  }
  for (int t = 0; t < 3; ++t) mismatches += seen[t] == 0;  // every test but kRunTime picked for some form
  std::printf("%ld %ld\n", mismatches, checked);
  return mismatches != 0;
}
