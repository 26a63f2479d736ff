// classify_tile_parts (mask_bounds.h), which the Hopper kernels' live lists
// are built with, against the dense truth of a tile: kSkip only where every
// element is masked, kFull only where none is, and never less precise than
// classify_tile on the parts' merged summary (what the kernels used before).
// Columns come in runs of shared bounds (documents, answers), so parts are
// often wholly skipped or unmasked, and at random. Prints the number of
// mismatches (0 expected; a kind never produced counts as one) and the
// number of tiles checked.
#include <cstdio>
#include <random>
#include <vector>

#include "../../custom_ops/flashmask/mask_bounds.h"

using flashmask::BlockBounds;
using flashmask::ColumnBounds;
using flashmask::TileKind;

int main() {
  constexpr int kPartCols = 64, kParts = 2, kTileRows = 128, kTileCols = kParts * kPartCols;
  std::mt19937 rng(11);
  long mismatches = 0, checked = 0, kinds[3] = {0, 0, 0}, sharper = 0;
  for (int trial = 0; trial < 40000; ++trial) {
    const int seqlen_q = 1 + int(rng() % 400), seqlen_k = 1 + int(rng() % 400);
    const bool causal = rng() % 2;
    const int forms[2][2] = {{2, 4}, {1, 2}};  // C for non-causal / causal
    const int num_cols = forms[causal][rng() % 2];
    std::vector<ColumnBounds> cols(seqlen_k);
    int idx[4] = {0, 0, 0, 0};
    for (int j = 0; j < seqlen_k; ++j) {
      if (j == 0 || rng() % 24 == 0) {  // a new run of equal bounds, sorted or not
        for (int& v : idx) v = int(rng() % (seqlen_q + 1));
      }
      cols[j] = flashmask::load_column_bounds(idx, num_cols, causal, seqlen_q);
    }
    const int r0 = kTileRows * int(rng() % ((seqlen_q + kTileRows - 1) / kTileRows));
    const int r1 = r0 + kTileRows < seqlen_q ? r0 + kTileRows : seqlen_q;
    const int c0 = kTileCols * int(rng() % ((seqlen_k + kTileCols - 1) / kTileCols));
    BlockBounds parts[kParts], merged = flashmask::empty_block_bounds();
    for (int i = 0; i < kParts; ++i) {
      parts[i] = flashmask::empty_block_bounds();
      for (int j = c0 + i * kPartCols; j < c0 + (i + 1) * kPartCols && j < seqlen_k; ++j) {
        flashmask::extend_block_bounds(parts[i], cols[j]);
      }
      if (c0 + i * kPartCols < seqlen_k) merged = flashmask::merge_block_bounds(merged, parts[i]);
    }
    const TileKind kind = flashmask::classify_tile_parts<kParts>(parts, kPartCols, causal, seqlen_q, seqlen_k,
                                                                 r0, r1, c0);
    const TileKind before = flashmask::classify_tile(true, merged, causal, seqlen_q, seqlen_k, r0, r1, c0,
                                                     c0 + kTileCols);
    long masked = 0, total = 0;
    for (int row = r0; row < r1; ++row) {
      for (int col = c0; col < c0 + kTileCols; ++col, ++total) {
        masked += col >= seqlen_k || (causal && col > row + (seqlen_k - seqlen_q)) ||
                  flashmask::row_masked(cols[col], row);
      }
    }
    mismatches += kind == TileKind::kSkip && masked != total;
    mismatches += kind == TileKind::kFull && masked != 0;
    mismatches += before != TileKind::kPartial && kind != before;  // never less precise
    sharper += before == TileKind::kPartial && kind != TileKind::kPartial;
    ++kinds[int(kind)];
    ++checked;
  }
  for (long n : kinds) mismatches += n == 0;
  mismatches += sharper == 0;  // the case the parts decide better is exercised
  std::printf("%ld %ld\n", mismatches, checked);
  return mismatches != 0;
}
