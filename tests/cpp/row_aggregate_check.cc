// The row aggregates of the mask summaries (cuda::mask_row_aggregates), as the
// prep pass makes them (block_bounds_kernel, emulated here CTA by CTA): each
// 64-column summary encoded as minima (encode_block_bounds); a CTA of 128
// items reduces its rows' summaries in shared-memory slots (rows found by
// summary_rows_spanned) that start at INT_MAX, then min-reduces them into the
// global slots, which a memset of kEncodedBoundsIdentityByte starts. Checked
// against each row's merged summary (equal, or both beyond every row) and,
// where the forwards take a query block as seeing no key (cuda::rows_see_no_key
// on a workspace laid out as the op's: the block table, then the aggregates),
// against the dense truth: every column masks every row of the block. Several
// rows (mask heads) a trial, few keys in some, so CTAs span many rows. Prints mismatches (0 expected; no dead block ever found, or no
// CTA spanning several rows, counts as one) and the query blocks checked.
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../../custom_ops/flashmask/cuda/workspace.h"
#include "../../custom_ops/flashmask/mask_bounds.h"

using flashmask::BlockBounds;
using flashmask::ColumnBounds;
constexpr int kInts = flashmask::kEncodedBoundsInts;

namespace {

// A min field agrees when equal or both at/after the identity; a max field
// (its negation stored) when equal or both at/before its negation.
bool field_agrees(int decoded, int merged, int identity, bool is_max) {
  if (decoded == merged) return true;
  return is_max ? decoded <= -identity && merged <= -identity : decoded >= identity && merged >= identity;
}

}  // namespace

int main() {
  constexpr int kSummaryCols = 64, kRowBlock = 128, kCtaItems = 128;
  int identity;
  std::memset(&identity, flashmask::kEncodedBoundsIdentityByte, sizeof(identity));
  std::mt19937 rng(5);
  long mismatches = 0, checked = 0, dead = 0, multi_row_ctas = 0;
  for (int trial = 0; trial < 6000; ++trial) {
    const int seqlen_q = 1 + int(rng() % 700);
    const int seqlen_k = rng() % 2 ? 1 + int(rng() % 200) : 1 + int(rng() % 1500);
    const bool causal = rng() % 2;
    const int forms[2][2] = {{2, 4}, {1, 2}};  // C for non-causal / causal
    const int num_cols = forms[causal][rng() % 2];
    const int rows = 1 + int(rng() % 5);  // (mask batch, mask head) rows of the table
    const int k_blocks = (seqlen_k + kSummaryCols - 1) / kSummaryCols;
    std::vector<std::vector<ColumnBounds>> cols(rows, std::vector<ColumnBounds>(seqlen_k));
    std::vector<BlockBounds> table(size_t(rows) * k_blocks), merged(rows, flashmask::empty_block_bounds());
    for (int r = 0; r < rows; ++r) {
      // Few live rows (as a context-parallel part's, or padding) in a third of the rows.
      const int live_rows = rng() % 3 == 0 ? int(rng() % 40) : seqlen_q;
      int idx[4] = {0, 0, 0, 0};
      for (int j = 0; j < seqlen_k; ++j) {
        if (j == 0 || rng() % 24 == 0) {
          for (int& v : idx) v = int(rng() % (seqlen_q + 1));
          if (live_rows < seqlen_q) idx[0] = live_rows, idx[1] = seqlen_q;  // rows >= live_rows masked
        }
        cols[r][j] = flashmask::load_column_bounds(idx, num_cols, causal, seqlen_q);
      }
      for (int b = 0; b < k_blocks; ++b) {
        BlockBounds s = flashmask::empty_block_bounds();
        for (int j = b * kSummaryCols; j < (b + 1) * kSummaryCols && j < seqlen_k; ++j) {
          flashmask::extend_block_bounds(s, cols[r][j]);
        }
        table[size_t(r) * k_blocks + b] = s;
        merged[r] = flashmask::merge_block_bounds(merged[r], s);
      }
    }
    // The op's workspace for one batch of `rows` mask heads: the block table,
    // then the aggregates where cuda::mask_row_aggregates finds them.
    flashmask::FwdParams p;
    const int32_t dummy_indices = 0;
    p.batch = 1, p.num_heads = rows, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
    p.mask.startend_row_indices = &dummy_indices, p.mask.num_heads = rows, p.mask.num_cols = num_cols;
    p.mask.causal = causal;
    const size_t table_ints = table.size() * sizeof(BlockBounds) / sizeof(int32_t);
    std::vector<int32_t> workspace(table_ints + size_t(rows) * kInts);
    std::memcpy(workspace.data(), table.data(), table.size() * sizeof(BlockBounds));
    p.block_bounds = workspace.data();
    int* const slots = flashmask::cuda::mask_row_aggregates(p);
    mismatches += slots != workspace.data() + table_ints;
    // The prep pass: global slots memset, then CTA by CTA.
    std::memset(slots, flashmask::kEncodedBoundsIdentityByte, size_t(rows) * kInts * sizeof(int));
    const int64_t total = int64_t(rows) * k_blocks;
    for (int64_t first_item = 0; first_item < total; first_item += kCtaItems) {
      const int64_t here = total - first_item < kCtaItems ? total - first_item : kCtaItems;
      const flashmask::SummaryRowSpan span = flashmask::summary_rows_spanned(first_item, here, k_blocks);
      mismatches += span.count < 1 || span.count > kCtaItems;
      multi_row_ctas += span.count > 1;
      std::vector<int> cta(size_t(span.count) * kInts, INT_MAX);
      for (int64_t item = first_item; item < first_item + here; ++item) {
        const int64_t slot = item / k_blocks - span.first;
        if (slot < 0 || slot >= span.count) {
          ++mismatches;
          continue;
        }
        int encoded[kInts];
        flashmask::encode_block_bounds(table[size_t(item)], encoded);
        for (int i = 0; i < kInts; ++i) cta[slot * kInts + i] = std::min(cta[slot * kInts + i], encoded[i]);
      }
      for (int r = 0; r < span.count; ++r) {
        for (int i = 0; i < kInts; ++i) {
          int& g = slots[size_t(span.first + r) * kInts + i];
          g = std::min(g, cta[r * kInts + i]);
        }
      }
    }
    for (int r = 0; r < rows; ++r) {
      const BlockBounds whole = flashmask::decode_block_bounds(&slots[size_t(r) * kInts]);
      const BlockBounds& m = merged[r];
      const int got[8] = {whole.lts_min, whole.lts_max, whole.lte_min, whole.lte_max,
                          whole.uts_min, whole.uts_max, whole.ute_min, whole.ute_max};
      const int want[8] = {m.lts_min, m.lts_max, m.lte_min, m.lte_max, m.uts_min, m.uts_max, m.ute_min, m.ute_max};
      for (int i = 0; i < 8; ++i) mismatches += !field_agrees(got[i], want[i], identity, i % 2 == 1);
      for (int r0 = 0; r0 < seqlen_q; r0 += kRowBlock) {
        const int r1 = r0 + kRowBlock < seqlen_q ? r0 + kRowBlock : seqlen_q;
        ++checked;
        if (!flashmask::cuda::rows_see_no_key(p, 0, r, r0, r1)) continue;
        ++dead;
        for (int row = r0; row < r1; ++row) {
          for (int col = 0; col < seqlen_k; ++col) mismatches += !flashmask::row_masked(cols[r][col], row);
        }
      }
    }
  }
  mismatches += dead == 0;
  mismatches += multi_row_ctas == 0;
  std::printf("%ld %ld\n", mismatches, checked);
  return mismatches != 0;
}
