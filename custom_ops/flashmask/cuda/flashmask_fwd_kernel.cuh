// FlashMask forward, FA2 class: one CTA per (query block, head, batch), each
// warp owning kMTiles x 16 query rows; S = QK^T and O += PV on mma.sync tensor cores,
// online softmax in registers (P is reused as the A operand of PV without a
// trip through shared memory).
//
// FlashMask: before a key block is loaded, its tile is classified from the
// precomputed block min/max. Fully masked blocks are skipped (the scan-ahead
// picks the next live block, so the prefetch of K jumps over them too);
// partially masked ones stage the per-column bounds in shared memory and mask
// elementwise; unmasked ones do no mask work.
#pragma once

#include <math_constants.h>

#include "../flashmask_params.h"
#include "../mask_bounds.h"
#include "exp_timeline.h"
#include "fast_exp2.cuh"
#include "fwd_grid.h"
#include "kernel_traits.h"
#include "mma_utils.cuh"
#include "partial_test.cuh"
#include "tile_io.cuh"
#include "workspace.h"

namespace flashmask {
namespace cuda {

// kPadded: p.head_dim is narrower than the tiles' (tile_head_dim). kOrdered:
// the launch gives the CTAs an order (p.cta_order, fa2_cta_order.cuh); its own
// instantiation, so that the kernel of every other call is the one it was
// (reading the order in the same code cost plain causal 1-2%: code placement).
// kHeadsPerCta = 2 (4): the tile's rows are 64-row (32-row) query blocks of
// two (four) query heads of one GQA group (fwd_grid.h, fwd_heads_share_tiles):
// the warps own as many rows and share every K/V block as in a 128-row tile,
// while the mask and the causal diagonal are met in 64-row (32-row) blocks.
// kTest: the partial tiles' element test (partial_test.cuh), the call's
// partial_test_of; or kRunTime, where the kernel tests every mask's partial
// tiles as MaskedRows or from the column bounds (a third test, VisibleRows,
// in the same kernel cost 2-4%: NOTES.md, "VisibleRows").
template <typename Traits, bool kPadded, bool kOrdered, int kHeadsPerCta, PartialTest kTest>
__global__ void __launch_bounds__(Traits::kNThreads)
    flashmask_fwd_kernel(const FwdParams p
#ifdef FLASHMASK_EXP_TIMELINE
                         , unsigned long long* timeline
#endif
    ) {
#ifdef FLASHMASK_EXP_TIMELINE
  __shared__ ExpTimeline tl;  // thread 0's; in registers it would move the loop's schedule
  if (threadIdx.x == 0) tl.start();
  int tl_steps = 0;
#endif
  using T = typename Traits::Element;
  constexpr int kDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kThreads = Traits::kNThreads;
  constexpr int kNTiles = kBlockN / 8;   // 8-column accumulator tiles of S
  constexpr int kDTiles = kDim / 8;      // 8-column accumulator tiles of O
  constexpr int kKSteps = kDim / 16;     // k-steps of S = QK^T
  constexpr int kNSteps = kBlockN / 16;  // 16-key groups: K fragments per k-step, k-steps of PV
  constexpr int kMTiles = Traits::kMTiles;
  constexpr int kWarpRows = 16 * kMTiles;
  constexpr int kRowsPerHead = kBlockM / kHeadsPerCta;  // a query block's rows
  static_assert(kHeadsPerCta == 1 || kHeadsPerCta == 2 || kHeadsPerCta == 4, "one head a tile, a pair or a quad");
  static_assert(kRowsPerHead % kWarpRows == 0, "a warp's rows lie in one head");
  using Tile = SwizzledTile<kDim>;
  // The columns loaded and stored: the tiles' past them are zeros.
  const int dim = kPadded ? p.head_dim : kDim;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + Traits::kSmemQ;
  T* sV = sK + Traits::kSmemKV;
  ColumnBounds* sCol = reinterpret_cast<ColumnBounds*>(sV + Traits::kSmemKV);

  // The grid is (heads, query blocks, batch), heads fastest
  // (launch_rows_heads_fastest), and the heaviest query blocks (the last ones
  // under causal masks) come first; with the launcher's CTA order (the
  // longest tiles first) this CTA takes the rank it gives (fwd_grid.h).
  FwdCta cta;
  if constexpr (kOrdered) {
    cta = fwd_cta_of_rank<kHeadsPerCta>(
        p, gridDim.y, p.cta_order[(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x]);
  } else {  // with head pairs or quads, the group's first head
    cta = FwdCta{int(gridDim.y - 1 - blockIdx.y), int(blockIdx.x) * kHeadsPerCta, int(blockIdx.z)};
  }
  const int m_block = cta.m_block;
  const int head = cta.head;
  const int batch = cta.batch;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  const int head_k = head / (p.num_heads / p.num_heads_k);
  const int mask_head = p.mask.num_heads == 1 ? 0 : head / (p.num_heads / p.mask.num_heads);
  const int r0 = m_block * kRowsPerHead;
  const int r1 = min(r0 + kRowsPerHead, seqlen_q);
  const int causal_offset = seqlen_k - seqlen_q;
  const bool causal = p.mask.causal;
  const int k_blocks = (seqlen_k + kBlockN - 1) / kBlockN;

  int n_end = k_blocks;
  if (causal) {
    const int last_col = r1 - 1 + causal_offset;  // last key the last row sees
    n_end = last_col < 0 ? 0 : min(k_blocks, last_col / kBlockN + 1);
  }

  const bool has_columns = p.mask.startend_row_indices != nullptr;
  // A query block no column shows loads no key: its row's aggregate says so
  // in one read, where the scan would classify every key block.
  if (has_columns && rows_see_no_key(p, batch, head, r0, r1)) n_end = 0;
  const int mask_batch = p.mask.batch_stride == 0 ? 0 : batch;
  const int32_t* columns = has_columns ? p.mask.startend_row_indices +
                                             mask_batch * p.mask.batch_stride +
                                             mask_head * p.mask.head_stride
                                       : nullptr;
  // kRunTime: partial tiles test each column's masked rows as two intervals
  // (MaskedRows: the causal diagonal and the ragged tail folded in), except
  // causal calls with 4 bounds a column, which need three and keep the
  // general test.
  const bool two_intervals = !(has_columns && causal && p.mask.num_cols == 4);
  const BlockBounds* block_bounds =
      has_columns ? reinterpret_cast<const BlockBounds*>(p.block_bounds) +
                        (int64_t(mask_batch) * p.mask.num_heads + mask_head) * k_blocks
                  : nullptr;
  static_assert(kBlockMaskSize % kBlockM == 0 && kBlockMaskSize % kBlockN == 0,
                "a tile lies inside one block_mask block");
  // This CTA's block_mask row, in shared memory and re-read at each use: the kernel runs
  // at its register limit and a value held across the loop spilled (NOTES.md, block_mask).
  __shared__ const int32_t* s_block_mask;
  if (tid == 0) s_block_mask = block_mask_row(p, batch, head, r0);
  __syncthreads();
  auto classify = [&](int n) {
    const int32_t* block_mask = *const_cast<const int32_t* volatile*>(&s_block_mask);
    if (block_mask != nullptr && block_mask[n * kBlockN / kBlockMaskSize] == 0) return TileKind::kSkip;
    return classify_tile(has_columns ? &block_bounds[n] : nullptr, causal, seqlen_q, seqlen_k, r0,
                         r1, n * kBlockN, n * kBlockN + kBlockN);
  };
  // After a window of 32 key blocks that were all skipped: the first coarse
  // summary at or after key block n that shows any of these rows (a warp's 32
  // a round), and the key block holding its first column (the blocks passed
  // lie inside summaries that hide every row here: cuda::mask_coarse_summaries).
  auto skip_ahead = [&](int n) {
    if (!has_columns) return n;
    const int c_end = coarse_summaries_holding(p, n_end * kBlockN);
    const int* coarse = row_coarse_summaries(p, batch, head);
    for (int c0 = n * kBlockN / kCoarseMaskBlockN; c0 < c_end; c0 += 32) {
      const int c = c0 + lane;
      const unsigned shown = __ballot_sync(
          0xffffffffu, c < c_end && !encoded_summary_hides_rows(coarse + c * kEncodedBoundsInts, r0, r1));
      if (shown != 0) return max(n, (c0 + __ffs(shown) - 1) * kCoarseMaskBlockN / kBlockN);
    }
    return n_end;
  };
  // The first live key block at or after `from` (n_end if none) and its kind.
  LiveBlockScan scan;
  auto next_live_block = [&](int from, TileKind& kind) {
    return scan.next(from, n_end, lane, classify, kind, skip_ahead);
  };

  const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + head_k * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + head_k * p.v_head_stride;
  // K/V tile copies take the thread index opaquely, so their per-thread
  // addresses are recomputed at each copy (a few integer ops under the GEMMs)
  // instead of being hoisted out of the loop into live (or spilled) registers;
  // whole blocks step one source address (copy_tile_async's kWholeTileFast).
  auto load_kv = [&](T* smem, const T* gmem, int64_t row_stride, int n) {
    copy_tile_async<kBlockN, kDim, kThreads, /*kWholeTileFast=*/true, kPadded>(
        smem, gmem + int64_t(n) * kBlockN * row_stride, row_stride, seqlen_k - n * kBlockN,
        int(opaque(uint32_t(tid))), dim);
  };
  auto load_k = [&](int n) { load_kv(sK, k, p.k_row_stride, n); };

#pragma unroll
  for (int h = 0; h < kHeadsPerCta; ++h) {  // each head's rows, one after the other
    load_tile_async<kRowsPerHead, kDim, kThreads, kPadded>(sQ + h * kRowsPerHead * kDim,
                                                           q + h * p.q_head_stride + int64_t(r0) * p.q_row_stride,
                                                           p.q_row_stride, r1 - r0, tid, dim);
  }
  TileKind kind = TileKind::kSkip;
  int n = next_live_block(0, kind);
  if (n < n_end) load_k(n);
  cp_async_commit();

  float acc_o[kMTiles][kDTiles][4];
  // Per thread and m-tile: rows (lane / 4) and (lane / 4 + 8) of its 16.
  float row_max[kMTiles][2], row_sum[kMTiles][2];  // row_sum: this thread's partial sums
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < kDTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][j][e] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -CUDART_INF_F;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const int warp_row0 = warp * kWarpRows;  // within the tile
  // + mt * 16 + h * 8; with head pairs or quads the warp's rows within its head's block
  const int row_a = r0 + (kHeadsPerCta == 1 ? warp_row0 : warp_row0 % kRowsPerHead) + lane / 4;

  // ldmatrix bases. Q (A of QK^T): rows warp_row0 + lane % 16, half lane / 16.
  // K (B of QK^T, two 8-key tiles per x4): keys lane % 8 + (lane / 16) x 8,
  // half (lane / 8) % 2. V^T (B of PV, transposed): keys lane % 16, half lane / 16.
  const FragmentBases<Tile> q_frag(smem_addr(sQ), warp_row0 + lane % 16, 0, lane / 16);
  const FragmentBases<Tile> k_frag(smem_addr(sK), lane % 8 + (lane / 16) * 8, 0, (lane / 8) % 2);
  // V^T's lanes meet the same swizzle phases as Q's (rows lane % 16 in both, a
  // multiple of 8 apart): one register moves Q's bases onto V.
  const uint32_t v_from_q = 2 * (Traits::kSmemQ + Traits::kSmemKV - warp_row0 * kDim);
  auto v_at = [&](int step, int keys) { return q_frag.at(step, keys) + v_from_q; };

  // Two barriers per key block, as FlashAttention-2: (1) K[n] has landed and
  // every warp left V[n-1] and the column bounds: V[n] and the bounds load
  // under S = QK^T; (2) V[n] has landed and every warp left K[n]: K[next]
  // loads under the softmax and O += PV.
  while (n < n_end) {
    const int c0 = n * kBlockN;
    cp_async_wait<0>();  // Q and K[n]
    __syncthreads();
#ifdef FLASHMASK_EXP_TIMELINE
    if (tl_steps++ == 0 && tid == 0) tl.first_step = clock64();
#endif
    load_kv(sV, v, p.v_row_stride, n);
    cp_async_commit();
    if (kind == TileKind::kPartial) {
      if constexpr (kTest != PartialTest::kRunTime) {
        stage_partial_columns<kTest, kBlockN>(sCol, columns, p.mask, c0, seqlen_q, seqlen_k, causal_offset, tid);
      } else if (two_intervals) {
        stage_partial_columns<PartialTest::kMaskedRows, kBlockN>(sCol, columns, p.mask, c0, seqlen_q, seqlen_k,
                                                                 causal_offset, tid);
      } else {
        stage_partial_columns<PartialTest::kColumnBounds, kBlockN>(sCol, columns, p.mask, c0, seqlen_q, seqlen_k,
                                                                   causal_offset, tid);
      }
    }
    // The next live block, found while the GEMM runs (its bounds come from L2).
    TileKind kind_next = TileKind::kSkip;
    const int n_next = next_live_block(n + 1, kind_next);

    // S = Q K^T for the warp's rows x kBlockN keys; each K fragment feeds
    // kMTiles MMAs. Software-pipelined: the fragments of the next 16 keys (and,
    // before a k-step's last group, the next k-step's Q) are loaded ahead of
    // this group's MMAs, so ldmatrix latency hides under them.
    float acc_s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][j][e] = 0.f;
    {
      uint32_t a_q[2][kMTiles][4], b_k[2][4];
      auto load_a = [&](uint32_t (&a)[kMTiles][4], int kk) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) ldmatrix_x4(a[mt], q_frag.at(kk, mt * 16));
      };
      load_a(a_q[0], 0);
      ldmatrix_x4(b_k[0], k_frag.at(0, 0));
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
        for (int nn = 0; nn < kNSteps; ++nn) {
          const int i = kk * kNSteps + nn;  // this group; i + 1 is the next
          if (nn + 1 < kNSteps) {
            ldmatrix_x4(b_k[(i + 1) % 2], k_frag.at(kk, (nn + 1) * 16));
          } else if (kk + 1 < kKSteps) {
            load_a(a_q[(kk + 1) % 2], kk + 1);
            ldmatrix_x4(b_k[(i + 1) % 2], k_frag.at(kk + 1, 0));
          }
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_16816<T>(acc_s[mt][2 * nn], a_q[kk % 2][mt], b_k[i % 2][0], b_k[i % 2][1]);
            mma_16816<T>(acc_s[mt][2 * nn + 1], a_q[kk % 2][mt], b_k[i % 2][2], b_k[i % 2][3]);
          }
        }
      }
    }

    cp_async_wait<0>();  // V[n]
    __syncthreads();
    if (n_next < n_end) load_k(n_next);
    cp_async_commit();

    // Partial tiles: each of the thread's 16 columns is read once (rows_of) and
    // tested against its 4 rows.
    auto mask_scores = [&](const auto& masked) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = j * 8 + (lane % 4) * 2 + c;
          const auto key_rows = masked.rows_of(key);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if (masked.test(key_rows, key, row_a + mt * 16 + h * 8)) acc_s[mt][j][2 * h + c] = -CUDART_INF_F;
            }
        }
    };
    if constexpr (kTest != PartialTest::kRunTime) {
      if (kind == TileKind::kPartial) mask_scores(partial_tester<kTest>(sCol, p.mask, causal_offset, seqlen_k, c0));
    } else if (kind == TileKind::kPartial && two_intervals) {
      mask_scores(partial_tester<PartialTest::kMaskedRows>(sCol, p.mask, causal_offset, seqlen_k, c0));
    } else if (kind == TileKind::kPartial) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row_a + mt * 16 + (e / 2) * 8;
            const int col = c0 + j * 8 + (lane % 4) * 2 + (e % 2);
            if (element_masked(sCol, has_columns, causal, causal_offset, seqlen_k, row, col, c0)) {
              acc_s[mt][j][e] = -CUDART_INF_F;
            }
          }
        }
    }

    // Online softmax in the log2 domain; P packed to 16-bit pairs right away
    // (the A operand of PV), which frees the fp32 scores.
    uint32_t a_p[kMTiles][kNSteps][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -CUDART_INF_F;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          tile_max = fmaxf(tile_max, fmaxf(acc_s[mt][j][2 * h], acc_s[mt][j][2 * h + 1]));
        }
        tile_max = quad_max(tile_max) * scale_log2;
        const float new_max = fmaxf(row_max[mt][h], tile_max);
        // A row with nothing visible so far keeps P = 0 without NaN.
        const float max_used = new_max == -CUDART_INF_F ? 0.f : new_max;
        const float alpha = fast_exp2(row_max[mt][h] - max_used);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            const float prob = fast_exp2(fmaf(acc_s[mt][j][e], scale_log2, -max_used));
            acc_s[mt][j][e] = prob;
            sum += prob;
          }
        }
        row_sum[mt][h] = row_sum[mt][h] * alpha + sum;
        row_max[mt][h] = new_max;
#pragma unroll
        for (int j = 0; j < kDTiles; ++j) {
          acc_o[mt][j][2 * h] *= alpha;
          acc_o[mt][j][2 * h + 1] *= alpha;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kNSteps; ++kk) {
        a_p[mt][kk][0] = pack2<T>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        a_p[mt][kk][1] = pack2<T>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        a_p[mt][kk][2] = pack2<T>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        a_p[mt][kk][3] = pack2<T>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
      }
    }

    // O += P V: for each 16 keys, the head dim in 16-column steps; each V^T
    // fragment is loaded one step ahead of its MMAs.
    {
      uint32_t b_v[2][4];
      ldmatrix_x4_trans(b_v[0], v_at(0, 0));
#pragma unroll
      for (int kk = 0; kk < kNSteps; ++kk) {
#pragma unroll
        for (int dd = 0; dd < kKSteps; ++dd) {
          const int i = kk * kKSteps + dd;
          if (dd + 1 < kKSteps) {
            ldmatrix_x4_trans(b_v[(i + 1) % 2], v_at(dd + 1, kk * 16));
          } else if (kk + 1 < kNSteps) {
            ldmatrix_x4_trans(b_v[(i + 1) % 2], v_at(0, (kk + 1) * 16));
          }
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_16816<T>(acc_o[mt][2 * dd], a_p[mt][kk], b_v[i % 2][0], b_v[i % 2][1]);
            mma_16816<T>(acc_o[mt][2 * dd + 1], a_p[mt][kk], b_v[i % 2][2], b_v[i % 2][3]);
          }
        }
      }
    }
    n = n_next;
    kind = kind_next;
  }
  cp_async_wait<0>();
#ifdef FLASHMASK_EXP_TIMELINE
  if (tid == 0) tl.loop_end = clock64();
#endif

  // Normalise and write O and the LSE (natural log). Empty rows: O = 0, LSE = -inf.
  const int warp_head = kHeadsPerCta == 1 ? head : head + warp_row0 / kRowsPerHead;
  T* out = static_cast<T*>(p.out) + batch * p.o_batch_stride + warp_head * p.o_head_stride;
  float* lse = p.softmax_lse + (int64_t(batch) * p.num_heads + warp_head) * seqlen_q;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float total = quad_sum(row_sum[mt][h]);
      const int row = row_a + mt * 16 + h * 8;
      if (row >= seqlen_q) continue;
      const bool empty = total == 0.f;  // NaN (a NaN score) is not empty: it stays NaN
      const float inv = empty ? 0.f : 1.f / total;
      T* out_row = out + int64_t(row) * p.o_row_stride + (lane % 4) * 2;
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        if (kPadded && j * 8 >= dim) break;
        *reinterpret_cast<uint32_t*>(out_row + j * 8) =
            pack2<T>(acc_o[mt][j][2 * h] * inv, acc_o[mt][j][2 * h + 1] * inv);
      }
      if (lane % 4 == 0) {
        lse[row] = empty ? -CUDART_INF_F : (row_max[mt][h] + log2f(total)) * 0.6931471805599453f;
      }
    }
  }
#ifdef FLASHMASK_EXP_TIMELINE
  __syncthreads();
  if (tid == 0) tl.record(timeline, tl_steps, head, m_block);
#endif
}

}  // namespace cuda
}  // namespace flashmask
