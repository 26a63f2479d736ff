// FlashMask backward, dQ only, query-major: the deterministic replacement for
// the main backward kernel's dQ atomics. One CTA per (query block, head,
// batch), each warp owning kMTiles x 16 query rows (the forward's layout). For
// every key block that is not fully masked it recomputes S = Q K^T and
// dP = dO V^T, forms dS = P * (dP - delta) with P = exp(S * scale - LSE) from
// the forward's LSE and bwd_prepare's delta = rowsum(dO * O), and accumulates
// dQ += dS K in registers. dq_accum is written once at the end, each element by
// one thread, so the sum order never depends on scheduling. bwd_finish applies
// the softmax scale, as for the atomic path.
//
// FlashMask: key blocks are classified as in the forward (skipped without
// loading, partial ones masked elementwise from staged column bounds), from
// the 64-column summary block each lies in (a 32-key block at head dim 256:
// its summary bounds hold for its columns too, so the answer stays
// conservative; causal and the ragged tail use the block's own columns).
// A row with every key masked has LSE = -inf and gets P = 0, so dQ = 0.
//
// K/V schedule (one buffer each): dP = dO V^T runs first, so V[next] loads
// under S, dS and dQ += dS K; K[n] is needed by S and dQ, so K[next] loads
// under the next block's dP.
#pragma once

#include <math_constants.h>

#include "../flashmask_params.h"
#include "../mask_bounds.h"
#include "fast_exp2.cuh"
#include "kernel_traits.h"
#include "mma_utils.cuh"
#include "tile_io.cuh"

namespace flashmask {
namespace cuda {

// kPadded: p.head_dim is narrower than the tiles' (tile_head_dim).
template <typename Traits, bool kPadded = false>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSM)
    flashmask_bwd_dq_kernel(const BwdParams p) {
  using T = typename Traits::Element;
  constexpr int kDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kThreads = Traits::kNThreads;
  constexpr int kNTiles = kBlockN / 8;  // 8-column accumulator tiles of S and dP
  constexpr int kDTiles = kDim / 8;     // 8-column accumulator tiles of dQ
  constexpr int kMTiles = Traits::kMTiles;
  constexpr int kWarpRows = 16 * kMTiles;
  using Tile = SwizzledTile<kDim>;
  // The columns loaded and written (dq_accum's rows are [.., dim]): the tiles' past them are zeros.
  const int dim = kPadded ? p.head_dim : kDim;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + Traits::kSmemQ;
  T* sK = sdO + Traits::kSmemQ;
  T* sV = sK + Traits::kSmemKV;
  ColumnBounds* sCol = reinterpret_cast<ColumnBounds*>(sV + Traits::kSmemKV);

  // The grid is (heads, query blocks, batch), heads fastest
  // (launch_rows_heads_fastest), and the heaviest query blocks (the last ones
  // under causal masks) come first.
  const int m_block = gridDim.y - 1 - blockIdx.y;
  const int head = blockIdx.x;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  const int head_k = head / (p.num_heads / p.num_heads_k);
  const int r0 = m_block * kBlockM;
  const int r1 = min(r0 + kBlockM, seqlen_q);
  const int causal_offset = seqlen_k - seqlen_q;
  const bool causal = p.mask.causal;
  const int k_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  // Key blocks per mask summary block (BwdDQTraits::kBlockN), and summary
  // blocks per row of block_bounds.
  constexpr int kBlocksPerSummary = kMaskBlockN / kBlockN;
  const int summary_blocks = (seqlen_k + kMaskBlockN - 1) / kMaskBlockN;

  int n_end = k_blocks;
  if (causal) {
    const int last_col = r1 - 1 + causal_offset;  // last key the last row sees
    n_end = last_col < 0 ? 0 : min(k_blocks, last_col / kBlockN + 1);
  }

  const bool has_columns = p.mask.startend_row_indices != nullptr;
  const int32_t* columns = mask_columns(p, batch, head);
  const BlockBounds* block_bounds =
      has_columns ? reinterpret_cast<const BlockBounds*>(p.block_bounds) +
                        mask_summary_row(p, batch, head) * summary_blocks
                  : nullptr;
  static_assert(kBlockMaskSize % kBlockM == 0 && kBlockMaskSize % kBlockN == 0,
                "a tile lies inside one block_mask block");
  // This CTA's block_mask row, kept in shared memory and re-read (volatile) at each use:
  // this kernel runs at its register limit, and a pointer held in a register across the
  // loop spilled 28 bytes (block_kept on the params: 32); this way 4 bytes on sm_80, 0 on
  // sm_90a (tests/test_cuda_compile.py allows that much here).
  __shared__ const int32_t* s_block_mask;
  if (tid == 0) s_block_mask = block_mask_row(p, batch, head, r0);
  __syncthreads();
  auto classify = [&](int n) {
    const int32_t* block_mask = *const_cast<const int32_t* volatile*>(&s_block_mask);
    if (block_mask != nullptr && block_mask[n * kBlockN / kBlockMaskSize] == 0) return TileKind::kSkip;
    return classify_tile(has_columns ? &block_bounds[n / kBlocksPerSummary] : nullptr, causal, seqlen_q,
                         seqlen_k, r0, r1, n * kBlockN, n * kBlockN + kBlockN);
  };
  auto next_live_block = [&](int n) {
    while (n < n_end && classify(n) == TileKind::kSkip) ++n;
    return n;
  };

  const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const T* dout =
      static_cast<const T*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + head_k * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + head_k * p.v_head_stride;

  // Groups: {Q, dO, V[n]} then {K[n]}; every later iteration commits one V and
  // one K group, so "all but the newest group" is always the one needed next.
  load_tile_async<kBlockM, kDim, kThreads, kPadded>(sQ, q + int64_t(r0) * p.q_row_stride, p.q_row_stride,
                                                    r1 - r0, tid, dim);
  load_tile_async<kBlockM, kDim, kThreads, kPadded>(sdO, dout + int64_t(r0) * p.do_row_stride,
                                                    p.do_row_stride, r1 - r0, tid, dim);
  int n = next_live_block(0);
  if (n < n_end) {
    load_tile_async<kBlockN, kDim, kThreads, kPadded>(sV, v + int64_t(n) * kBlockN * p.v_row_stride,
                                                      p.v_row_stride, seqlen_k - n * kBlockN, tid, dim);
  }
  cp_async_commit();
  if (n < n_end) {
    load_tile_async<kBlockN, kDim, kThreads, kPadded>(sK, k + int64_t(n) * kBlockN * p.k_row_stride,
                                                      p.k_row_stride, seqlen_k - n * kBlockN, tid, dim);
  }
  cp_async_commit();

  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const int warp_row0 = warp * kWarpRows;       // within the block
  const int row_a = r0 + warp_row0 + lane / 4;  // + mt * 16 + h * 8

  // This thread's rows' LSE (log2 domain) and delta, fixed for the whole CTA.
  // Rows past seqlen_q act as fully masked (P = 0).
  const float* lse = p.softmax_lse + (int64_t(batch) * p.num_heads + head) * seqlen_q;
  const float* delta = p.softmax_d + (int64_t(batch) * p.num_heads + head) * seqlen_q;
  float row_lse[kMTiles][2], row_delta[kMTiles][2];
  float acc_dq[kMTiles][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_a + mt * 16 + h * 8;
      // +inf for a row that sees no key (LSE -inf) or lies past seqlen_q:
      // exp2(S * scale - inf) = 0 with no test per element.
      const float l = row < seqlen_q ? lse[row] : -CUDART_INF_F;
      row_lse[mt][h] = l == -CUDART_INF_F ? CUDART_INF_F : l * 1.4426950408889634f;
      row_delta[mt][h] = row < seqlen_q ? delta[row] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kDTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dq[mt][j][e] = 0.f;
  }

  // acc = A B^T for the warp's rows x kBlockN keys: S = Q K^T and dP = dO V^T, A and B
  // swizzled tiles in shared memory at a_base / b_base. A fragments are re-read per block
  // (registers go to the accumulators); each B fragment feeds kMTiles MMAs.
  auto rows_times_keys = [&](float (&acc)[kMTiles][kNTiles][4], uint32_t a_base, uint32_t b_base, int ln) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;
#pragma unroll 1
    for (int kk = 0; kk < kDim / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ldmatrix_x4(a[mt], a_base + 2 * Tile::offset(warp_row0 + mt * 16 + ln % 16, kk * 16 + (ln / 16) * 8));
      }
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t b[4];
        ldmatrix_x4(b, b_base + 2 * Tile::offset(nn * 16 + ln % 8 + (ln / 16) * 8,
                                                 kk * 16 + ((ln / 8) % 2) * 8));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(acc[mt][2 * nn], a[mt], b[0], b[1]);
          mma_16816<T>(acc[mt][2 * nn + 1], a[mt], b[2], b[3]);
        }
      }
    }
  };

  while (n < n_end) {
    const TileKind kind = classify(n);
    const int c0 = n * kBlockN;
    if (kind == TileKind::kPartial && has_columns) {
      stage_column_bounds<kBlockN>(sCol, columns, p.mask, c0, seqlen_q, seqlen_k, tid);
    }
    cp_async_wait<1>();  // Q, dO and V[n] have landed (K[n] may be in flight)
    __syncthreads();

    // lane and bases re-read opaquely each block, so fragment addresses are
    // recomputed where used rather than hoisted into dozens of live registers.
    int ln = int(opaque(uint32_t(lane)));
    const uint32_t do_base = opaque(smem_addr(sdO));
    const uint32_t v_base = opaque(smem_addr(sV));
    // dP = dO V^T for the warp's rows x kBlockN keys.
    float acc_dp[kMTiles][kNTiles][4];
    rows_times_keys(acc_dp, do_base, v_base, ln);

    __syncthreads();  // every warp is done with sV
    const int n_next = next_live_block(n + 1);
    if (n_next < n_end) {
      load_tile_async<kBlockN, kDim, kThreads, kPadded>(sV, v + int64_t(n_next) * kBlockN * p.v_row_stride,
                                                        p.v_row_stride, seqlen_k - n_next * kBlockN, tid, dim);
    }
    cp_async_commit();
    cp_async_wait<1>();  // K[n] has landed
    __syncthreads();

    ln = int(opaque(uint32_t(lane)));
    const uint32_t q_base = opaque(smem_addr(sQ));
    const uint32_t k_base = opaque(smem_addr(sK));
    // S = Q K^T.
    float acc_s[kMTiles][kNTiles][4];
    rows_times_keys(acc_s, q_base, k_base, ln);

    // dS = P * (dP - delta), P = exp(S * scale - LSE); written over acc_s.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          const int row = row_a + mt * 16 + h * 8;
          const int col = c0 + j * 8 + (lane % 4) * 2 + (e % 2);
          const bool masked =
              kind == TileKind::kPartial &&
              element_masked(sCol, has_columns, causal, causal_offset, seqlen_k, row, col, c0);
          const float prob = masked ? 0.f : fast_exp2(acc_s[mt][j][e] * scale_log2 - row_lse[mt][h]);
          acc_s[mt][j][e] = prob * (acc_dp[mt][j][e] - row_delta[mt][h]);
        }
      }
    }

    // dQ += dS K, dS taken straight from the accumulators as the A operand.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = pack2<T>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        a[mt][1] = pack2<T>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        a[mt][2] = pack2<T>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<T>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dd = 0; dd < kDim / 16; ++dd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, k_base + 2 * Tile::offset(kk * 16 + ln % 8 + ((ln / 8) % 2) * 8,
                                                       dd * 16 + (ln / 16) * 8));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(acc_dq[mt][2 * dd], a[mt], b[0], b[1]);
          mma_16816<T>(acc_dq[mt][2 * dd + 1], a[mt], b[2], b[3]);
        }
      }
    }

    __syncthreads();  // every warp is done with sK and sCol
    if (n_next < n_end) {
      load_tile_async<kBlockN, kDim, kThreads, kPadded>(sK, k + int64_t(n_next) * kBlockN * p.k_row_stride,
                                                        p.k_row_stride, seqlen_k - n_next * kBlockN, tid, dim);
    }
    cp_async_commit();
    n = n_next;
  }
  cp_async_wait<0>();

  // Every row of the block is written, also those whose keys were all skipped
  // (dQ = 0 there), so dq_accum needs no zeroing beforehand.
  float* dq_accum = p.dq_accum + (int64_t(batch) * seqlen_q * p.num_heads + head) * dim;
  const int64_t dq_row_stride = int64_t(p.num_heads) * dim;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_a + mt * 16 + h * 8;
      if (row >= seqlen_q) continue;
      float* dst = dq_accum + row * dq_row_stride + (lane % 4) * 2;
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        if (kPadded && j * 8 >= dim) break;
        *reinterpret_cast<float2*>(dst + j * 8) =
            make_float2(acc_dq[mt][j][2 * h], acc_dq[mt][j][2 * h + 1]);
      }
    }
  }
}

}  // namespace cuda
}  // namespace flashmask
