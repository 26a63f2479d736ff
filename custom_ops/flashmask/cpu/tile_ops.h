// Tile-level building blocks of the CPU kernels: fp32 tile loads with zero
// padding, a register-blocked GEMM micro-kernel, row softmax pieces and the
// elementwise FlashMask for partially masked tiles.
#pragma once

#include <cstdint>
#include <limits>

#include "../mask_bounds.h"
#include "numeric.h"

namespace flashmask {
namespace cpu {

constexpr int kBlockM = 64;  // query rows per tile
constexpr int kBlockN = 64;  // key columns per tile (== mask summary block)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }
inline int ceil_div(int64_t x, int m) { return int((x + m - 1) / m); }

// dst[r][d] = scale * src[r][d] for r < rows, d < dim; zeros elsewhere in the
// [total_rows x ld] tile. Padding keeps every GEMM a multiple of 16 wide.
template <typename T>
void load_rows(float* dst, int ld, int total_rows, const T* src, int64_t row_stride,
               int rows, int dim, float scale = 1.f) {
  for (int r = 0; r < total_rows; ++r) {
    float* d = dst + int64_t(r) * ld;
    int c = 0;
    if (r < rows) {
      const T* s = src + r * row_stride;
      for (; c < dim; ++c) d[c] = scale * to_float(s[c]);
    }
    for (; c < ld; ++c) d[c] = 0.f;
  }
}

// dst[d][r] = src[r][d]: a [ld_rows x total_rows] tile (head dim major), so
// Q * K^T becomes a row-major GEMM with contiguous inner loads.
template <typename T>
void load_rows_transposed(float* dst, int padded_dim, int total_rows, const T* src,
                          int64_t row_stride, int rows, int dim) {
  for (int d = 0; d < padded_dim; ++d) {
    float* out = dst + int64_t(d) * total_rows;
    for (int r = 0; r < total_rows; ++r) out[r] = 0.f;
  }
  for (int r = 0; r < rows; ++r) {
    const T* s = src + r * row_stride;
    for (int d = 0; d < dim; ++d) dst[int64_t(d) * total_rows + r] = to_float(s[d]);
  }
}

template <typename T>
void store_rows(T* dst, int64_t row_stride, const float* src, int ld, int rows, int dim,
                float scale = 1.f) {
  for (int r = 0; r < rows; ++r) {
    T* d = dst + r * row_stride;
    const float* s = src + int64_t(r) * ld;
    for (int c = 0; c < dim; ++c) d[c] = from_float<T>(scale * s[c]);
  }
}

inline void transpose(float* dst, const float* src, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[int64_t(c) * rows + r] = src[int64_t(r) * cols + c];
}

inline void fill(float* dst, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) dst[i] = value;
}

// C[M x N] (+)= A[M x K] * B[K x N], all row-major fp32.
// Requires M % 4 == 0 and N % 16 == 0 (tiles are padded to guarantee it).
template <bool kAccumulate>
void gemm(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
          int ldc) {
  for (int i = 0; i < M; i += 4) {
    const float* a0 = A + int64_t(i) * lda;
    const float* a1 = a0 + lda;
    const float* a2 = a1 + lda;
    const float* a3 = a2 + lda;
    for (int j = 0; j < N; j += 2 * kLanes) {
      vfloat c00 = vbroadcast(0.f), c01 = c00, c10 = c00, c11 = c00;
      vfloat c20 = c00, c21 = c00, c30 = c00, c31 = c00;
      const float* b = B + j;
      for (int k = 0; k < K; ++k, b += ldb) {
        const vfloat b0 = vload(b);
        const vfloat b1 = vload(b + kLanes);
        vfloat a = vbroadcast(a0[k]);
        c00 += a * b0;
        c01 += a * b1;
        a = vbroadcast(a1[k]);
        c10 += a * b0;
        c11 += a * b1;
        a = vbroadcast(a2[k]);
        c20 += a * b0;
        c21 += a * b1;
        a = vbroadcast(a3[k]);
        c30 += a * b0;
        c31 += a * b1;
      }
      float* c = C + int64_t(i) * ldc + j;
      const vfloat acc[4][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
      for (int r = 0; r < 4; ++r, c += ldc) {
        if (kAccumulate) {
          vstore(c, vload(c) + acc[r][0]);
          vstore(c + kLanes, vload(c + kLanes) + acc[r][1]);
        } else {
          vstore(c, acc[r][0]);
          vstore(c + kLanes, acc[r][1]);
        }
      }
    }
  }
}

// Sets to -inf every score of the [rows x cols] tile (query rows from r0, key
// columns from c0) that the mask hides. `indices` points at this (batch, mask
// head)'s [seqlen_k, C] block, or is null.
inline void apply_mask(float* S, int ld, int r0, int rows, int c0, int cols,
                       const int32_t* indices, int64_t col_stride, const MaskParams& mask,
                       int seqlen_q, int seqlen_k) {
  const int causal_offset = seqlen_k - seqlen_q;
  for (int jj = 0; jj < cols; ++jj) {
    const int j = c0 + jj;
    float* col = S + jj;
    if (j >= seqlen_k) {  // overhang of the ragged last key block
      for (int ii = 0; ii < rows; ++ii) col[int64_t(ii) * ld] = kNegInf;
      continue;
    }
    // Rows below `first_visible` are hidden by causality.
    int first_visible = mask.causal ? j - causal_offset : 0;
    for (int ii = 0; ii < rows && r0 + ii < first_visible; ++ii) col[int64_t(ii) * ld] = kNegInf;
    if (indices == nullptr) continue;
    const ColumnBounds b =
        load_column_bounds(indices + j * col_stride, mask.num_cols, mask.causal, seqlen_q);
    const int intervals[2][2] = {{b.lts, b.lte}, {b.uts, b.ute}};
    for (const auto& iv : intervals) {
      const int lo = iv[0] > r0 ? iv[0] - r0 : 0;
      const int hi = iv[1] - r0 < rows ? iv[1] - r0 : rows;
      for (int ii = lo; ii < hi; ++ii) col[int64_t(ii) * ld] = kNegInf;
    }
  }
}

}  // namespace cpu
}  // namespace flashmask
