// Compile-time shape of the Hopper forward kernel for one (head dim, dtype):
// tile sizes, the warp roles, the swizzled shared-memory layouts that both
// TMA writes and wgmma reads, the two tiled wgmmas and the TMA pipelines.
#pragma once

// wgmma shapes whose N is not a multiple of 32 (64 x 48 x 16: dQ's half of
// head dim 96 per warpgroup) are behind this switch in CuTe's op selectors;
// without it they pick N = 16 (the tile-size asserts below would fail). The
// other head dims' shapes select as before.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "../../mask_bounds.h"
#include "flashmask_sm90_api.h"

namespace flashmask {
namespace sm90 {

using namespace cute;

// 128-byte swizzled rows (64 x 16 bits) where a warpgroup's slice of the head
// dim is whole rows of the swizzle; 64-byte ones (32 x 16 bits) where it is
// not (head dim 96, and 192 split over two warpgroups: 96 columns each);
// 32-byte ones (16 x 16 bits) for slices of 48 (K of head dim 96 in the
// backward, whose dQ GEMM splits the head dim over the warpgroups).
template <typename Element, int kSliceCols>
using KMajorSmemAtom = std::conditional_t<
    kSliceCols % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
    std::conditional_t<kSliceCols % 32 == 0, GMMA::Layout_K_SW64_Atom<Element>, GMMA::Layout_K_SW32_Atom<Element>>>;

// One BlockBounds summary per kMaskBlockN key columns (cuda/kernel_traits.h);
// a key tile here spans kBlockN / kMaskBlockN of them.
//
// kWideKeys: 176-key tiles at head dim 128 for calls with no mask at all (not
// causal, no column or block mask), as FA3 takes for non-causal head dim 128:
// 11/8 of the GEMM work per softmax, barrier and pipeline step. Only those
// calls: 176 is not a multiple of the 64-column summaries nor of block_mask's
// 128, and causal tiles would waste more of their diagonal.
template <int kHeadDim_, typename Element_, bool kWideKeys_ = false>
struct FwdTraits {
  using Element = Element_;  // cutlass::bfloat16_t or cutlass::half_t
  using ElementAccum = float;
  static constexpr int kHeadDim = kHeadDim_;            // of q and k
  static constexpr int kHeadDimV = value_head_dim_for(kHeadDim);  // of v and out
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256,
                "sm90 forward: head dim 64, 96, 128, 192 (value 128) or 256");
  static constexpr bool kWideKeys = kWideKeys_;
  static_assert(!kWideKeys || kHeadDim == 128, "176-key tiles at head dim 128 only");

  // Warpgroup 0 loads (warp 0 issues TMA, warps 1-3 build the next tiles'
  // live lists), warpgroups 1 and 2 compute 64 query rows each.
  static constexpr int kNumMmaWarpGroups = 2;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWarpGroups;
  static constexpr int kNThreads = kNumMmaThreads + 128;
  static constexpr int kListThreads = 128 - 32;  // the producer warpgroup less the TMA warp
  static constexpr int kBlockM = 64 * kNumMmaWarpGroups;
  // Past head dim 128 there is room for one Q buffer only (the next tile's Q
  // then lands once this tile's last GEMM has read Q), and head dim 256 fits
  // 227 KB of shared memory only with 64-key tiles: Q 64 KB + K/V 2 x 2 x
  // 32 KB; 192/128: Q 48 KB + K 2 x 48 KB + V 2 x 32 KB (NOTES.md). 176-key
  // tiles: Q 32 KB + K/V 2 x 2 x 44 KB, one Q buffer too.
  static constexpr int kBlockN = kWideKeys ? 176 : kHeadDim <= 192 ? 128 : 64;
  static constexpr int kQBuffers = kHeadDim <= 128 && !kWideKeys ? 2 : 1;
  static constexpr int kStages = 2;
  // Consumer registers at 192/128 (12 k-steps of QK^T): the tile's index
  // alone is kept across the main loop and decoded again for the epilogue,
  // two registers fewer, without which a word goes to local memory. At 256 (O
  // is 128 registers) that decode's temporaries spill instead, and 64/128
  // need neither.
  static constexpr bool kKeepTileIndex = kHeadDim == 192;
  // setmaxnreg budgets: 24 x 128 + 240 x 256 <= 64K registers of the SM.
  static constexpr int kLoadRegisters = 24;
  static constexpr int kMmaRegisters = 240;

  using TileShape = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;  // (M, N, D)
  using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kBlockN>>;  // (M, Dv, N)
  using AtomLayout = Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>;

  // S = Q K^T: both operands from shared memory, K-major (head dim contiguous).
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, TileShape>(), AtomLayout{}));
  // O += P V: P from registers (the softmax output never touches shared
  // memory); V is MN-major (head dim contiguous, the GEMM's N).
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, ElementAccum, TileShapePV, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayout{}));

  static_assert(decltype(tile_size<0>(TiledMmaQK{}))::value == kBlockM &&
                decltype(tile_size<1>(TiledMmaQK{}))::value == kBlockN);
  static_assert(decltype(tile_size<0>(TiledMmaPV{}))::value == kBlockM &&
                decltype(tile_size<1>(TiledMmaPV{}))::value == kHeadDimV);

  // 128-byte swizzle (64 x 16-bit per row), 64-byte at head dim 96: what TMA
  // writes and wgmma reads without bank conflicts.
  using SmemAtomQK = KMajorSmemAtom<Element, kHeadDim>;
  using SmemAtomV = KMajorSmemAtom<Element, kHeadDimV>;
  static_assert(kHeadDim % 32 == 0 && kHeadDimV % 32 == 0, "whole 64-byte swizzle rows");
  // kQBuffers Q buffers: with two, the next tile's Q lands while this one computes.
  using SmemLayoutQ = decltype(tile_to_shape(
      SmemAtomQK{}, make_shape(Int<kBlockM>{}, Int<kHeadDim>{}, Int<kQBuffers>{})));
  using SmemLayoutK = decltype(tile_to_shape(
      SmemAtomQK{}, make_shape(Int<kBlockN>{}, Int<kHeadDim>{}, Int<kStages>{})));
  using SmemLayoutV = decltype(tile_to_shape(
      SmemAtomV{}, make_shape(Int<kBlockN>{}, Int<kHeadDimV>{}, Int<kStages>{})));
  // V seen as (Dv, N, stage) for the PV GEMM's B operand: same bytes.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(make_shape(Int<kHeadDimV>{}, Int<kBlockN>{}, Int<kStages>{}),
                                         Step<_2, _1, _3>{})));

  // Global q/k/v seen as (seqlen, head dim, heads, batch).
  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor =
      decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      select<0, 2>(TileShape{}), _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{},
                                      take<0, 2>(SmemLayoutK{}), select<1, 2>(TileShape{}), _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutV{}),
                                      make_shape(Int<kBlockN>{}, Int<kHeadDimV>{}), _1{}));
  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesK = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesV = kBlockN * kHeadDimV * sizeof(Element);

  // Epilogue through TMA (v14): each consumer warpgroup writes its 64 rows of
  // O into the rows of the tile's Q buffer that only it has read (stmatrix,
  // the same swizzle as Q) and stores them with one TMA store per swizzle
  // panel (kPanelCols columns x 64 rows, contiguous in the buffer); TMA drops
  // the rows past the end, so no row needs a predicate. Where O fits the Q
  // buffer and that buffer is not refilled before the tile ends: two Q
  // buffers and Dv = D (head dims 64, 96, 128); 192/128 and 256 store O from
  // registers.
  static constexpr bool kTmaStoreO = kQBuffers == 2 && kHeadDimV == kHeadDim;
  static constexpr int kOutRows = 64;  // a consumer warpgroup's rows
  static constexpr int kPanelCols = decltype(size<1>(SmemAtomQK{}))::value;  // one swizzle atom row
  using SmemLayoutOPanel = decltype(tile_to_shape(SmemAtomQK{}, Shape<Int<kOutRows>, Int<kPanelCols>>{}));
  using GmemTensorOut =
      decltype(make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), ShapeQKV{}, StrideQKV{}));
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorOut{}, SmemLayoutOPanel{},
                                      Shape<Int<kOutRows>, Int<kPanelCols>>{}, _1{}));
  // SmemLayoutQ tiles the swizzle atom down the rows first, so panel j of
  // buffer b is kBlockM x kPanelCols contiguous elements and a warpgroup's
  // rows are its half: this is where warpgroup wg's panel j starts.
  static constexpr int out_panel_offset(int buffer, int panel, int wg) {
    return buffer * kBlockM * kHeadDim + panel * kBlockM * kPanelCols + wg * kOutRows * kPanelCols;
  }

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;

  // Tiles alternate between two slots (tile index, live list and its
  // length, Q buffer where there are two). Per slot: list_full (the builders published the tile),
  // barrier_q (its Q landed) and tile_empty (every consumer thread and every
  // lane of the TMA warp are done with the slot).
  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> smem_q;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> smem_k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> smem_v;
    cutlass::arch::ClusterTransactionBarrier barrier_q[2];
    cutlass::arch::ClusterBarrier list_full[2];
    cutlass::arch::ClusterBarrier tile_empty[2];
    // Per slot (kTmaStoreO): the epilogue's TMA stores have read the O staged
    // in the slot's Q buffer, which the TMA warp may then refill.
    cutlass::arch::ClusterBarrier q_free[2];
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
    int tile_index[2];
    int num_live_blocks[2];
    int next_tile;  // the builders' broadcast of the tile just fetched
    int warp_counts[kListThreads / 32];  // scratch of the live-list compaction
    // Masked rows of the partial tile's columns, per consumer warpgroup, two
    // buffers (column-mask calls only: none at 176-key tiles, whose 5.5 KB
    // would cost the lists of the longest calls their room).
    MaskedRows col_bounds[kNumMmaWarpGroups][2][kWideKeys ? 1 : kBlockN];
    // Written, never read: the store that orders the intra-warpgroup
    // overlap's softmax before its wait (flashmask_fwd_sm90_kernel.cuh).
    float2 softmax_pin[kNumMmaThreads];
    // Followed (dynamic shared memory) by the two slots' live key-block
    // lists (sm90_block_list.cuh): one uint16 per key block each.
  };
};

// Backward: one CTA per (key block, query head, batch); warpgroup 0 streams
// Q/dO tiles of 64 query rows through TMA, warpgroups 1-2 keep their dK/dV
// accumulators in registers for the whole CTA. Two layouts of the work:
// - head dim 64/128 (kSplitHeadDim false): 128 keys per CTA, 64 per
//   warpgroup; S^T = K Q^T and dP^T = V dO^T per warpgroup, P^T/dS^T straight
//   from registers into dV/dK, dQ = dS K with the head dim split;
// - head dims 192/128 and 256 (kSplitHeadDim true): dK and dV of 64 keys x
//   256 would take 256 registers a thread, so both warpgroups share 64 keys
//   and split the head dims of dK/dV/dQ (dK and dV 64 registers each at 256;
//   48 and 32 at 192/128); S = Q K^T and dP = dO V^T are split over the keys
//   (32 each), and P and dS reach the other warpgroup through shared memory.
//   dQ is staged for the writer warp's bulk reduce-adds at 192/128 and goes
//   from registers to dq_accum with vector atomics at 256 (no shared memory is
//   left for its staging there: K, V, two stages of Q and dO and P/dS take
//   208 KB).
// kHeadDim is q's and k's (dQ, dK), kHeadDimV v's and dO's (dV).
template <int kHeadDim_, typename Element_>
struct BwdTraits {
  using Element = Element_;
  using ElementAccum = float;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = value_head_dim_for(kHeadDim);
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256,
                "sm90 backward: head dim 64, 96, 128, 192 (value 128) or 256");
  static constexpr bool kSplitHeadDim = kHeadDim > 128;

  static constexpr int kNumMmaWarpGroups = 2;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWarpGroups;
  static constexpr int kNThreads = kNumMmaThreads + 128;
  static constexpr int kBlockN = kSplitHeadDim ? 64 : 64 * kNumMmaWarpGroups;  // keys per CTA
  static constexpr int kBlockM = 64;                                           // query rows per step
  static constexpr int kStages = 2;
  static constexpr int kLoadRegisters = 24;
  static constexpr int kMmaRegisters = 240;

  // Not split: S^T = K Q^T and dP^T = V dO^T, (keys, queries, D), keys split
  // over the two warpgroups. Split: S = Q K^T and dP = dO V^T, (queries,
  // keys, D), keys split. Both operands K-major in shared memory. (The
  // GEMMs' K extent, D or Dv, is not part of the tiled wgmma.)
  using TileShapeSdP = std::conditional_t<kSplitHeadDim, Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>,
                                          Shape<Int<kBlockN>, Int<kBlockM>, Int<kHeadDim>>>;
  using AtomLayoutSdP = std::conditional_t<kSplitHeadDim, Layout<Shape<_1, Int<kNumMmaWarpGroups>, _1>>,
                                           Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum,
                           std::conditional_t<kSplitHeadDim,
                                              Shape<Int<kBlockM>, Int<kBlockN / kNumMmaWarpGroups>, Int<kHeadDim>>,
                                              TileShapeSdP>>(),
      AtomLayoutSdP{}));
  // dV += P^T dO, (keys, Dv, queries), and dK += dS^T Q, (keys, D, queries).
  // Not split: keys split over the warpgroups, P^T/dS^T from registers;
  // split: the head dim split, P^T/dS^T from shared memory (queries
  // contiguous: K-major). dO/Q MN-major.
  template <int kDim>
  using TiledMmaGradKV = std::conditional_t<
      kSplitHeadDim,
      decltype(make_tiled_mma(
          GMMA::ss_op_selector<Element, Element, ElementAccum,
                               Shape<Int<kBlockN>, Int<kDim / kNumMmaWarpGroups>, Int<kBlockM>>,
                               GMMA::Major::K, GMMA::Major::MN>(),
          Layout<Shape<_1, Int<kNumMmaWarpGroups>, _1>>{})),
      decltype(make_tiled_mma(
          GMMA::rs_op_selector<Element, Element, ElementAccum, Shape<Int<kBlockN>, Int<kDim>, Int<kBlockM>>,
                               GMMA::Major::K, GMMA::Major::MN>(),
          Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>{}))>;
  using TiledMmadK = TiledMmaGradKV<kHeadDim>;
  using TiledMmadV = TiledMmaGradKV<kHeadDimV>;
  // dQ = dS K: (queries, D, keys), the head dim split over the warpgroups
  // (each one's wgmma atom is N = D / 2 wide); dS (queries contiguous) and K
  // (D contiguous) both MN-major.
  using TileShapedQ = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum,
                           Shape<Int<kBlockM>, Int<kHeadDim / kNumMmaWarpGroups>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kNumMmaWarpGroups>, _1>>{}));
  static_assert(kHeadDim % (8 * kNumMmaWarpGroups) == 0, "dQ splits the head dim");
  // Each tiled wgmma must cover exactly its GEMM's (M, N).
  static_assert(decltype(tile_size<0>(TiledMmaSdP{}))::value == size<0>(TileShapeSdP{}) &&
                decltype(tile_size<1>(TiledMmaSdP{}))::value == size<1>(TileShapeSdP{}));
  static_assert(decltype(tile_size<0>(TiledMmadK{}))::value == kBlockN &&
                decltype(tile_size<1>(TiledMmadK{}))::value == kHeadDim);
  static_assert(decltype(tile_size<0>(TiledMmadV{}))::value == kBlockN &&
                decltype(tile_size<1>(TiledMmadV{}))::value == kHeadDimV);
  static_assert(decltype(tile_size<0>(TiledMmadQ{}))::value == kBlockM &&
                decltype(tile_size<1>(TiledMmadQ{}))::value == kHeadDim);

  // Q and K are read MN-major with the head dim split over the warpgroups (dK's
  // and dQ's B operands): each half must be whole rows of the swizzle.
  // Without the split the warpgroups take whole head dims.
  // dQ's B operand, K seen MN-major, is split over the warpgroups in either
  // layout: at 96 its halves of 48 columns need 32-byte swizzle rows (elsewhere
  // Q's atom serves, whole rows at 64 and 128 alike).
  static constexpr int kSliceQK = kSplitHeadDim ? kHeadDim / kNumMmaWarpGroups : kHeadDim;
  static constexpr int kSliceK = kHeadDim == 96 ? kHeadDim / kNumMmaWarpGroups : kSliceQK;
  static constexpr int kSliceV = kSplitHeadDim ? kHeadDimV / kNumMmaWarpGroups : kHeadDimV;
  using SmemAtomQK = KMajorSmemAtom<Element, kSliceQK>;
  using SmemAtomK = KMajorSmemAtom<Element, kSliceK>;
  using SmemAtomV = KMajorSmemAtom<Element, kSliceV>;
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK{}, make_shape(Int<kBlockN>{}, Int<kHeadDim>{})));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(make_shape(Int<kHeadDim>{}, Int<kBlockN>{}), Step<_2, _1>{})));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtomV{}, make_shape(Int<kBlockN>{}, Int<kHeadDimV>{})));
  template <typename Atom, int kDim>
  using StagedRows = decltype(tile_to_shape(Atom{}, make_shape(Int<kBlockM>{}, Int<kDim>{}, Int<kStages>{})));
  template <typename Layout_, int kDim>
  using StagedRowsT = decltype(composition(
      Layout_{}, make_ordered_layout(make_shape(Int<kDim>{}, Int<kBlockM>{}, Int<kStages>{}), Step<_2, _1, _3>{})));
  using SmemLayoutQ = StagedRows<SmemAtomQK, kHeadDim>;
  using SmemLayoutQt = StagedRowsT<SmemLayoutQ, kHeadDim>;
  using SmemLayoutdO = StagedRows<SmemAtomV, kHeadDimV>;
  using SmemLayoutdOt = StagedRowsT<SmemLayoutdO, kHeadDimV>;
  // dS: (queries, keys, buffer), queries contiguous; dS^T is the same bytes
  // seen as (keys, queries), which is how the accumulators write it. Split:
  // one buffer each for dS and P (shared memory is full), and their (keys,
  // queries) K-major views are canonical wgmma layouts of the same bytes (an
  // element (query q, key k) at q + 64 k in both, under the same swizzle).
  static constexpr int kDSBuffers = kSplitHeadDim ? 1 : 2;
  using SmemLayoutdS = decltype(tile_to_shape(
      GMMA::Layout_MN_SW128_Atom<Element>{}, make_shape(Int<kBlockM>{}, Int<kBlockN>{}, Int<kDSBuffers>{})));
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_layout(make_shape(Int<kBlockN>{}, Int<kBlockM>{}, Int<kDSBuffers>{}),
                                  make_stride(Int<kBlockM>{}, _1{}, Int<kBlockM * kBlockN>{}))));
  using SmemLayoutPdSt = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                                make_shape(Int<kBlockN>{}, Int<kBlockM>{})));
  static_assert(!kSplitHeadDim || kBlockM == 64, "P/dS views: 64 queries, one 128-byte swizzle row");

  using ShapeQKV = typename FwdTraits<kHeadDim, Element>::ShapeQKV;
  using GmemTensor = typename FwdTraits<kHeadDim, Element>::GmemTensor;
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      make_shape(Int<kBlockM>{}, Int<kHeadDim>{}), _1{}));
  using TmadO = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutdO{}),
                                       make_shape(Int<kBlockM>{}, Int<kHeadDimV>{}), _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                      make_shape(Int<kBlockN>{}, Int<kHeadDim>{}), _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutV{},
                                      make_shape(Int<kBlockN>{}, Int<kHeadDimV>{}), _1{}));
  // A stage's Q and dO tiles; K and V of the CTA.
  static constexpr uint32_t kTmaBytesQdO = kBlockM * (kHeadDim + kHeadDimV) * sizeof(Element);
  static constexpr uint32_t kTmaBytesKV = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);
  static constexpr uint32_t kRowStatsBytes = kBlockM * sizeof(float);  // LSE or delta of a step

  // dQ of one step, per warpgroup (its head-dim half): stored in accumulator
  // order (BwdParams::dq_accum_tiled), staged in shared memory and added with
  // one bulk reduce-add each by the producer's dQ writer warp where there is
  // room for the 64 x D fp32 staging buffer (head dims up to 192: 48 KB at
  // 192/128, 187 KB in all), else (256) vector atomics from the registers.
  static constexpr bool kStageDQ = kHeadDim <= 192;
  static constexpr int kDQHalfFloats = kBlockM * kHeadDim / kNumMmaWarpGroups;
  static constexpr int kDQStagingFloats = kStageDQ ? kBlockM * kHeadDim : 4;
  static constexpr int kPElems = kSplitHeadDim ? kBlockM * kBlockN : 8;  // P (split only)

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> smem_k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> smem_v;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> smem_q;
    cute::array_aligned<Element, cosize_v<SmemLayoutdO>, 1024> smem_do;
    cute::array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> smem_ds;
    cute::array_aligned<Element, kPElems, 1024> smem_p;  // split: P, laid out as dS
    // dQ of one step in fp32, each warpgroup's half in its accumulators'
    // order (16-byte stores, conflict-free); the dQ writer warp adds each half
    // to the step's tile of dq_accum with one bulk reduce (not split).
    cute::array_aligned<float, kDQStagingFloats, 128> smem_dq;
    // Per stage, the step's rows of BwdParams::row_stats (LSE x log2(e) and
    // delta), loaded with the Q/dO tiles.
    cute::array_aligned<float, kStages * kBlockM, 128> smem_lse;
    cute::array_aligned<float, kStages * kBlockM, 128> smem_delta;
    cutlass::arch::ClusterTransactionBarrier barrier_kv;
    typename Pipeline::SharedStorage pipeline_qdo;
    int num_live_blocks;
    MaskedRows key_rows[kBlockN];  // each key's masked query rows (mask_bounds.h)
    // Query heads this CTA covers (bwd_head_group, or fewer where grouping is
    // fitted to the key block); re-read where used, like num_live_blocks,
    // rather than held in a register across the role split.
    int cta_heads;
    int warp_counts[kNThreads / 32];  // scratch of the live-list compaction
    // Followed by the live query-block list (sm90_block_list.cuh).
  };
};

}  // namespace sm90
}  // namespace flashmask
