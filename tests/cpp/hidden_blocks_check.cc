// first_block_not_hidden (mask_bounds.h), the step a backward's scan over one
// key block's query blocks takes after a window that listed none, against a
// block-by-block walk: the block it returns must be the first at or after the
// start that no single interval covers, and every block it passes must be
// masked elementwise in every column of the tile. Columns come in runs of
// shared bounds, among them a global prefix (rows [0, g) see every key) with
// the rest hidden by the two intervals in turn, the context-parallel part the
// step is for. Also query_blocks_not_hidden (the FA2-class backward's CTA
// order's weight of a key block) against that count block by block. Prints the number of mismatches (0 expected; a case never seen
// counts as one) and the number of starts checked.
#include <cstdio>
#include <random>
#include <vector>

#include "../../custom_ops/flashmask/mask_bounds.h"

using flashmask::BlockBounds;
using flashmask::ColumnBounds;

int main() {
  std::mt19937 rng(38);
  long mismatches = 0, checked = 0, jumped = 0, two_steps = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int seqlen_q = 1 + int(rng() % 3000), tile_cols = 1 + int(rng() % 128);
    const int block_rows = trial % 2 ? 64 : 128;
    const bool causal = rng() % 2;
    const int num_cols = rng() % 2 ? 4 : 2;  // C = 2 or 4, causal or not
    const bool global_prefix = rng() % 3 == 0;
    std::vector<ColumnBounds> cols(tile_cols);
    int idx[4] = {0, 0, 0, 0};
    for (int j = 0; j < tile_cols; ++j) {
      if (global_prefix && num_cols == 4) {
        // [LTS, LTE, UTS, UTE]: rows [g, t) hidden from above, [t, S) from below
        const int g = int(rng() % (seqlen_q < 40 ? seqlen_q + 1 : 40)), t = g + int(rng() % (seqlen_q - g + 1));
        const int v[4] = {t, seqlen_q, g, t};
        for (int i = 0; i < 4; ++i) idx[i] = v[i];
      } else if (j == 0 || rng() % 16 == 0) {
        for (int& v : idx) v = int(rng() % (seqlen_q + 1));
      }
      cols[j] = flashmask::load_column_bounds(idx, num_cols, causal, seqlen_q);
    }
    BlockBounds s = flashmask::empty_block_bounds();
    for (const ColumnBounds& b : cols) flashmask::extend_block_bounds(s, b);
    const int q_blocks = (seqlen_q + block_rows - 1) / block_rows;
    const int m = int(rng() % q_blocks);
    const int got = flashmask::first_block_not_hidden(s, m, block_rows);
    int want = m;  // the walk: blocks one interval covers (unclamped rows, as the step)
    while (flashmask::intervals_cover_rows(s.lts_max, s.lte_min, s.uts_max, s.ute_min, want * block_rows,
                                           want * block_rows + block_rows)) {
      ++want;
    }
    mismatches += got < m || (got != want && !(want >= q_blocks && got >= q_blocks));
    for (int b = m; b < got && b < q_blocks; ++b) {  // passed blocks: masked element by element
      for (int row = b * block_rows; row < (b + 1) * block_rows && row < seqlen_q; ++row) {
        for (const ColumnBounds& c : cols) mismatches += !flashmask::row_masked(c, row);
      }
    }
    jumped += got > m;
    // where one step (past the interval holding block m) was not enough
    const int r0 = m * block_rows, r1 = r0 + block_rows;
    const int one_step = r0 >= s.lts_max && r1 <= s.lte_min   ? s.lte_min / block_rows
                         : r0 >= s.uts_max && r1 <= s.ute_min ? s.ute_min / block_rows
                                                              : m;
    two_steps += got != one_step;
    // query_blocks_not_hidden over a random range: the blocks no single interval covers, counted.
    const int m_end = m + int(rng() % (q_blocks - m + 1));
    int not_hidden = 0;
    for (int b = m; b < m_end; ++b) {
      not_hidden += !flashmask::intervals_cover_rows(s.lts_max, s.lte_min, s.uts_max, s.ute_min, b * block_rows,
                                                     b * block_rows + block_rows);
    }
    mismatches += flashmask::query_blocks_not_hidden(s, m, m_end, block_rows) != not_hidden;
    ++checked;
  }
  mismatches += jumped == 0;
  mismatches += two_steps == 0;
  std::printf("%ld %ld\n", mismatches, checked);
  return mismatches != 0;
}
