// Small data-movement ops for context-parallel attention, framework-neutral.
//
// Context parallelism runs where the framework's own GPU kernels may not run,
// so every remap, merge, sum and gather it needs is one of these. Each op has
// a CPU version (throws std::invalid_argument on bad values) and a CUDA one
// (`stream` is a cudaStream_t; cannot throw on values, see each op). Shapes
// are checked by the framework glue; all tensors are contiguous and element
// offsets are int64 (1M tokens x 32 heads x 128 dims overflows int32).
#pragma once

#include <cstdint>

#include "flashmask_params.h"

namespace flashmask {

// Rewrites a FlashMask column mask for one rank's rows and keys.
//
// The rank holds a sorted subset of the global query rows made of whole
// chunks of chunk_size rows; row_table[c] (c in [0, num_chunks]) is the
// number of its rows before global chunk c. ss(g) = the number of the rank's
// rows < g maps a global row bound to a local one. For each local key column
// jj (global key key_rows[jj]) the output gives the same masked rows in local
// coordinates, always in the causal=False form (cp_remap_column below).
// key_rows[jj] == kCpNoKey marks a padding slot (a part's keys spaced out so
// that no key block mixes far-apart row ranges): its column hides every row
// with both bands covering all of them, so it widens no block summary.
constexpr int64_t kCpNoKey = -1;

struct CpRemapParams {
  const int32_t* indices = nullptr;  // [batch, heads, seqlen, num_cols]; nullptr: absent (causal only)
  int64_t batch = 1, heads = 1;      // of indices (1, 1 when absent)
  int num_cols = 0;                  // C of indices (0 when absent)
  bool causal = false;
  int seqlen = 0;                    // global S
  const int64_t* key_rows = nullptr;  // [num_keys], global key ids in [0, S)
  int64_t num_keys = 0;
  const int32_t* row_table = nullptr;  // [num_chunks + 1]
  int num_chunks = 0;                  // ceil(S / chunk_size)
  int chunk_size = 0;
  int32_t* out = nullptr;  // [batch, heads, num_keys, out_cols]
  int out_cols = 0;        // 2 * C when causal (2 when absent), else C
};

// ss(g) for a global row bound g (clamped to [0, S]): the rank's rows < g.
FLASHMASK_HOST_DEVICE int32_t cp_local_row(const CpRemapParams& p, int64_t g) {
  g = g < 0 ? 0 : (g > p.seqlen ? p.seqlen : g);
  const int64_t c = g / p.chunk_size;
  if (c >= p.num_chunks) return p.row_table[p.num_chunks];
  const int64_t held = int64_t(p.row_table[c + 1]) - p.row_table[c];
  const int64_t offset = g - c * p.chunk_size;
  return int32_t(p.row_table[c] + (offset < held ? offset : held));
}

// One output column from the mask column `col` (nullptr: absent) of global
// key g. Causal masks rows i < g on top of the column's own bounds, which the
// non-causal form expresses as an upper band [0, ss(g)).
FLASHMASK_HOST_DEVICE void cp_remap_column(const CpRemapParams& p, const int32_t* col, int64_t g,
                                           int32_t* dst) {
  if (g == kCpNoKey) {  // [0, L] or [0, L, 0, L]: every band masks all L rows
    for (int k = 0; k < p.out_cols; k += 2) {
      dst[k] = 0;
      dst[k + 1] = p.row_table[p.num_chunks];
    }
  } else if (col == nullptr) {  // causal only: [L, ss(g)]
    dst[0] = p.row_table[p.num_chunks];
    dst[1] = cp_local_row(p, g);
  } else if (p.causal && p.num_cols == 1) {  // [ss(LTS), ss(g)]
    dst[0] = cp_local_row(p, col[0]);
    dst[1] = cp_local_row(p, g);
  } else if (p.causal) {  // C = 2: [ss(LTS), ss(LTE), 0, ss(g)]
    dst[0] = cp_local_row(p, col[0]);
    dst[1] = cp_local_row(p, col[1]);
    dst[2] = 0;
    dst[3] = cp_local_row(p, g);
  } else {  // C = 2 or 4: every bound mapped
    for (int k = 0; k < p.num_cols; ++k) dst[k] = cp_local_row(p, col[k]);
  }
}

void cp_remap_indices_cpu(const CpRemapParams& p);
// key_rows are not checked here (the Python layer builds them); the kernel
// clamps each but kCpNoKey to [0, S - 1] so no read goes out of bounds.
void cp_remap_indices_cuda(const CpRemapParams& p, void* stream);

// Merges two partial attention results over disjoint key sets:
// out_* [rows, heads, head_dim] (rows = batch x L), lse_* [batch, heads, L].
// Per row: m = max(la, lb); m == -inf gives out 0 and lse -inf, else
// lse = m + log(wa + wb), out = (wa oa + wb ob) / (wa + wb) with
// w = exp(l - m), in fp32.
struct CpMergeParams {
  DType dtype = DType::kFloat32;
  const void* out_a = nullptr;
  const void* out_b = nullptr;
  const float* lse_a = nullptr;
  const float* lse_b = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;  // out_* is [batch, seqlen, heads, head_dim]
};
void cp_merge_cpu(const CpMergeParams& p);
void cp_merge_cuda(const CpMergeParams& p, void* stream);

// out = a + b_0 + ... + b_{pieces-1} over n elements, summed in fp32 in that
// order: b holds `pieces` arrays of n elements back to back (the dK/dV pieces
// every other rank sends back for this rank's keys).
void cp_accumulate_cpu(DType dtype, const void* a, const void* b, void* out, int64_t n,
                       int64_t pieces);
void cp_accumulate_cuda(DType dtype, const void* a, const void* b, void* out, int64_t n,
                        int64_t pieces, void* stream);

// Copies units of unit_bytes: unit n of out is unit src[n] of x (x holds
// x_units units), or zeros where src[n] == kCpZeroUnit (scatters as gathers:
// a key's dK from a peer that did not need the key is zero). Dtype-free: only
// bytes move (all-zero bytes are 0 in every float type).
constexpr int64_t kCpZeroUnit = -1;
void cp_gather_units_cpu(const void* x, int64_t x_units, const int64_t* src, int64_t n,
                         int64_t unit_bytes, void* out);
// Any other out-of-range src[n] writes a zero unit too (a kernel cannot
// throw; the Python layer computes src itself).
void cp_gather_units_cuda(const void* x, int64_t x_units, const int64_t* src, int64_t n,
                          int64_t unit_bytes, void* out, void* stream);

// Concatenates `pieces` tensors along one axis. Piece i is `outer` rows of
// lens[i] x inner_bytes bytes; out is `outer` rows of (sum of lens) x
// inner_bytes, the pieces side by side in each row. Dtype-free.
struct CpConcatParams {
  const void* const* xs = nullptr;  // [pieces] base pointers
  const int64_t* lens = nullptr;    // [pieces] lengths along the axis
  int pieces = 0;
  int64_t outer = 1;        // product of the dims before the axis
  int64_t inner_bytes = 0;  // bytes of one step along the axis (dims after it x element size)
  void* out = nullptr;
};
void cp_concat_cpu(const CpConcatParams& p);
// One cudaMemcpy2DAsync per piece, or 1D copies per outer row where the pitch is
// beyond what 2D copies take (no kernel); `stream` is a cudaStream_t.
void cp_concat_cuda(const CpConcatParams& p, void* stream);

}  // namespace flashmask
