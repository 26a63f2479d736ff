// The row aggregates and coarse summaries of the mask summaries
// (cuda::mask_row_aggregates, cuda::mask_coarse_summaries), as the prep pass
// makes them (block_bounds_kernel, emulated here CTA by CTA) in a workspace
// laid out as the op's: each 64-column summary encoded as minima
// (encode_block_bounds); a CTA of 128 items reduces its groups' summaries
// (rows, or runs of kCoarseSummaryBlocks; found by summary_groups_spanned) in
// shared-memory slots that start at INT_MAX, then min-reduces them into the
// global slots, which a memset of kEncodedBoundsIdentityByte starts. Checked
// against each group's merged summary (equal, or both beyond every row), and
// against the dense truth: where the forwards take a query block as seeing no
// key (cuda::rows_see_no_key), every column masks every row of the block;
// where a coarse summary hides a query block's rows (both forwards' scans then
// pass its keys), each of its columns masks them. Several rows
// (mask heads) a trial, few keys in some (CTAs span many rows), many in others
// (several coarse summaries a row). Prints mismatches (0 expected; no dead
// block or hiding coarse summary ever found, or no CTA spanning several rows,
// counts as one) and the query blocks checked.
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
  constexpr int kSummaryCols = flashmask::cuda::kMaskBlockN, kRunBlocks = flashmask::cuda::kCoarseSummaryBlocks;
  constexpr int kRowBlock = 128, kCtaItems = 128;
  int identity;
  std::memset(&identity, flashmask::kEncodedBoundsIdentityByte, sizeof(identity));
  std::mt19937 rng(5);
  long mismatches = 0, checked = 0, dead = 0, hiding_runs = 0, multi_row_ctas = 0;
  for (int trial = 0; trial < 6000; ++trial) {
    const int seqlen_q = 1 + int(rng() % 700);
    // few keys (CTAs span many rows), or enough for several coarse summaries a row
    const int seqlen_k = rng() % 2 ? 1 + int(rng() % 200) : 1 + int(rng() % 9000);
    const bool causal = rng() % 2;
    const int forms[2][2] = {{2, 4}, {1, 2}};  // C for non-causal / causal
    const int num_cols = forms[causal][rng() % 2];
    const int rows = 1 + int(rng() % 5);  // (mask batch, mask head) rows of the table
    const int k_blocks = (seqlen_k + kSummaryCols - 1) / kSummaryCols;
    std::vector<std::vector<ColumnBounds>> cols(rows, std::vector<ColumnBounds>(seqlen_k));
    const int runs_per_row = flashmask::summary_groups_per_row(k_blocks, kRunBlocks);
    std::vector<BlockBounds> table(size_t(rows) * k_blocks), merged(rows, flashmask::empty_block_bounds());
    std::vector<BlockBounds> run_merged(size_t(rows) * runs_per_row, flashmask::empty_block_bounds());
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
        BlockBounds& run = run_merged[size_t(r) * runs_per_row + b / kRunBlocks];
        run = flashmask::merge_block_bounds(run, s);
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
    std::vector<int32_t> workspace(table_ints + size_t(rows) * (1 + runs_per_row) * kInts);
    std::memcpy(workspace.data(), table.data(), table.size() * sizeof(BlockBounds));
    p.block_bounds = workspace.data();
    int* const slots = flashmask::cuda::mask_row_aggregates(p);
    int* const run_slots = flashmask::cuda::mask_coarse_summaries(p);
    mismatches += slots != workspace.data() + table_ints;
    mismatches += run_slots != slots + size_t(rows) * kInts;
    mismatches += flashmask::cuda::coarse_summaries(p) != runs_per_row;
    // The prep pass: global slots memset (both tables at once), then CTA by CTA.
    std::memset(slots, flashmask::kEncodedBoundsIdentityByte, size_t(rows) * (1 + runs_per_row) * kInts * sizeof(int));
    const int64_t total = int64_t(rows) * k_blocks;
    for (int64_t first_item = 0; first_item < total; first_item += kCtaItems) {
      const int64_t here = total - first_item < kCtaItems ? total - first_item : kCtaItems;
      const int group_sizes[2] = {k_blocks, kRunBlocks};
      int* const tables[2] = {slots, run_slots};
      for (int kind = 0; kind < 2; ++kind) {
        const flashmask::SummaryGroupSpan span =
            flashmask::summary_groups_spanned(first_item, here, k_blocks, group_sizes[kind]);
        mismatches += span.count < 1 || span.count > kCtaItems;
        multi_row_ctas += kind == 0 && span.count > 1;
        std::vector<int> cta(size_t(span.count) * kInts, INT_MAX);
        for (int64_t item = first_item; item < first_item + here; ++item) {
          const int64_t slot = flashmask::summary_group_of(item, k_blocks, group_sizes[kind]) - span.first;
          if (slot < 0 || slot >= span.count) {
            ++mismatches;
            continue;
          }
          int encoded[kInts];
          flashmask::encode_block_bounds(table[size_t(item)], encoded);
          for (int i = 0; i < kInts; ++i) cta[slot * kInts + i] = std::min(cta[slot * kInts + i], encoded[i]);
        }
        for (int g = 0; g < span.count; ++g) {
          for (int i = 0; i < kInts; ++i) {
            int& slot = tables[kind][size_t(span.first + g) * kInts + i];
            slot = std::min(slot, cta[g * kInts + i]);
          }
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
      for (int run = 0; run < runs_per_row; ++run) {
        const int* e = &run_slots[(size_t(r) * runs_per_row + run) * kInts];
        const BlockBounds& w = run_merged[size_t(r) * runs_per_row + run];
        const BlockBounds d = flashmask::decode_block_bounds(e);
        const int got_run[8] = {d.lts_min, d.lts_max, d.lte_min, d.lte_max, d.uts_min, d.uts_max, d.ute_min, d.ute_max};
        const int want_run[8] = {w.lts_min, w.lts_max, w.lte_min, w.lte_max, w.uts_min, w.uts_max, w.ute_min, w.ute_max};
        for (int i = 0; i < 8; ++i) mismatches += !field_agrees(got_run[i], want_run[i], identity, i % 2 == 1);
        // A run that hides a query block's rows hides them from each of its columns.
        const int c0 = run * kRunBlocks * kSummaryCols, c1 = std::min(seqlen_k, c0 + kRunBlocks * kSummaryCols);
        for (int r0 = 0; r0 < seqlen_q; r0 += kRowBlock) {
          const int r1 = std::min(seqlen_q, r0 + kRowBlock);
          if (!flashmask::cuda::encoded_summary_hides_rows(e, r0, r1)) continue;
          ++hiding_runs;
          for (int row = r0; row < r1; ++row) {
            for (int col = c0; col < c1; ++col) mismatches += !flashmask::row_masked(cols[r][col], row);
          }
        }
      }
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
  mismatches += hiding_runs == 0;
  mismatches += multi_row_ctas == 0;
  std::printf("%ld %ld\n", mismatches, checked);
  return mismatches != 0;
}
