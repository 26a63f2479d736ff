// FlashMask backward, FA2 class, FlashAttention-2's layout: one CTA of 8
// warps per (key block, query head, batch) walks the live query blocks
// (steps of kBlockM rows), and each GEMM gets the warp split that suits it instead of one split
// for all (BwdStagedTraits; head dims up to 128 / 256; at head dim 64 a step
// takes two query blocks, 128 rows, as FA2's tile there):
//   S = Q K^T, dP = dO V^T   64 (128) rows x 128 / 64 keys, warps 2 x 4 / 4 x 2 (rows x keys);
//   dV += P^T dO, dK += dS^T Q   128 / 64 keys x D, warps 4 x 2 / 2 x 4 (keys x head dim);
//   dQ = dS K   64 (128) rows x D, warps kDQWarpsM (rows) x the rest (head dim);
// the 99 KB tiles of 96 and 128 (SmemClass::k99K) take 64 keys, and at 96 dV/dK
// warps 4 x 2 of 16 keys each.
// P and dS are staged in shared memory (16-bit, swizzled) between the splits.
// Each warp loads only its own rows of Q/dO and its own keys of K/V in the
// first two GEMMs (the one-split kernel, flashmask_bwd_kernel.cuh, has every
// warp read all of Q and dO), every GEMM loads its fragments one step ahead of
// its MMAs, and dQ leaves as 128-byte REDs into the query block's tile of
// the tiled dq_accum (dq_tile_layout.h).
//
// Per query block, three barriers: (1) Q, dO and the row statistics have
// landed, every warp is done with the previous block (the next Q and its row
// statistics load into the other buffer); (2) P and dS are in shared memory;
// (3) every warp is done with dO (the next dO loads, single-buffered, under
// the dK and dQ GEMMs). At head dim 256 Q has one buffer too: a fourth
// barrier after the dK GEMM, and the next Q loads under the dQ GEMM.
//
// FlashMask as in the one-split kernel: query blocks are classified from the
// key block's merged bounds, fully masked ones skipped, partial ones masked
// per element from the key columns' masked rows (MaskedRows, staged once).
// Deterministic mode skips dQ (the query-major pass computes it). dK/dV are
// stored in the output dtype (BwdParams::dkv_direct, without GQA or in
// deterministic mode), FA2's epilogue: straight to dk/dv without GQA, else
// per query head for bwd_finish to sum; or added into fp32 slots (the kv
// head's, or in deterministic mode this query head's own).
#pragma once

#include "../flashmask_params.h"
#include "../mask_bounds.h"
#include "fast_exp2.cuh"
#include "bwd_grid.h"
#include "exp_timeline.h"
#include "kernel_traits.h"
#include "mma_utils.cuh"
#include "partial_test.cuh"
#include "tile_io.cuh"

namespace flashmask {
namespace cuda {

// acc[mt][n8 tile] += A B for the products whose B is a [k][n] tile read
// with ldmatrix.trans (dV += P^T dO, dK += dS^T Q, dQ = dS K): kKSteps
// k-steps of 16, kNSteps 16-column steps of B (two n8 tiles each) from
// b_frag; load_a(a, kk) fills the kMTiles A fragments of k-step kk. Each
// fragment is loaded a step ahead of its MMAs: B every step, A before the
// last step of the previous k-step.
template <typename T, int kMTiles, int kKSteps, int kNSteps, typename Tile, typename LoadA>
__device__ __forceinline__ void gemm_b_trans_ahead(float (&acc)[kMTiles][2 * kNSteps][4], const LoadA& load_a,
                                                   const FragmentBases<Tile>& b_frag) {
  uint32_t af[2][kMTiles][4], bf[2][4];
  load_a(af[0], 0);
  ldmatrix_x4_trans(bf[0], b_frag.at(0, 0));
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
    for (int dd = 0; dd < kNSteps; ++dd) {
      const int i = kk * kNSteps + dd;
      if (dd + 1 < kNSteps) {
        ldmatrix_x4_trans(bf[(i + 1) % 2], b_frag.at(dd + 1, kk * 16));
      } else if (kk + 1 < kKSteps) {
        load_a(af[(kk + 1) % 2], kk + 1);
        ldmatrix_x4_trans(bf[(i + 1) % 2], b_frag.at(0, (kk + 1) * 16));
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        mma_16816<T>(acc[mt][2 * dd], af[kk % 2][mt], bf[i % 2][0], bf[i % 2][1]);
        mma_16816<T>(acc[mt][2 * dd + 1], af[kk % 2][mt], bf[i % 2][2], bf[i % 2][3]);
      }
    }
}

// kPadded: p.head_dim is narrower than the tiles' (tile_head_dim). kOrdered:
// the launch runs one CTA per rank of the grid, in p.cta_order's order
// (fa2_cta_order.cuh); its own instantiation, as the forward's. kTest: the
// partial tiles' element test (partial_test.cuh), the call's partial_test_of,
// or kRunTime: each of the three, chosen in the kernel.
template <typename Traits, bool kPadded, bool kOrdered, PartialTest kTest>
__global__ void __launch_bounds__(Traits::kNThreads)
    flashmask_bwd_staged_kernel(const BwdParams p
#ifdef FLASHMASK_EXP_TIMELINE
                                , unsigned long long* timeline
#endif
    ) {
#ifdef FLASHMASK_EXP_TIMELINE
  ExpTimeline tl;
  tl.start();
  int tl_steps = 0;
#endif
  using T = typename Traits::Element;
  constexpr int kDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;  // query rows per step: 64, or 128 at head dim 64
  // A step spans kTilesPerStep row_stats blocks and dQ tiles of kBwdRowBlock rows.
  static_assert(kBlockM % kBwdRowBlock == 0, "a step is whole row_stats blocks and dQ tiles");
  constexpr int kTilesPerStep = kBlockM / kBwdRowBlock;
  constexpr int kBlockN = Traits::kBlockN;  // keys per CTA: 128 (64 at head dim 256)
  constexpr int kThreads = Traits::kNThreads;
  constexpr int kKSteps = kDim / 16;      // k-steps of S and dP
  constexpr int kRowSteps = kBlockM / 16;  // k-steps of dV and dK
  constexpr int kKeySteps = kBlockN / 16;  // k-steps of dQ
  // S/dP: warp (sm, sn) owns rows sm x kSRows + [0, kSRows) and keys sn x 32 + [0, 32).
  constexpr int kSWarpsM = Traits::kSWarpsM, kSRows = kBlockM / kSWarpsM, kSKeys = kBlockN / (Traits::kNWarps / kSWarpsM);
  constexpr int kSMTiles = kSRows / 16;
  // dV/dK: warp (vn, vd) owns keys vn x kVKeys + [0, kVKeys) (kVMTiles m16 tiles) and head dims
  // vd x kVDims + [0, kVDims).
  constexpr int kVWarpsN = Traits::kVWarpsN, kVKeys = kBlockN / kVWarpsN, kVDims = kDim / (Traits::kNWarps / kVWarpsN);
  constexpr int kVMTiles = kVKeys / 16;
  // dQ: warp (qm, qd) owns rows qm x kQRows + [0, kQRows) and head dims qd x kQDims + [0, kQDims).
  constexpr int kQRows = kBlockM / Traits::kDQWarpsM, kQDims = kDim / (Traits::kNWarps / Traits::kDQWarpsM);
  static_assert(kSRows % 16 == 0 && kSKeys == 32, "32 keys (four n8 tiles) per warp in S and dP");
  static_assert(kVKeys == 16 || kVKeys == 32, "one or two m16 tiles of keys per warp in dV and dK");
  static_assert(kVDims % 16 == 0 && kQDims % 16 == 0 && kQRows % 16 == 0, "whole m16n16 blocks");
  using DimTile = SwizzledTile<kDim>;      // Q, dO, K, V rows
  // The columns loaded and stored (dk/dv, their per-head rows and slots are
  // [.., dim] rows): the tiles' past them are zeros. dQ's tiles keep kDim.
  const int dim = kPadded ? p.head_dim : kDim;
  using KeyTile = SwizzledTile<kBlockN>;   // P, dS rows (one query row: the block's keys)

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + Traits::kSmemKV;
  T* sQbuf = sV + Traits::kSmemKV;          // kQStages buffers: with 2, the next
  T* sdO = sQbuf + Traits::kQStages * Traits::kSmemQ;  // block loads while this one is computed
  T* sP = sdO + Traits::kSmemQ;             // [rows][keys]
  T* sdS = sP + Traits::kSmemPS;            // [rows][keys]
  float* sStatsBuf = reinterpret_cast<float*>(sdS + Traits::kSmemPS);  // 2 x (LSE, delta) x kBlockM
  ColumnBounds* sCol = reinterpret_cast<ColumnBounds*>(sStatsBuf + 4 * kBlockM);

  // The grid's order (the last key blocks of every head deferred), or the
  // launcher's CTA order (the longest key blocks first): bwd_grid.h.
  const int key_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  BwdCta cta;
  if constexpr (kOrdered) {
    cta = bwd_cta_of_rank(p, key_blocks, p.cta_order[blockIdx.x]);
  } else {
    cta = bwd_cta_of(p, key_blocks, blockIdx.x, blockIdx.y, blockIdx.z);
  }
  if (!cta.live) return;
  const int n_block = cta.n_block;
  const int head = cta.head;
  const int batch = cta.batch;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  const int head_k = head / (p.num_heads / p.num_heads_k);
  const int c0 = n_block * kBlockN;
  const int causal_offset = seqlen_k - seqlen_q;
  const bool causal = p.mask.causal;
  const int q_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  const bool with_dq = !p.deterministic;  // else dQ is the query-major kernel's

  const bool has_columns = p.mask.startend_row_indices != nullptr;
  const int32_t* columns = mask_columns(p, batch, head);
  // kRunTime, as in the forward: partial tiles test two intervals a column (MaskedRows),
  // except causal calls with 4 bounds a column (three intervals).
  const bool two_intervals = !(has_columns && causal && p.mask.num_cols == 4);
  // Where each key column sees one interval of query rows (no column mask,
  // C = 1, non-causal C = 2: every mask but the causal C = 2 bands and C = 4),
  // partial tiles test that interval: one subtraction and one compare an
  // element instead of two of each (VisibleRows, staged in place of MaskedRows).
  const bool one_visible = !has_columns || one_visible_interval(p.mask.num_cols, causal);
  // The key block spans kBlockN / kMaskBlockN summary blocks: merge their bounds.
  BlockBounds tile_bounds = empty_block_bounds();
  if (has_columns) {
    const int summary_blocks = (seqlen_k + kMaskBlockN - 1) / kMaskBlockN;
    const BlockBounds* table = reinterpret_cast<const BlockBounds*>(p.block_bounds) +
                               mask_summary_row(p, batch, head) * summary_blocks;
    for (int s = c0 / kMaskBlockN; s < min(summary_blocks, (c0 + kBlockN) / kMaskBlockN); ++s) {
      tile_bounds = merge_block_bounds(tile_bounds, table[s]);
    }
  }
  // Rows before the first one that sees key c0 are masked by causality.
  const int m_begin = causal ? max(0, c0 - causal_offset) / kBlockM : 0;

  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + head_k * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + head_k * p.v_head_stride;
  const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const T* dout = static_cast<const T*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
  // Rows of row_stats and of the dQ tiles per (batch, head): whole 64-row
  // blocks, so a 128-row step may end 64 rows past them (the step's last
  // query block is padding: its statistics read as zeros, which with Q and
  // dO zero-filled there give dS = 0, and it adds no dQ).
  const int64_t stats_rows = bwd_padded_rows(seqlen_q);
  const float* lse = p.row_stats + (int64_t(batch) * p.num_heads + head) * stats_rows;
  const int64_t delta_plane = int64_t(p.batch) * p.num_heads * stats_rows;

  load_tile_async<kBlockN, kDim, kThreads, kPadded>(sK, k + int64_t(c0) * p.k_row_stride, p.k_row_stride, seqlen_k - c0,
                                                    tid, dim);
  load_tile_async<kBlockN, kDim, kThreads, kPadded>(sV, v + int64_t(c0) * p.v_row_stride, p.v_row_stride, seqlen_k - c0,
                                                    tid, dim);
  // The key columns' rows for the partial tiles' test, read at the first top
  // barrier. kRunTime's staging is written out here as it was before the
  // kernels per test: stage_partial_columns' put it in another instruction
  // order (its head dims keep their SASS of before, instruction for instruction).
  if constexpr (kTest != PartialTest::kRunTime) {
    stage_partial_columns<kTest, kBlockN>(sCol, columns, p.mask, c0, seqlen_q, seqlen_k, causal_offset, tid);
  } else if (tid < kBlockN) {
    const int col = c0 + tid;
    if (one_visible) {
      // Without a column mask every row from the diagonal on (causal) or every row is visible.
      const ColumnBounds b = has_columns && col < seqlen_k
                                 ? load_column_bounds(columns + int64_t(col) * p.mask.col_stride,
                                                      p.mask.num_cols, causal, seqlen_q)
                                 : ColumnBounds{seqlen_q, seqlen_q, 0, 0};
      reinterpret_cast<VisibleRows*>(sCol)[tid] = visible_rows(b, col, causal, causal_offset, seqlen_k);
    } else if (two_intervals) {
      const ColumnBounds b = has_columns && col < seqlen_k
                                 ? load_column_bounds(columns + int64_t(col) * p.mask.col_stride,
                                                      p.mask.num_cols, causal, seqlen_q)
                                 : ColumnBounds{0, 0, 0, 0};
      reinterpret_cast<MaskedRows*>(sCol)[tid] = masked_rows(b, col, causal, causal_offset, seqlen_k);
    }
  }
  if (kTest == PartialTest::kRunTime && !two_intervals) {
    stage_column_bounds<kBlockN>(sCol, columns, p.mask, c0, seqlen_q, seqlen_k, tid);
  }

  __shared__ const int32_t* s_block_mask;
  if (tid == 0) s_block_mask = block_mask_row(p, batch, head, 0) == nullptr
                                   ? nullptr
                                   : block_mask_row(p, batch, head, 0) + c0 / kBlockMaskSize;
  __syncthreads();
  static_assert(kBlockMaskSize % kBlockM == 0 && kBlockMaskSize % kBlockN == 0,
                "a tile lies inside one block_mask block");
  auto classify = [&](int m) {
    const int32_t* block_mask = *const_cast<const int32_t* volatile*>(&s_block_mask);
    if (block_mask != nullptr && block_mask[int64_t(m * kBlockM / kBlockMaskSize) * p.block_mask.col_blocks] == 0)
      return TileKind::kSkip;
    return classify_tile(has_columns, tile_bounds, causal, seqlen_q, seqlen_k, m * kBlockM,
                         min(m * kBlockM + kBlockM, seqlen_q), c0, c0 + kBlockN);
  };
  // The first live query block at or after `from` (q_blocks if none) and its
  // kind: a key block of a sliding window or a document sees a few dozen of
  // the sequence's query blocks, and one at a time, the scan past the last of
  // them cost more issue slots than the live steps.
  // After a window of 32 that were all skipped, the scan goes on from the
  // first block this key block's columns do not all hide by one interval
  // (first_block_not_hidden, from the merged summary in registers).
  auto skip_ahead = [&](int m) {
    return has_columns ? min(q_blocks, first_block_not_hidden(tile_bounds, m, kBlockM)) : m;
  };
  LiveBlockScan scan;
  auto next_live_block = [&](int from, TileKind& kind) {
    return scan.next(from, q_blocks, lane, classify, kind, skip_ahead);
  };
  auto rows_of = [&](int m) { return min(kBlockM, seqlen_q - m * kBlockM); };
  // Q/dO copies step their first address (copy_tile_async). With `live`
  // false they copy zero bytes from block m's rows (load_next).
  auto load_q = [&](int m, int buf, bool live = true) {
    copy_tile_async<kBlockM, kDim, kThreads, false, kPadded>(
        sQbuf + buf * Traits::kSmemQ, q + int64_t(m) * kBlockM * p.q_row_stride, p.q_row_stride,
        live ? rows_of(m) : 0, tid, dim);
    load_row_stats_async<kBlockM>(sStatsBuf + buf * 2 * kBlockM, lse + m * kBlockM, lse + delta_plane + m * kBlockM,
                                  live ? int(stats_rows - int64_t(m) * kBlockM) : 0, tid);
  };
  auto load_do = [&](int m, bool live = true) {
    copy_tile_async<kBlockM, kDim, kThreads, false, kPadded>(
        sdO, dout + int64_t(m) * kBlockM * p.do_row_stride, p.do_row_stride, live ? rows_of(m) : 0, tid, dim);
  };
  // The next block's copies, load(m, live): without a branch around them
  // where the traits say so (Traits::kUnbranchedNextCopies), past the last
  // block zero bytes from its rows into a buffer no step reads again, so
  // that their address arithmetic shares a basic block with the GEMM after them.
  auto load_next = [&](int m_next, auto&& load) {
    if constexpr (Traits::kUnbranchedNextCopies) {
      load(m_next < q_blocks ? m_next : q_blocks - 1, m_next < q_blocks);
    } else if (m_next < q_blocks) {
      load(m_next, true);
    }
  };

  // dV and dK of the warp's keys x head-dim slice, over all query blocks.
  constexpr int kVTiles = kVDims / 8;
  float acc_dv[kVMTiles][kVTiles][4], acc_dk[kVMTiles][kVTiles][4];
#pragma unroll
  for (int mt = 0; mt < kVMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < kVTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[mt][j][e] = acc_dk[mt][j][e] = 0.f;

  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  // Warp positions in the three splits.
  const int s_m = warp % kSWarpsM, s_n = warp / kSWarpsM;
  const int v_n = warp % kVWarpsN, v_d = warp / kVWarpsN;
  const int q_m = warp % Traits::kDQWarpsM, q_d = warp / Traits::kDQWarpsM;

  TileKind kind = TileKind::kSkip;
  int m = next_live_block(m_begin, kind);
  const bool any_live = m < q_blocks;
  int buf = 0;
  if (m < q_blocks) {
    load_q(m, buf);
    load_do(m);
  }
  cp_async_commit();
  while (m < q_blocks) {
    cp_async_wait<0>();  // this block's Q, dO, row statistics (and, the first time, K, V)
    __syncthreads();     // (1)
#ifdef FLASHMASK_EXP_TIMELINE
    if (tl_steps++ == 0) tl.first_step = clock64();
#endif
    TileKind kind_next = TileKind::kSkip;
    const int m_next = next_live_block(m + 1, kind_next);
    if constexpr (Traits::kQStages == 2) {
      load_next(m_next, [&](int m_q, bool live) { load_q(m_q, buf ^ 1, live); });
      cp_async_commit();
    }
    const uint32_t q_smem = smem_addr(sQbuf + buf * Traits::kSmemQ);
    const float* sLse = sStatsBuf + buf * 2 * kBlockM;
    const float* sDelta = sLse + kBlockM;

    // S = Q K^T and dP = dO V^T, the warp's kSRows rows x 32 keys each. Lane
    // values re-read opaquely per block: the bases are recomputed here
    // rather than held across the loop.
    float acc_s[kSMTiles][4][4], acc_dp[kSMTiles][4][4];
    {
      const int ln = int(opaque(uint32_t(lane)));
#pragma unroll
      for (int mt = 0; mt < kSMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mt][j][e] = acc_dp[mt][j][e] = 0.f;
      // A (Q, dO): rows s_m x kSRows + lane % 16, half lane / 16. B (K, V; two
      // 8-key tiles an ldmatrix): keys s_n x 32 + lane % 8 + (lane / 16) x 8,
      // half (lane / 8) % 2. dO and V sit at fixed distances from Q and K.
      const FragmentBases<DimTile> a_frag(q_smem, s_m * kSRows + ln % 16, 0, ln / 16);
      const FragmentBases<DimTile> b_frag(smem_addr(sK), s_n * kSKeys + ln % 8 + (ln / 16) * 8, 0, (ln / 8) % 2);
      const uint32_t do_from_q = smem_addr(sdO) - q_smem;
      constexpr uint32_t v_from_k = 2 * Traits::kSmemKV;
      // Fragments of one k-step for one product: A (kSMTiles m16 tiles), B (2
      // x two 8-key tiles). dO/V of step kk load under S's MMAs of step kk,
      // Q/K of step kk + 1 under dP's: at most two products' fragments live.
      uint32_t qa[kSMTiles][4], kb[2][4], da[kSMTiles][4], vb[2][4];
      auto load_pair = [&](uint32_t (&a)[kSMTiles][4], uint32_t (&b)[2][4], int kk, uint32_t a_shift,
                           uint32_t b_shift) {
#pragma unroll
        for (int t = 0; t < kSMTiles; ++t) ldmatrix_x4(a[t], a_frag.at(kk, t * 16) + a_shift);
#pragma unroll
        for (int t = 0; t < 2; ++t) ldmatrix_x4(b[t], b_frag.at(kk, t * 16) + b_shift);
      };
      auto mma_pair = [&](float (&acc)[kSMTiles][4][4], const uint32_t (&a)[kSMTiles][4], const uint32_t (&b)[2][4]) {
#pragma unroll
        for (int mt = 0; mt < kSMTiles; ++mt)
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            mma_16816<T>(acc[mt][2 * t], a[mt], b[t][0], b[t][1]);
            mma_16816<T>(acc[mt][2 * t + 1], a[mt], b[t][2], b[t][3]);
          }
      };
      load_pair(qa, kb, 0, 0, 0);
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        load_pair(da, vb, kk, do_from_q, v_from_k);
        mma_pair(acc_s, qa, kb);
        if (kk + 1 < kKSteps) load_pair(qa, kb, kk + 1, 0, 0);
        mma_pair(acc_dp, da, vb);
      }
    }

    // P = exp2(S x scale_log2 - lse) (lse = +inf for rows that see no key and
    // padding rows: P = 0 there) and dS = P (dP - delta), both to shared
    // memory as 16-bit pairs. Partial tiles first set their masked scores to
    // -inf (P = 0, dS = 0), in a pass of their own: with the test inside the
    // exponent loop its branches split that loop's blocks, which cost every
    // step (a knock-out of the test: +8% on causal head dim 64, one partial
    // step in 65).
    {
      const int ln = int(opaque(uint32_t(lane)));
      const int row_l = s_m * kSRows + ln / 4;  // + mt x 16 + h x 8, within the block
      const int key_l = s_n * kSKeys + (ln % 4) * 2;  // + j x 8 + c, within the key block
      const int r0 = m * kBlockM;
      // `masked` tests (key within the block, absolute row); each key's rows are read once.
      auto mask_scores = [&](const auto& masked) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const auto key_rows = masked.rows_of(key_l + j * 8 + c);
#pragma unroll
            for (int mt = 0; mt < kSMTiles; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                if (masked.test(key_rows, key_l + j * 8 + c, r0 + row_l + mt * 16 + h * 8))
                  acc_s[mt][j][2 * h + c] = -CUDART_INF_F;
              }
          }
      };
      if constexpr (kTest != PartialTest::kRunTime) {
        if (kind == TileKind::kPartial) mask_scores(partial_tester<kTest>(sCol, p.mask, causal_offset, seqlen_k, c0));
      } else if (kind == TileKind::kPartial && one_visible) {
        mask_scores(KeyRowsTest<VisibleRows>{sCol});
      } else if (kind == TileKind::kPartial && two_intervals) {
        mask_scores(KeyRowsTest<MaskedRows>{sCol});
      } else if (kind == TileKind::kPartial) {
        mask_scores(ColumnBoundsTest{sCol, has_columns, causal, causal_offset, seqlen_k, c0});
      }
      // The 8-row swizzle period (SwizzledTile::phases_hold): every row of the
      // thread (row_l + a multiple of 8) stores its 4 key pairs at row_l's 4
      // offsets plus an immediate, so 4 swizzled offsets a step, not 4 per row
      // tile (+1% at head dim 128). With 4 row tiles (head dim 64's 128-row
      // steps) the 4 held offsets spilled on sm_80: there each store keeps its own.
      constexpr bool kHeldOffsets = kSMTiles <= 2;
      int key_off[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) key_off[j] = KeyTile::offset(row_l, key_l + j * 8);
#pragma unroll
      for (int mt = 0; mt < kSMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row_l + mt * 16 + h * 8;
          const float row_lse = sLse[row], row_delta = sDelta[row];
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int e = 2 * h + c;
              acc_s[mt][j][e] = fast_exp2(fmaf(acc_s[mt][j][e], scale_log2, -row_lse));
            }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float p0 = acc_s[mt][j][2 * h], p1 = acc_s[mt][j][2 * h + 1];
            const int off = kHeldOffsets ? key_off[j] + (mt * 16 + h * 8) * kBlockN
                                         : KeyTile::offset(row, key_l + j * 8);
            *reinterpret_cast<uint32_t*>(sP + off) = pack2<T>(p0, p1);
            *reinterpret_cast<uint32_t*>(sdS + off) =
                pack2<T>(p0 * (acc_dp[mt][j][2 * h] - row_delta), p1 * (acc_dp[mt][j][2 * h + 1] - row_delta));
          }
        }
    }
    __syncthreads();  // (2) P and dS are in shared memory

    // dV += P^T dO and dK += dS^T Q over the block's 64 rows: A = P^T / dS^T
    // (ldmatrix.trans of the [rows][keys] tiles: rows k x 16 + lane % 8 +
    // (lane / 16) x 8, keys v_n x kVKeys + m16 tile + ((lane / 8) % 2) x 8); B =
    // dO / Q (ldmatrix.trans: rows lane % 16, head dims v_d x kVDims + half lane / 16).
    auto dkv_gemm = [&](float (&acc)[kVMTiles][kVTiles][4], uint32_t a_smem, uint32_t b_smem) {
      const int ln = int(opaque(uint32_t(lane)));
      const FragmentBases<KeyTile> a_frag(a_smem, ln % 8 + (ln / 16) * 8, v_n * kVKeys, (ln / 8) % 2);
      const FragmentBases<DimTile> b_frag(b_smem, ln % 16, v_d * kVDims, ln / 16);
      gemm_b_trans_ahead<T, kVMTiles, kRowSteps, kVDims / 16>(
          acc,
          [&](uint32_t (&a)[kVMTiles][4], int kk) {
#pragma unroll
            for (int mt = 0; mt < kVMTiles; ++mt) ldmatrix_x4_trans(a[mt], a_frag.at(mt, kk * 16));
          },
          b_frag);
    };
    dkv_gemm(acc_dv, smem_addr(sP), smem_addr(sdO));
    __syncthreads();  // (3) every warp is done with dO
    load_next(m_next, load_do);
    cp_async_commit();
    dkv_gemm(acc_dk, smem_addr(sdS), q_smem);
    if constexpr (Traits::kQStages == 1) {
      __syncthreads();  // (4) one Q buffer: every warp is done with it (and with the row statistics)
      load_next(m_next, [&](int m_q, bool live) { load_q(m_q, 0, live); });
      cp_async_commit();
    }

    if (with_dq) {
      // dQ = dS K: the warp's kQRows rows x kQDims head dims over the 128
      // keys. A = dS (rows q_m x kQRows + lane % 16, half lane / 16), B = K
      // (ldmatrix.trans: keys lane % 16, head dims q_d x kQDims + half lane / 16).
      constexpr int kQMTiles = kQRows / 16, kQSteps = kQDims / 16;
      float acc_dq[kQMTiles][2 * kQSteps][4];
#pragma unroll
      for (int mt = 0; mt < kQMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < 2 * kQSteps; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_dq[mt][j][e] = 0.f;
      {
        const int ln = int(opaque(uint32_t(lane)));
        const FragmentBases<KeyTile> a_frag(smem_addr(sdS), q_m * kQRows + ln % 16, 0, ln / 16);
        const FragmentBases<DimTile> b_frag(smem_addr(sK), ln % 16, q_d * kQDims, ln / 16);
        gemm_b_trans_ahead<T, kQMTiles, kKeySteps, kQSteps>(
            acc_dq,
            [&](uint32_t (&a)[kQMTiles][4], int kk) {
#pragma unroll
              for (int mt = 0; mt < kQMTiles; ++mt) ldmatrix_x4(a[mt], a_frag.at(kk, mt * 16));
            },
            b_frag);
      }
      // Padding rows add zeros (their dS is 0) to the tile's padding. The
      // warp's rows lie in one dQ tile (kQRows <= 64, aligned); a 128-row
      // step's second tile may not exist (past the padded rows).
      static_assert(kBwdRowBlock % kQRows == 0, "a warp's dQ rows lie in one tile");
      const int tile = m * kTilesPerStep + q_m * kQRows / kBwdRowBlock;
      if (int64_t(tile) * kBwdRowBlock < stats_rows) {
        float* dq_tile = p.dq_accum + dq_tile_offset(batch, head, tile, p.num_heads, seqlen_q, kDim);
        constexpr int kTileRowTiles = kBwdRowBlock / 16;
#pragma unroll
        for (int mt = 0; mt < kQMTiles; ++mt)
#pragma unroll
          for (int dd = 0; dd < kQSteps; ++dd)
            add_dq_block<kDim>(dq_tile, &acc_dq[mt][2 * dd], (q_m * kQMTiles + mt) % kTileRowTiles,
                               q_d * kQSteps + dd, lane);
      }
    }
    m = m_next;
    kind = kind_next;
    if constexpr (Traits::kQStages == 2) buf ^= 1;
  }
  cp_async_wait<0>();
#ifdef FLASHMASK_EXP_TIMELINE
  tl.loop_end = clock64();
  auto tl_record = [&]() {
    if (threadIdx.x == 0) tl.record(timeline, tl_steps, head, n_block);
  };
  if (!any_live && !p.dkv_direct) { tl_record(); return; }
#else
  if (!any_live && !p.dkv_direct) return;  // nothing added (the accumulators start at zero); uniform over the CTA
#endif

  // The CTA's dK or dV (kBlockN keys x kDim) through shared memory (fp32,
  // over the finished tiles), so that a warp writes 32 consecutive elements
  // of one key's row at a time instead of 8 keys x 4 lanes at stride 2.
  constexpr int kStageStride = kDim + 8;  // float2 stores of 8 rows x 4 lanes in 2 wavefronts
  static_assert(kBlockN * kStageStride * 4 <= Traits::kSmemBytes, "the staged gradient fits");
  float* stage = reinterpret_cast<float*>(smem_raw);
  auto stage_gradient = [&](const float (&acc)[kVMTiles][kVTiles][4]) {
    __syncthreads();  // every warp is done with the shared tiles (or the previous gradient)
#pragma unroll
    for (int mt = 0; mt < kVMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < kVTiles; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int key = v_n * kVKeys + mt * 16 + lane / 4 + h * 8;
          const int col = v_d * kVDims + j * 8 + (lane % 4) * 2;
          *reinterpret_cast<float2*>(stage + key * kStageStride + col) =
              make_float2(acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
        }
    __syncthreads();
  };
  if (p.dkv_direct) {
    // This CTA is the one writer of its keys' dK/dV rows of this query head, stored in T
    // (dK scaled) as FlashAttention-2 does; zeros where no query block was
    // live (the accumulators stayed zero). Without GQA into dk/dv, else
    // into this head's rows of dk_heads/dv_heads, which bwd_finish sums per kv head.
    // Four columns a lane where the rows allow 8-byte stores (the op's own
    // outputs do): one 16-byte shared load and one 8-byte store, a warp
    // covering kRowsAtOnce rows of kLanesPerRow lanes (at most 32 x 4 columns
    // a pass), instead of one element a lane: +1-3% on the H200's MHA mask
    // backwards (NOTES.md, twenty-ninth session). Not at head dim 256, whose
    // backward it slowed by 1-1.5% (its schedule moved).
    constexpr bool kWideStores = kDim <= 128;
    constexpr int kLanesPerRow = kDim / 4 < 32 ? kDim / 4 : 32;
    constexpr int kRowsAtOnce = 32 % kLanesPerRow == 0 ? 32 / kLanesPerRow : 1;
    static_assert(kStageStride % 4 == 0, "16-byte aligned staged rows");
    auto store_gradient = [&](const float (&acc)[kVMTiles][kVTiles][4], T* out, int64_t row_stride,
                              float scale) {
      stage_gradient(acc);
      if constexpr (kWideStores) {
        if (row_stride % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
          const int sub = lane / kLanesPerRow, col = 4 * (lane % kLanesPerRow);
          // (At head dim 96 a row takes 24 lanes: the other 8 have no row.)
          for (int r = warp * kRowsAtOnce + sub; sub < kRowsAtOnce && r < kBlockN && c0 + r < seqlen_k;
               r += Traits::kNWarps * kRowsAtOnce) {
#pragma unroll
            for (int c = col; c < kDim; c += 4 * kLanesPerRow) {
              if (kPadded && c >= dim) break;
              const float4 x = *reinterpret_cast<const float4*>(stage + r * kStageStride + c);
              *reinterpret_cast<uint2*>(out + int64_t(c0 + r) * row_stride + c) =
                  make_uint2(pack2<T>(x.x * scale, x.y * scale), pack2<T>(x.z * scale, x.w * scale));
            }
          }
          return;
        }
      }
      for (int r = warp; r < kBlockN && c0 + r < seqlen_k; r += Traits::kNWarps) {
#pragma unroll
        for (int c = lane; c < kDim; c += 32) {
          if (kPadded && c >= dim) break;
          out[int64_t(c0 + r) * row_stride + c] = from_float<T>(stage[r * kStageStride + c] * scale);
        }
      }
    };
    if (p.dkv_heads_expanded()) {
      const int64_t first = (int64_t(batch) * seqlen_k * p.num_heads + head) * dim;
      const int64_t row_stride = int64_t(p.num_heads) * dim;
      store_gradient(acc_dk, static_cast<T*>(p.dk_heads) + first, row_stride, p.softmax_scale);
      store_gradient(acc_dv, static_cast<T*>(p.dv_heads) + first, row_stride, 1.f);
    } else {
      store_gradient(acc_dk, static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head_k * p.dk_head_stride,
                     p.dk_row_stride, p.softmax_scale);
      store_gradient(acc_dv, static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head_k * p.dv_head_stride,
                     p.dv_row_stride, 1.f);
    }
#ifdef FLASHMASK_EXP_TIMELINE
    __syncthreads();
    tl_record();
#endif
    return;
  }
  // Else into the kv head's slot, where the query heads of a GQA group add
  // up, or (deterministic) into this head's own slot.
  const int slot = p.accum_heads_k == p.num_heads ? head : head_k;
  const int64_t kv_row_stride = int64_t(p.accum_heads_k) * dim;
  float* dk_accum = p.dk_accum + (int64_t(batch) * seqlen_k * p.accum_heads_k + slot) * dim;
  float* dv_accum = p.dv_accum + (int64_t(batch) * seqlen_k * p.accum_heads_k + slot) * dim;
  auto add_gradient = [&](const float (&acc)[kVMTiles][kVTiles][4], float* accum) {
    stage_gradient(acc);
    for (int r = warp; r < kBlockN && c0 + r < seqlen_k; r += Traits::kNWarps) {
#pragma unroll
      for (int c = lane; c < kDim; c += 32) {
        if (kPadded && c >= dim) break;
        atomicAdd(accum + int64_t(c0 + r) * kv_row_stride + c, stage[r * kStageStride + c]);
      }
    }
  };
  add_gradient(acc_dk, dk_accum);
  add_gradient(acc_dv, dv_accum);
#ifdef FLASHMASK_EXP_TIMELINE
  __syncthreads();
  tl_record();
#endif
}

}  // namespace cuda
}  // namespace flashmask
