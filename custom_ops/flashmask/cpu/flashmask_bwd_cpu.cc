// FlashMask backward on the CPU. P is recomputed from the saved LSE, and fully
// masked tiles are skipped exactly as in the forward pass.
//
// Two passes keep it deterministic without atomics or locks: pass 1 owns one
// key block per work item and reduces dK/dV over all query blocks (and the
// query heads of its GQA group); pass 2 owns one query block and reduces dQ
// over the key blocks. Each output element is summed by one thread in a fixed
// order, at the price of recomputing S and dP once more in pass 2.
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

struct BwdScratch {
  std::vector<float> q, dout, kt, vt, k, s, dp, t, acc_a, acc_b;
  // pass 1: each query head's mask summary row and index columns for this key block
  std::vector<const BlockBounds*> head_bounds;
  std::vector<const int32_t*> head_columns;
  void ensure(int padded_dim) {  // the wider of the q/k and v head dims
    if (!q.empty()) return;
    const int64_t rows_by_dim = int64_t(std::max(kBlockM, kBlockN)) * padded_dim;
    q.resize(rows_by_dim);
    dout.resize(rows_by_dim);
    kt.resize(rows_by_dim);
    vt.resize(rows_by_dim);
    k.resize(rows_by_dim);
    s.resize(kBlockM * kBlockN);
    dp.resize(kBlockM * kBlockN);
    t.resize(kBlockM * kBlockN);
    acc_a.resize(rows_by_dim);
    acc_b.resize(rows_by_dim);
  }
};

template <typename T>
const T* row_ptr(const void* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                 int batch, int row, int head) {
  return static_cast<const T*>(base) + batch * batch_stride + row * row_stride +
         head * head_stride;
}

// One tile of the backward recurrence. In: s = (scale Q) K^T and dp = dO V^T
// for query rows [r0, r0 + rows). Out: s = P, dp = dS = P * (dP - Di).
inline void probs_and_dscores(float* s, float* dp, int rows, const float* lse,
                              const float* delta) {
  for (int i = 0; i < kBlockM; ++i) {
    float* s_row = s + i * kBlockN;
    float* dp_row = dp + i * kBlockN;
    if (i >= rows || lse[i] == kNegInf) {  // padding or fully masked row: P = 0
      fill(s_row, kBlockN, 0.f);
      fill(dp_row, kBlockN, 0.f);
      continue;
    }
    const vfloat row_lse = vbroadcast(lse[i]);
    const vfloat row_delta = vbroadcast(delta[i]);
    for (int j = 0; j < kBlockN; j += kLanes) {
      const vfloat prob = vexp(vload(s_row + j) - row_lse);
      vstore(s_row + j, prob);
      vstore(dp_row + j, prob * (vload(dp_row + j) - row_delta));
    }
  }
}

template <typename T>
void bwd_impl(const BwdParams& p) {
  const int dim = p.head_dim;
  const int padded_dim = round_up(dim, 2 * kLanes);
  // v, out and dout have their own head dim (MLA): dP, dV and delta run over it
  const int dim_v = p.value_head_dim();
  const int padded_dim_v = round_up(dim_v, 2 * kLanes);
  const int scratch_dim = std::max(padded_dim, padded_dim_v);
  const int q_blocks = ceil_div(p.seqlen_q, kBlockM);
  const int k_blocks = ceil_div(p.seqlen_k, kBlockN);
  const int group = p.num_heads / p.num_heads_k;
  const BlockBoundsTable bounds(p, kBlockN);

  // delta_i = rowsum(dO * O), the softmax-backward correction term.
  std::vector<float> delta(int64_t(p.batch) * p.num_heads * p.seqlen_q);
  parallel_for(int64_t(p.batch) * p.num_heads, p.num_threads, [&](int64_t bh, int) {
    const int batch = int(bh / p.num_heads), head = int(bh % p.num_heads);
    for (int i = 0; i < p.seqlen_q; ++i) {
      const T* o = row_ptr<T>(p.out, p.o_batch_stride, p.o_row_stride, p.o_head_stride, batch, i,
                              head);
      const T* g = row_ptr<T>(p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride,
                              batch, i, head);
      float sum = 0.f;
      for (int d = 0; d < dim_v; ++d) sum += to_float(o[d]) * to_float(g[d]);
      delta[bh * p.seqlen_q + i] = sum;
    }
  });

  auto lse_of = [&](int batch, int head) {
    return p.softmax_lse + (int64_t(batch) * p.num_heads + head) * p.seqlen_q;
  };
  auto delta_of = [&](int batch, int head) {
    return delta.data() + (int64_t(batch) * p.num_heads + head) * p.seqlen_q;
  };

  // Pass 1: dK, dV per (batch, kv head, key block).
  {
    const int64_t items = int64_t(p.batch) * p.num_heads_k * k_blocks;
    std::vector<BwdScratch> scratch(num_workers(items, p.num_threads));
    parallel_for(items, p.num_threads, [&](int64_t item, int worker) {
      const int k_block = int(item % k_blocks);
      const int head_k = int((item / k_blocks) % p.num_heads_k);
      const int batch = int(item / (int64_t(k_blocks) * p.num_heads_k));
      const int c0 = k_block * kBlockN;
      const int cols = std::min(kBlockN, p.seqlen_k - c0);
      const int first_head = head_k * group;
      // The group's query heads share K/V but may each have a mask head (Hm = H).
      BwdScratch& w = scratch[worker];
      w.head_bounds.resize(group);
      w.head_columns.resize(group);
      for (int g = 0; g < group; ++g) {
        w.head_bounds[g] = bounds.get(mask_summary_row(p, batch, first_head + g), k_block);
        w.head_columns[g] = mask_columns(p, batch, first_head + g);
      }

      w.ensure(scratch_dim);
      float* dk_acc = w.acc_a.data();
      float* dv_acc = w.acc_b.data();
      fill(dk_acc, int64_t(kBlockN) * padded_dim, 0.f);
      fill(dv_acc, int64_t(kBlockN) * padded_dim_v, 0.f);
      load_rows_transposed(w.kt.data(), padded_dim, kBlockN,
                           row_ptr<T>(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                                      batch, c0, head_k),
                           p.k_row_stride, cols, dim);
      load_rows_transposed(w.vt.data(), padded_dim_v, kBlockN,
                           row_ptr<T>(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                                      batch, c0, head_k),
                           p.v_row_stride, cols, dim_v);

      for (int q_block = 0; q_block < q_blocks; ++q_block) {
        const int r0 = q_block * kBlockM;
        const int rows = std::min(kBlockM, p.seqlen_q - r0);
        for (int head = first_head; head < first_head + group; ++head) {
          const TileKind kind = classify_tile(w.head_bounds[head - first_head], p.mask.causal,
                                              p.seqlen_q, p.seqlen_k, r0, r0 + rows, c0, c0 + kBlockN);
          if (kind == TileKind::kSkip || !block_kept(p, batch, head, r0, c0)) continue;
          load_rows(w.q.data(), padded_dim, kBlockM,
                    row_ptr<T>(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, batch, r0,
                               head),
                    p.q_row_stride, rows, dim, p.softmax_scale);
          load_rows(w.dout.data(), padded_dim_v, kBlockM,
                    row_ptr<T>(p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride,
                               batch, r0, head),
                    p.do_row_stride, rows, dim_v);
          gemm<false>(kBlockM, kBlockN, padded_dim, w.q.data(), padded_dim, w.kt.data(), kBlockN,
                      w.s.data(), kBlockN);
          if (kind == TileKind::kPartial) {
            apply_mask(w.s.data(), kBlockN, r0, rows, c0, kBlockN, w.head_columns[head - first_head],
                       p.mask.col_stride,
                       p.mask, p.seqlen_q, p.seqlen_k);
          }
          gemm<false>(kBlockM, kBlockN, padded_dim_v, w.dout.data(), padded_dim_v, w.vt.data(),
                      kBlockN, w.dp.data(), kBlockN);
          probs_and_dscores(w.s.data(), w.dp.data(), rows,
                            lse_of(batch, head) + r0, delta_of(batch, head) + r0);
          // dV += P^T dO ; dK += dS^T (scale Q)
          transpose(w.t.data(), w.s.data(), kBlockM, kBlockN);
          gemm<true>(kBlockN, padded_dim_v, kBlockM, w.t.data(), kBlockM, w.dout.data(),
                     padded_dim_v, dv_acc, padded_dim_v);
          transpose(w.t.data(), w.dp.data(), kBlockM, kBlockN);
          gemm<true>(kBlockN, padded_dim, kBlockM, w.t.data(), kBlockM, w.q.data(), padded_dim,
                     dk_acc, padded_dim);
        }
      }
      store_rows(static_cast<T*>(p.dk) + batch * p.dk_batch_stride + c0 * p.dk_row_stride +
                     head_k * p.dk_head_stride,
                 p.dk_row_stride, dk_acc, padded_dim, cols, dim);
      store_rows(static_cast<T*>(p.dv) + batch * p.dv_batch_stride + c0 * p.dv_row_stride +
                     head_k * p.dv_head_stride,
                 p.dv_row_stride, dv_acc, padded_dim_v, cols, dim_v);
    });
  }

  // Pass 2: dQ per (batch, head, query block).
  {
    const int64_t items = int64_t(p.batch) * p.num_heads * q_blocks;
    std::vector<BwdScratch> scratch(num_workers(items, p.num_threads));
    parallel_for(items, p.num_threads, [&](int64_t item, int worker) {
      const int q_block = q_blocks - 1 - int(item % q_blocks);
      const int head = int((item / q_blocks) % p.num_heads);
      const int batch = int(item / (int64_t(q_blocks) * p.num_heads));
      const int head_k = head / group;
      const int64_t summary_row = mask_summary_row(p, batch, head);
      const int32_t* columns = mask_columns(p, batch, head);
      const int r0 = q_block * kBlockM;
      const int rows = std::min(kBlockM, p.seqlen_q - r0);

      BwdScratch& w = scratch[worker];
      w.ensure(scratch_dim);
      float* dq_acc = w.acc_a.data();
      fill(dq_acc, int64_t(kBlockM) * padded_dim, 0.f);
      load_rows(w.q.data(), padded_dim, kBlockM,
                row_ptr<T>(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, batch, r0,
                           head),
                p.q_row_stride, rows, dim, p.softmax_scale);
      load_rows(w.dout.data(), padded_dim_v, kBlockM,
                row_ptr<T>(p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, batch,
                           r0, head),
                p.do_row_stride, rows, dim_v);

      for (int k_block = 0; k_block < k_blocks; ++k_block) {
        const int c0 = k_block * kBlockN;
        const TileKind kind = classify_tile(bounds.get(summary_row, k_block),
                                            p.mask.causal, p.seqlen_q, p.seqlen_k, r0, r0 + rows,
                                            c0, c0 + kBlockN);
        if (kind == TileKind::kSkip || !block_kept(p, batch, head, r0, c0)) continue;
        const int cols = std::min(kBlockN, p.seqlen_k - c0);
        const T* k = row_ptr<T>(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, batch, c0,
                                head_k);
        load_rows_transposed(w.kt.data(), padded_dim, kBlockN, k, p.k_row_stride, cols, dim);
        load_rows(w.k.data(), padded_dim, kBlockN, k, p.k_row_stride, cols, dim);
        load_rows_transposed(w.vt.data(), padded_dim_v, kBlockN,
                             row_ptr<T>(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                                        batch, c0, head_k),
                             p.v_row_stride, cols, dim_v);
        gemm<false>(kBlockM, kBlockN, padded_dim, w.q.data(), padded_dim, w.kt.data(), kBlockN,
                    w.s.data(), kBlockN);
        if (kind == TileKind::kPartial) {
          apply_mask(w.s.data(), kBlockN, r0, rows, c0, kBlockN, columns, p.mask.col_stride,
                     p.mask, p.seqlen_q, p.seqlen_k);
        }
        gemm<false>(kBlockM, kBlockN, padded_dim_v, w.dout.data(), padded_dim_v, w.vt.data(),
                    kBlockN, w.dp.data(), kBlockN);
        probs_and_dscores(w.s.data(), w.dp.data(), rows,
                          lse_of(batch, head) + r0, delta_of(batch, head) + r0);
        // dQ += dS K
        gemm<true>(kBlockM, padded_dim, kBlockN, w.dp.data(), kBlockN, w.k.data(), padded_dim,
                   dq_acc, padded_dim);
      }
      store_rows(static_cast<T*>(p.dq) + batch * p.dq_batch_stride + r0 * p.dq_row_stride +
                     head * p.dq_head_stride,
                 p.dq_row_stride, dq_acc, padded_dim, rows, dim, p.softmax_scale);
    });
  }
}

}  // namespace
}  // namespace cpu

void run_bwd_cpu(const BwdParams& params) {
  switch (params.dtype) {
    case DType::kFloat32:
      return cpu::bwd_impl<float>(params);
    case DType::kFloat16:
      return cpu::bwd_impl<cpu::Half>(params);
    case DType::kBFloat16:
      return cpu::bwd_impl<cpu::BFloat16>(params);
  }
}

}  // namespace flashmask
