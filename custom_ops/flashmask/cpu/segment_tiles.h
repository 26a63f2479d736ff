// The CPU forward's query tiles: kBlockM rows counted from the first row of
// each diagonal block of the mask (the documents of a packed sequence: no row
// of a block sees a key of another), so that no tile straddles two blocks and
// each block's keys start a key tile of their own, as a varlen kernel tiles
// its sequences. With fixed tiles a tile holding the end of one document and
// the start of the next computes the union of both documents' key ranges for
// all its rows (benchmarks/tile_geometry.py: segments, segment_aligned_geometry).
#pragma once

#include <cstdint>
#include <vector>

#include "../flashmask_params.h"
#include "../mask_bounds.h"

namespace flashmask {
namespace cpu {

struct RowTile {
  int batch, head;
  int r0, rows;              // the tile's query rows [r0, r0 + rows)
  int key_start, key_end;    // the keys its rows may see: its block's, or every key
};

// The diagonal blocks of one mask row (startend_row_indices of one batch and
// mask head, seqlen rows and keys): their boundaries, 0 and seqlen included.
// A row s splits the mask where no row >= s sees a key < s and no row < s a
// key >= s: from each column's first and last visible row, a prefix max and a
// suffix min.
std::vector<int> diagonal_block_starts(const int32_t* columns, int64_t col_stride, int num_cols,
                                       bool causal, int seqlen);

// Every (batch, head, query tile) of the call, each (batch, head)'s tiles
// together and heaviest first. Calls with a
// column mask, seqlen_q == seqlen_k and no block_mask tile each diagonal block
// on its own (a block_mask's 128 x 128 blocks need tiles aligned to them);
// the rest take fixed tiles over every key.
std::vector<RowTile> row_tiles(const FwdParams& p, int block_m);

}  // namespace cpu
}  // namespace flashmask
