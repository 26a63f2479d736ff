// FlashMask backward, FA2 class: one CTA per (key block, query head, batch),
// each warp owning 16 keys of the block. The warp computes the transposed
// tiles S^T = K Q^T and dP^T = V dO^T, so P^T and dS^T come out of the
// accumulators already in the A-operand layout for dV += P^T dO and
// dK += dS^T Q. dS^T goes through shared memory once for dQ += dS K, which is
// accumulated in fp32 with atomics (as FA2 does) into the query block's tile
// of the tiled dq_accum (dq_tile_layout.h), one 128-byte RED per accumulator
// register and warp. In deterministic mode the dQ part is skipped
// (flashmask_bwd_dq_kernel.cuh computes dQ without atomics) and dK/dV go to
// this query head's own accumulator slot.
//
// Each query block's LSE and delta come with its Q/dO by cp.async from
// BwdParams::row_stats, where rows that see no key and padding rows have
// LSE = +inf: P = exp2(S * scale_log2 - LSE) is 0 there without a test.
//
// FlashMask: the query-block range starts at the first row the causal
// diagonal lets see this key block, and every query block is classified from
// the block min/max: fully masked ones are skipped wherever they are
// (including bands in the middle from LTE/UTS), partial ones mask elementwise
// from the column bounds, which are staged once since the key block is fixed.
#pragma once

#include "../flashmask_params.h"
#include "../mask_bounds.h"
#include "bwd_grid.h"
#include "kernel_traits.h"
#include "mma_utils.cuh"
#include "tile_io.cuh"

namespace flashmask {
namespace cuda {

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads)
    flashmask_bwd_kernel(const BwdParams p) {
  using T = typename Traits::Element;
  constexpr int kDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kThreads = Traits::kNThreads;
  constexpr int kQTiles = kBlockM / 8;  // 8-query accumulator tiles of S^T
  constexpr int kDTiles = kDim / 8;
  using Tile = SwizzledTile<kDim>;
  using DSTile = SwizzledTile<kBlockM>;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + Traits::kSmemKV;
  T* sQbuf = sV + Traits::kSmemKV;        // 2 buffers: the next block loads
  T* sdObuf = sQbuf + 2 * Traits::kSmemQ;  // while this one is computed
  T* sdS = sdObuf + 2 * Traits::kSmemQ;   // dS^T: [keys][queries]
  // 2 buffers of kBlockM LSE then kBlockM delta floats, with Q/dO.
  float* sStatsBuf = reinterpret_cast<float*>(sdS + Traits::kSmemDS);
  ColumnBounds* sCol = reinterpret_cast<ColumnBounds*>(sStatsBuf + 4 * kBlockM);

  // The grid's order: bwd_grid.h (the last key blocks of every head deferred;
  // this kernel, for A/B timing, takes no CTA order).
  const BwdCta cta = bwd_cta_of(p, (p.seqlen_k + kBlockN - 1) / kBlockN, blockIdx.x, blockIdx.y, blockIdx.z);
  if (!cta.live) return;
  const int n_block = cta.n_block;
  const int head = cta.head;
  const int batch = cta.batch;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  const int head_k = head / (p.num_heads / p.num_heads_k);
  const int mask_head = p.mask.num_heads == 1 ? 0 : head / (p.num_heads / p.mask.num_heads);
  const int c0 = n_block * kBlockN;
  const int causal_offset = seqlen_k - seqlen_q;
  const bool causal = p.mask.causal;
  const int q_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  const bool with_dq = !p.deterministic;  // else dQ is the query-major kernel's

  const bool has_columns = p.mask.startend_row_indices != nullptr;
  const int mask_batch = p.mask.batch_stride == 0 ? 0 : batch;
  const int32_t* columns = has_columns ? p.mask.startend_row_indices +
                                             mask_batch * p.mask.batch_stride +
                                             mask_head * p.mask.head_stride
                                       : nullptr;
  // The key tile spans kBlockN / kMaskBlockN summary blocks: merge their bounds.
  BlockBounds tile_bounds = empty_block_bounds();
  if (has_columns) {
    const int summary_blocks = (seqlen_k + kMaskBlockN - 1) / kMaskBlockN;
    const BlockBounds* table = reinterpret_cast<const BlockBounds*>(p.block_bounds) +
                               (int64_t(mask_batch) * p.mask.num_heads + mask_head) * summary_blocks;
    for (int s = c0 / kMaskBlockN; s < min(summary_blocks, (c0 + kBlockN) / kMaskBlockN); ++s) {
      tile_bounds = merge_block_bounds(tile_bounds, table[s]);
    }
  }


  // Rows before the first one that sees key c0 are masked by causality.
  int m_begin = 0;
  if (causal) m_begin = max(0, c0 - causal_offset) / kBlockM;

  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + head_k * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + head_k * p.v_head_stride;
  const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const T* dout =
      static_cast<const T*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
  // This (batch, head)'s LSE rows in row_stats (whole 64-row blocks; delta
  // the same rows delta_plane floats on).
  static_assert(kBlockM == kBwdRowBlock, "a query block is one row_stats block and one dQ tile");
  const int64_t stats_rows = bwd_padded_rows(seqlen_q);
  const float* lse = p.row_stats + (int64_t(batch) * p.num_heads + head) * stats_rows;
  const int64_t delta_plane = int64_t(p.batch) * p.num_heads * stats_rows;

  load_tile_async<kBlockN, kDim, kThreads>(sK, k + int64_t(c0) * p.k_row_stride, p.k_row_stride,
                                           seqlen_k - c0, tid);
  load_tile_async<kBlockN, kDim, kThreads>(sV, v + int64_t(c0) * p.v_row_stride, p.v_row_stride,
                                           seqlen_k - c0, tid);
  cp_async_commit();
  if (has_columns) {
    stage_column_bounds<kBlockN>(sCol, columns, p.mask, c0, seqlen_q, seqlen_k, tid);
  }

  float acc_dk[kDTiles][4], acc_dv[kDTiles][4];
#pragma unroll
  for (int j = 0; j < kDTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[j][e] = acc_dv[j][e] = 0.f;

  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const int key_a = c0 + warp * 16 + lane / 4;  // this thread's keys: key_a, key_a + 8

  static_assert(kBlockMaskSize % kBlockM == 0 && kBlockMaskSize % kBlockN == 0,
                "a tile lies inside one block_mask block");
  // This CTA's block_mask column (its key block's entry in row block 0), in shared memory
  // and re-read at each use: the kernel runs at the register limit (head dim 128) and a
  // value held across the loop spilled.
  __shared__ const int32_t* s_block_mask;
  if (tid == 0) s_block_mask = block_mask_row(p, batch, head, 0) == nullptr
                                   ? nullptr
                                   : block_mask_row(p, batch, head, 0) + c0 / kBlockMaskSize;
  __syncthreads();
  auto classify = [&](int m) {
    const int32_t* block_mask = *const_cast<const int32_t* volatile*>(&s_block_mask);
    if (block_mask != nullptr &&
        block_mask[int64_t(m * kBlockM / kBlockMaskSize) * p.block_mask.col_blocks] == 0)
      return TileKind::kSkip;
    return classify_tile(has_columns, tile_bounds, causal, seqlen_q, seqlen_k, m * kBlockM,
                         min(m * kBlockM + kBlockM, seqlen_q), c0, c0 + kBlockN);
  };
  auto next_live_block = [&](int m) {
    while (m < q_blocks && classify(m) == TileKind::kSkip) ++m;
    return m;
  };
  // Q, dO and the row statistics of query block m into buffer `buf`.
  auto load_query_block = [&](int m, int buf) {
    const int r0 = m * kBlockM;
    const int rows = min(kBlockM, seqlen_q - r0);
    load_tile_async<kBlockM, kDim, kThreads>(sQbuf + buf * Traits::kSmemQ,
                                             q + int64_t(r0) * p.q_row_stride, p.q_row_stride,
                                             rows, tid);
    load_tile_async<kBlockM, kDim, kThreads>(sdObuf + buf * Traits::kSmemQ,
                                             dout + int64_t(r0) * p.do_row_stride,
                                             p.do_row_stride, rows, tid);
    load_row_stats_async<kBlockM>(sStatsBuf + buf * 2 * kBlockM, lse + r0, lse + delta_plane + r0, kBlockM,
                                  tid);
    cp_async_commit();
  };

  int m = next_live_block(m_begin);
  int buf = 0;
  if (m < q_blocks) load_query_block(m, buf);
  while (m < q_blocks) {
    const int r0 = m * kBlockM;
    const TileKind kind = classify(m);
    cp_async_wait<0>();  // this block's Q/dO/row statistics (and, the first time, K/V)
    __syncthreads();
    // Prefetch the next live query block into the other buffer, which every
    // warp left at the end of the previous iteration.
    const int m_next = next_live_block(m + 1);
    if (m_next < q_blocks) load_query_block(m_next, buf ^ 1);
    const T* sQ = sQbuf + buf * Traits::kSmemQ;
    const T* sdO = sdObuf + buf * Traits::kSmemQ;
    const float* sLse = sStatsBuf + buf * 2 * kBlockM;
    const float* sDelta = sLse + kBlockM;

    // lane re-read opaquely each block: fragment addresses are recomputed where
    // used instead of being hoisted out of the loop into live registers.
    const int ln = int(opaque(uint32_t(lane)));
    // S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys x kBlockM queries.
    float acc_s[kQTiles][4], acc_dp[kQTiles][4];
#pragma unroll
    for (int j = 0; j < kQTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[j][e] = acc_dp[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk) {
      uint32_t a_k[4], a_v[4];
      const int a_off = Tile::offset(warp * 16 + ln % 16, kk * 16 + (ln / 16) * 8);
      ldmatrix_x4(a_k, sK + a_off);
      ldmatrix_x4(a_v, sV + a_off);
#pragma unroll
      for (int nn = 0; nn < kBlockM / 16; ++nn) {
        const int b_off =
            Tile::offset(nn * 16 + ln % 8 + (ln / 16) * 8, kk * 16 + ((ln / 8) % 2) * 8);
        uint32_t b[4];
        ldmatrix_x4(b, sQ + b_off);
        mma_16816<T>(acc_s[2 * nn], a_k, b[0], b[1]);
        mma_16816<T>(acc_s[2 * nn + 1], a_k, b[2], b[3]);
        ldmatrix_x4(b, sdO + b_off);
        mma_16816<T>(acc_dp[2 * nn], a_v, b[0], b[1]);
        mma_16816<T>(acc_dp[2 * nn + 1], a_v, b[2], b[3]);
      }
    }

    // P^T = exp2(S^T * scale_log2 - lse) and dS^T = P^T * (dP^T - delta), per
    // element; lse = +inf (no key seen, padding) gives P = 0 by itself, and
    // partial tiles mask after the exp2 so the lse loads stay unconditional.
#pragma unroll
    for (int j = 0; j < kQTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = j * 8 + (lane % 4) * 2 + (e % 2);
        const int key = key_a + (e / 2) * 8;
        // exp2f, not fast_exp2: with the bare MUFU.EX2 ptxas spilled 104 bytes (sm_90a) in this
        // opt-in kernel (PADDLE_FLASHMASK_FA2_BWD=split, kept for A/B timing) against 48 allowed.
        float prob = exp2f(acc_s[j][e] * scale_log2 - sLse[qi]);
        if (kind == TileKind::kPartial &&
            element_masked(sCol, has_columns, causal, causal_offset, seqlen_k, r0 + qi, key, c0))
          prob = 0.f;
        acc_s[j][e] = prob;
        acc_dp[j][e] = prob * (acc_dp[j][e] - sDelta[qi]);
      }
    }

    // dV += P^T dO and dK += dS^T Q (keys x head dim), A straight from registers.
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t a_p[4], a_ds[4];
      a_p[0] = pack2<T>(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      a_p[1] = pack2<T>(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      a_p[2] = pack2<T>(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      a_p[3] = pack2<T>(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
      a_ds[0] = pack2<T>(acc_dp[2 * kk][0], acc_dp[2 * kk][1]);
      a_ds[1] = pack2<T>(acc_dp[2 * kk][2], acc_dp[2 * kk][3]);
      a_ds[2] = pack2<T>(acc_dp[2 * kk + 1][0], acc_dp[2 * kk + 1][1]);
      a_ds[3] = pack2<T>(acc_dp[2 * kk + 1][2], acc_dp[2 * kk + 1][3]);
      if (with_dq) {
        // dS^T to shared memory for the dQ product below.
        const int key_local = warp * 16 + ln / 4;
        const int q_local = kk * 16 + (ln % 4) * 2;
        *reinterpret_cast<uint32_t*>(sdS + DSTile::offset(key_local, q_local)) = a_ds[0];
        *reinterpret_cast<uint32_t*>(sdS + DSTile::offset(key_local + 8, q_local)) = a_ds[1];
        *reinterpret_cast<uint32_t*>(sdS + DSTile::offset(key_local, q_local + 8)) = a_ds[2];
        *reinterpret_cast<uint32_t*>(sdS + DSTile::offset(key_local + 8, q_local + 8)) = a_ds[3];
      }
#pragma unroll
      for (int dd = 0; dd < kDim / 16; ++dd) {
        const int b_off =
            Tile::offset(kk * 16 + ln % 8 + ((ln / 8) % 2) * 8, dd * 16 + (ln / 16) * 8);
        uint32_t b[4];
        ldmatrix_x4_trans(b, sdO + b_off);
        mma_16816<T>(acc_dv[2 * dd], a_p, b[0], b[1]);
        mma_16816<T>(acc_dv[2 * dd + 1], a_p, b[2], b[3]);
        ldmatrix_x4_trans(b, sQ + b_off);
        mma_16816<T>(acc_dk[2 * dd], a_ds, b[0], b[1]);
        mma_16816<T>(acc_dk[2 * dd + 1], a_ds, b[2], b[3]);
      }
    }
    if (with_dq) {
      __syncthreads();  // all of dS^T is in shared memory

      // dQ += dS K over the kBlockN keys: this warp's 16 query rows (row tile
      // warp % kDQRowTiles) x its slice of the head dim (warp / kDQRowTiles).
      constexpr int kSliceSteps = kDim / 16 / Traits::kDQDimSplit;
      const int row_tile = warp % Traits::kDQRowTiles;
      const int dd0 = (warp / Traits::kDQRowTiles) * kSliceSteps;
      uint32_t a_ds[kBlockN / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        ldmatrix_x4_trans(a_ds[kk], sdS + DSTile::offset(kk * 16 + ln % 8 + (ln / 16) * 8,
                                                         row_tile * 16 + ((ln / 8) % 2) * 8));
      }
      float* dq_tile = p.dq_accum + dq_tile_offset(batch, head, m, p.num_heads, seqlen_q, kDim);
#pragma unroll
      for (int step = 0; step < kSliceSteps; ++step) {
        const int dd = dd0 + step;
        float acc_dq[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, sK + Tile::offset(kk * 16 + ln % 8 + ((ln / 8) % 2) * 8,
                                                 dd * 16 + (ln / 16) * 8));
          mma_16816<T>(acc_dq[0], a_ds[kk], b[0], b[1]);
          mma_16816<T>(acc_dq[1], a_ds[kk], b[2], b[3]);
        }
        // Padding rows add zeros (their P is 0) to the tile's padding.
        add_dq_block<kDim>(dq_tile, acc_dq, row_tile, dd, lane);
      }
    }
    __syncthreads();  // sdS and this buffer are free again
    m = m_next;
    buf ^= 1;
  }
  cp_async_wait<0>();

  // dK and dV of the warp's keys: into the kv head's slot, where the query
  // heads of a GQA group add up, or (deterministic) into this head's own slot.
  const int slot = p.accum_heads_k == p.num_heads ? head : head_k;
  const int64_t kv_row_stride = int64_t(p.accum_heads_k) * kDim;
  float* dk_accum = p.dk_accum + (int64_t(batch) * seqlen_k * p.accum_heads_k + slot) * kDim;
  float* dv_accum = p.dv_accum + (int64_t(batch) * seqlen_k * p.accum_heads_k + slot) * kDim;
#pragma unroll
  for (int j = 0; j < kDTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key_a + (e / 2) * 8;
      const int col = j * 8 + (lane % 4) * 2 + (e % 2);
      if (key < seqlen_k) {
        atomicAdd(dk_accum + key * kv_row_stride + col, acc_dk[j][e]);
        atomicAdd(dv_accum + key * kv_row_stride + col, acc_dv[j][e]);
      }
    }
  }
}

}  // namespace cuda
}  // namespace flashmask
