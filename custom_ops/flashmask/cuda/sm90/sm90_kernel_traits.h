// Compile-time shape of the Hopper forward kernel for one (head dim, dtype):
// tile sizes, the warp roles, the swizzled shared-memory layouts that both
// TMA writes and wgmma reads, the two tiled wgmmas and the TMA pipelines.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "../../mask_bounds.h"

namespace flashmask {
namespace sm90 {

using namespace cute;

// One BlockBounds summary per kMaskBlockN key columns (cuda/kernel_traits.h);
// a key tile here spans kBlockN / kMaskBlockN of them.
template <int kHeadDim_, typename Element_>
struct FwdTraits {
  using Element = Element_;  // cutlass::bfloat16_t or cutlass::half_t
  using ElementAccum = float;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "sm90 forward: head dim 64 or 128");

  // Warpgroup 0 loads (warp 0 issues TMA, warps 1-3 build the next tiles'
  // live lists), warpgroups 1 and 2 compute 64 query rows each.
  static constexpr int kNumMmaWarpGroups = 2;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWarpGroups;
  static constexpr int kNThreads = kNumMmaThreads + 128;
  static constexpr int kListThreads = 128 - 32;  // the producer warpgroup less the TMA warp
  static constexpr int kBlockM = 64 * kNumMmaWarpGroups;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 2;
  // setmaxnreg budgets: 24 x 128 + 240 x 256 <= 64K registers of the SM.
  static constexpr int kLoadRegisters = 24;
  static constexpr int kMmaRegisters = 240;

  using TileShape = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;  // (M, N, D)
  using AtomLayout = Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>;

  // S = Q K^T: both operands from shared memory, K-major (head dim contiguous).
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, TileShape>(), AtomLayout{}));
  // O += P V: P from registers (the softmax output never touches shared
  // memory); V is MN-major (head dim contiguous, the GEMM's N).
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, ElementAccum,
                           decltype(select<0, 2, 1>(TileShape{})), GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayout{}));

  static_assert(decltype(tile_size<0>(TiledMmaQK{}))::value == kBlockM &&
                decltype(tile_size<1>(TiledMmaQK{}))::value == kBlockN);
  static_assert(decltype(tile_size<0>(TiledMmaPV{}))::value == kBlockM &&
                decltype(tile_size<1>(TiledMmaPV{}))::value == kHeadDim);

  // 128-byte swizzle (64 x 16-bit per row): what TMA writes and wgmma reads
  // without bank conflicts.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  // Two Q buffers: the next tile's Q lands while this one computes.
  using SmemLayoutQ = decltype(tile_to_shape(
      SmemAtom{}, make_shape(Int<kBlockM>{}, Int<kHeadDim>{}, _2{})));
  using SmemLayoutK = decltype(tile_to_shape(
      SmemAtom{}, make_shape(Int<kBlockN>{}, Int<kHeadDim>{}, Int<kStages>{})));
  using SmemLayoutV = SmemLayoutK;
  // V seen as (D, N, stage) for the PV GEMM's B operand: same bytes.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(make_shape(Int<kHeadDim>{}, Int<kBlockN>{}, Int<kStages>{}),
                                         Step<_2, _1, _3>{})));

  // Global q/k/v seen as (seqlen, head dim, heads, batch).
  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor =
      decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      select<0, 2>(TileShape{}), _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{},
                                       take<0, 2>(SmemLayoutK{}), select<1, 2>(TileShape{}), _1{}));
  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesKV = kBlockN * kHeadDim * sizeof(Element);

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;

  // Tiles alternate between two slots (tile index, live list and its
  // length, Q buffer). Per slot: list_full (the builders published the tile),
  // barrier_q (its Q landed) and tile_empty (every consumer thread and every
  // lane of the TMA warp are done with the slot).
  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> smem_q;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> smem_k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> smem_v;
    cutlass::arch::ClusterTransactionBarrier barrier_q[2];
    cutlass::arch::ClusterBarrier list_full[2];
    cutlass::arch::ClusterBarrier tile_empty[2];
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
    int tile_index[2];
    int num_live_blocks[2];
    int next_tile;  // the builders' broadcast of the tile just fetched
    int warp_counts[kListThreads / 32];  // scratch of the live-list compaction
    // Masked rows of the partial tile's columns, per consumer warpgroup, two buffers.
    MaskedRows col_bounds[kNumMmaWarpGroups][2][kBlockN];
    // Written, never read: the store that orders the intra-warpgroup
    // overlap's softmax before its wait (flashmask_fwd_sm90_kernel.cuh).
    float2 softmax_pin[kNumMmaThreads];
    // Followed (dynamic shared memory) by the two slots' live key-block
    // lists (sm90_block_list.cuh): one uint16 per key block each.
  };
};

// Backward: one CTA per (key block of 128, query head, batch); warpgroup 0
// streams Q/dO tiles of 64 query rows through TMA, warpgroups 1-2 own 64 keys
// each and keep their dK/dV accumulators in registers for the whole CTA.
template <int kHeadDim_, typename Element_>
struct BwdTraits {
  using Element = Element_;
  using ElementAccum = float;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "sm90 backward: head dim 64 or 128");

  static constexpr int kNumMmaWarpGroups = 2;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWarpGroups;
  static constexpr int kNThreads = kNumMmaThreads + 128;
  static constexpr int kBlockN = 64 * kNumMmaWarpGroups;  // keys per CTA
  static constexpr int kBlockM = 64;                      // query rows per step
  static constexpr int kStages = 2;
  static constexpr int kLoadRegisters = 24;
  static constexpr int kMmaRegisters = 240;

  // S^T = K Q^T and dP^T = V dO^T: (keys, queries, D), keys split over the
  // two warpgroups, both operands K-major in shared memory.
  using TileShapeSdP = Shape<Int<kBlockN>, Int<kBlockM>, Int<kHeadDim>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, TileShapeSdP>(),
      Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>{}));
  // dV += P^T dO and dK += dS^T Q: (keys, D, queries), P^T/dS^T from
  // registers, dO/Q MN-major (D contiguous).
  using TileShapedKV = Shape<Int<kBlockN>, Int<kHeadDim>, Int<kBlockM>>;
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, ElementAccum, TileShapedKV, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>{}));
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
  static_assert(decltype(tile_size<0>(TiledMmaSdP{}))::value == kBlockN &&
                decltype(tile_size<1>(TiledMmaSdP{}))::value == kBlockM);
  static_assert(decltype(tile_size<0>(TiledMmadKV{}))::value == kBlockN &&
                decltype(tile_size<1>(TiledMmadKV{}))::value == kHeadDim);
  static_assert(decltype(tile_size<0>(TiledMmadQ{}))::value == kBlockM &&
                decltype(tile_size<1>(TiledMmadQ{}))::value == kHeadDim);

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, make_shape(Int<kBlockN>{}, Int<kHeadDim>{})));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(make_shape(Int<kHeadDim>{}, Int<kBlockN>{}), Step<_2, _1>{})));
  using SmemLayoutQ = decltype(tile_to_shape(
      SmemAtom{}, make_shape(Int<kBlockM>{}, Int<kHeadDim>{}, Int<kStages>{})));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(make_shape(Int<kHeadDim>{}, Int<kBlockM>{}, Int<kStages>{}),
                                         Step<_2, _1, _3>{})));
  // dS: (queries, keys, buffer), queries contiguous; dS^T is the same bytes
  // seen as (keys, queries), which is how the accumulators write it.
  using SmemLayoutdS = decltype(tile_to_shape(
      GMMA::Layout_MN_SW128_Atom<Element>{}, make_shape(Int<kBlockM>{}, Int<kBlockN>{}, _2{})));
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_layout(make_shape(Int<kBlockN>{}, Int<kBlockM>{}, _2{}),
                                  make_stride(Int<kBlockM>{}, _1{}, Int<kBlockM * kBlockN>{}))));

  using ShapeQKV = typename FwdTraits<kHeadDim, Element>::ShapeQKV;
  using GmemTensor = typename FwdTraits<kHeadDim, Element>::GmemTensor;
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      make_shape(Int<kBlockM>{}, Int<kHeadDim>{}), _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                       make_shape(Int<kBlockN>{}, Int<kHeadDim>{}), _1{}));
  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);  // Q or dO tile
  static constexpr uint32_t kTmaBytesKV = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kRowStatsBytes = kBlockM * sizeof(float);  // LSE or delta of a step

  // dQ of one step, per warpgroup (its head-dim half): stored in accumulator
  // order (BwdParams::dq_accum_tiled), one bulk reduce-add each.
  static constexpr int kDQHalfFloats = kBlockM * kHeadDim / kNumMmaWarpGroups;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> smem_k;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> smem_v;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> smem_q;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> smem_do;
    cute::array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> smem_ds;
    // dQ of one step in fp32, each warpgroup's half in its accumulators'
    // order (16-byte stores, conflict-free); the dQ writer warp adds each half
    // to the step's tile of dq_accum with one bulk reduce.
    cute::array_aligned<float, kBlockM * kHeadDim, 128> smem_dq;
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
