// FlashMask forward on the CPU: FlashAttention-2 style online softmax over key
// blocks with fp32 accumulators, one work item per (batch, head, query block).
// Fully masked tiles are skipped before any load; only partially masked tiles
// pay for the elementwise mask.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../flashmask_api.h"
#include "block_bounds_cpu.h"
#include "parallel.h"
#include "tile_ops.h"

namespace flashmask {
namespace cpu {
namespace {

struct FwdScratch {
  std::vector<float> q, kt, v, s, acc, row_max, row_sum;
  void ensure(int padded_dim, int padded_dim_v) {
    if (!q.empty()) return;
    q.resize(kBlockM * padded_dim);
    kt.resize(padded_dim * kBlockN);
    v.resize(kBlockN * padded_dim_v);
    s.resize(kBlockM * kBlockN);
    acc.resize(kBlockM * padded_dim_v);
    row_max.resize(kBlockM);
    row_sum.resize(kBlockM);
  }
};

// Whether the row holds a NaN score (masked scores are -inf, never NaN).
inline bool has_nan(const float* s, int n) {
  for (int j = 0; j < n; ++j) {
    if (s[j] != s[j]) return true;
  }
  return false;
}

// Online-softmax update of one score row: turns s into P = exp(s - new max),
// rescales the running sum and returns the factor for the accumulator.
// The max skips NaN scores; a NaN beside finite scores still reaches P through
// exp, and a row whose visible scores are all NaN (a NaN in the query, or in
// every visible key) is made NaN here, as the dense softmax would, rather than
// read as a row with nothing visible (zeros, LSE -inf), which would hide it.
inline float softmax_update_row(float* s, float& row_max, float& row_sum) {
  vfloat vmax = vbroadcast(kNegInf);
  for (int j = 0; j < kBlockN; j += kLanes) {
    const vfloat x = vload(s + j);
    vmax = x > vmax ? x : vmax;
  }
  float tile_max = kNegInf;
  for (int l = 0; l < kLanes; ++l) tile_max = std::max(tile_max, vmax[l]);
  const float new_max = std::max(row_max, tile_max);
  if (new_max == kNegInf) {  // nothing visible in this row yet, or only NaN scores
    if (has_nan(s, kBlockN)) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      row_max = row_sum = nan;
      fill(s, kBlockN, nan);
      return nan;
    }
    fill(s, kBlockN, 0.f);
    return 1.f;
  }
  const float alpha = row_max == kNegInf ? 0.f : std::exp(row_max - new_max);
  vfloat vsum = vbroadcast(0.f);
  for (int j = 0; j < kBlockN; j += kLanes) {
    const vfloat p = vexp(vload(s + j) - new_max);
    vstore(s + j, p);
    vsum += p;
  }
  float tile_sum = 0.f;
  for (int l = 0; l < kLanes; ++l) tile_sum += vsum[l];
  row_sum = row_sum * alpha + tile_sum;
  row_max = new_max;
  return alpha;
}

template <typename T>
void fwd_impl(const FwdParams& p) {
  const int dim = p.head_dim;
  const int padded_dim = round_up(dim, 2 * kLanes);
  const int dim_v = p.value_head_dim();
  const int padded_dim_v = round_up(dim_v, 2 * kLanes);
  const int q_blocks = ceil_div(p.seqlen_q, kBlockM);
  const int k_blocks = ceil_div(p.seqlen_k, kBlockN);
  const int group = p.num_heads / p.num_heads_k;
  const BlockBoundsTable bounds(p, kBlockN);

  const int64_t items = int64_t(p.batch) * p.num_heads * q_blocks;
  std::vector<FwdScratch> scratch(num_workers(items, p.num_threads));

  parallel_for(items, p.num_threads, [&](int64_t item, int worker) {
    // Last query blocks first: under causal masks they carry the most work.
    const int q_block = q_blocks - 1 - int(item % q_blocks);
    const int head = int((item / q_blocks) % p.num_heads);
    const int batch = int(item / (int64_t(q_blocks) * p.num_heads));
    const int head_k = head / group;
    const int64_t summary_row = mask_summary_row(p, batch, head);
    const int r0 = q_block * kBlockM;
    const int rows = std::min(kBlockM, p.seqlen_q - r0);

    FwdScratch& w = scratch[worker];
    w.ensure(padded_dim, padded_dim_v);
    const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + r0 * p.q_row_stride +
                 head * p.q_head_stride;
    load_rows(w.q.data(), padded_dim, kBlockM, q, p.q_row_stride, rows, dim, p.softmax_scale);
    fill(w.row_max.data(), kBlockM, kNegInf);
    fill(w.row_sum.data(), kBlockM, 0.f);
    fill(w.acc.data(), int64_t(kBlockM) * padded_dim_v, 0.f);
    const int32_t* columns = mask_columns(p, batch, head);

    for (int k_block = 0; k_block < k_blocks; ++k_block) {
      const int c0 = k_block * kBlockN;
      const TileKind kind = classify_tile(bounds.get(summary_row, k_block), p.mask.causal,
                                          p.seqlen_q, p.seqlen_k, r0, r0 + rows, c0, c0 + kBlockN);
      if (kind == TileKind::kSkip || !block_kept(p, batch, head, r0, c0)) continue;
      const int cols = std::min(kBlockN, p.seqlen_k - c0);
      const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + c0 * p.k_row_stride +
                   head_k * p.k_head_stride;
      const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + c0 * p.v_row_stride +
                   head_k * p.v_head_stride;
      load_rows_transposed(w.kt.data(), padded_dim, kBlockN, k, p.k_row_stride, cols, dim);
      gemm<false>(kBlockM, kBlockN, padded_dim, w.q.data(), padded_dim, w.kt.data(), kBlockN,
                  w.s.data(), kBlockN);
      if (kind == TileKind::kPartial) {
        apply_mask(w.s.data(), kBlockN, r0, rows, c0, kBlockN, columns, p.mask.col_stride,
                   p.mask, p.seqlen_q, p.seqlen_k);
      }
      for (int i = 0; i < kBlockM; ++i) {
        float* s_row = w.s.data() + i * kBlockN;
        if (i >= rows) {  // padding rows contribute nothing
          fill(s_row, kBlockN, 0.f);
          continue;
        }
        const float alpha = softmax_update_row(s_row, w.row_max[i], w.row_sum[i]);
        if (alpha != 1.f) {
          float* acc_row = w.acc.data() + int64_t(i) * padded_dim_v;
          for (int d = 0; d < padded_dim_v; ++d) acc_row[d] *= alpha;
        }
      }
      load_rows(w.v.data(), padded_dim_v, kBlockN, v, p.v_row_stride, cols, dim_v);
      gemm<true>(kBlockM, padded_dim_v, kBlockN, w.s.data(), kBlockN, w.v.data(), padded_dim_v,
                 w.acc.data(), padded_dim_v);
    }

    T* out = static_cast<T*>(p.out) + batch * p.o_batch_stride + r0 * p.o_row_stride +
             head * p.o_head_stride;
    float* lse = p.softmax_lse + (int64_t(batch) * p.num_heads + head) * p.seqlen_q + r0;
    for (int i = 0; i < rows; ++i) {
      // A row with every key masked outputs 0 and has lse = -inf.
      const bool empty = w.row_sum[i] == 0.f;
      const float inv = empty ? 0.f : 1.f / w.row_sum[i];
      lse[i] = empty ? kNegInf : w.row_max[i] + std::log(w.row_sum[i]);
      float* acc_row = w.acc.data() + int64_t(i) * padded_dim_v;
      for (int d = 0; d < dim_v; ++d) acc_row[d] *= inv;
    }
    store_rows(out, p.o_row_stride, w.acc.data(), padded_dim_v, rows, dim_v);
  });
}

}  // namespace
}  // namespace cpu

void run_fwd_cpu(const FwdParams& params) {
  switch (params.dtype) {
    case DType::kFloat32:
      return cpu::fwd_impl<float>(params);
    case DType::kFloat16:
      return cpu::fwd_impl<cpu::Half>(params);
    case DType::kBFloat16:
      return cpu::fwd_impl<cpu::BFloat16>(params);
  }
}

}  // namespace flashmask
