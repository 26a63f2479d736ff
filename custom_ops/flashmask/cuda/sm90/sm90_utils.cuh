// Small device helpers of the Hopper kernels: issuing a warpgroup GEMM, and
// viewing wgmma accumulators by (row, column) or as the A operand of the next
// GEMM.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace flashmask {
namespace sm90 {

using namespace cute;

// The consumers' lambdas are inlined whatever their number of call sites:
// one left out of line takes the wgmma accumulators it touches to local
// memory, and ptxas then serialises every wgmma of the kernel.
#define FLASHMASK_INLINE __attribute__((always_inline))

// C (+)= A B over all k-steps as one wgmma batch. kWait >= 0 waits until at
// most kWait batches are in flight; -1 leaves the batch running (the caller
// waits later, overlapping it with other work).
template <bool kZeroInit, int kWait, typename TiledMma, typename TA, typename TB, typename TC>
__device__ __forceinline__ void warpgroup_gemm(TiledMma& tiled_mma, TA const& tA, TB const& tB,
                                               TC& tC) {
  constexpr bool kAInRegs =
      !cute::is_base_of<cute::GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  if constexpr (kAInRegs) warpgroup_fence_operand(const_cast<TA&>(tA));
  warpgroup_fence_operand(tC);
  warpgroup_arrive();
  if constexpr (kZeroInit) tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < size<2>(tA); ++k) {
    cute::gemm(tiled_mma, tA(_, _, k), tB(_, _, k), tC);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait >= 0) warpgroup_wait<kWait>();
  warpgroup_fence_operand(tC);
  if constexpr (kAInRegs) warpgroup_fence_operand(const_cast<TA&>(tA));
}

// wgmma accumulator ((2, 2, V), MMA_M, MMA_N) -> ((2, MMA_M), (2, V, MMA_N)):
// rows (this thread's r and r + 8) by columns.
template <typename Layout>
__device__ __forceinline__ auto acc_as_rows_cols(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3 && decltype(rank(get<0>(acc)))::value == 3);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// The same registers as the A operand of a 16-bit register-sourced wgmma:
// each k-step of 16 columns is two of the accumulator's 8-column groups.
template <typename Layout>
__device__ __forceinline__ auto acc_as_a_operand(Layout acc) {
  static_assert(decltype(size<0, 0>(acc))::value == 2 && decltype(size<0, 1>(acc))::value == 2);
  auto l = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});  // (2, 2, (2, V/2))
  return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                     make_layout(get<2, 1>(l), get<2>(acc)));
}

// Column of element c of a thread's row in acc_as_rows_cols, relative to its
// first one: a wgmma accumulator gives each thread column pairs 8 apart.
// Written as a constant so per-column addresses fold into immediates instead
// of living in registers.
__device__ __forceinline__ constexpr int acc_col_offset(int c) { return (c % 2) + 8 * (c / 2); }

// Element-wise conversion of a register tensor (fp32 accumulators to 16-bit).
template <typename To, typename Tensor>
__device__ __forceinline__ auto convert_tensor(Tensor const& src) {
  auto dst = make_tensor<To>(src.layout());
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(src); ++i) dst(i) = To(src(i));
  return dst;
}

// fp32 accumulators to 16-bit pairs packed the way a register-sourced wgmma
// reads its A operand: elements 2j and 2j + 1 (adjacent columns of a row) in
// word j. Written as whole words so that no instruction repacks P between
// wgmmas (ptxas serialises a wgmma pipeline whose A registers are defined
// inside it, C7513).
template <typename Element>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  static_assert(sizeof(Element) == 2);
  if constexpr (cute::is_same_v<Element, cutlass::bfloat16_t>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(pair);
  } else {
    const __half2 pair = __floats2half2_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(pair);
  }
}

template <typename Element, typename Tensor>
__device__ __forceinline__ void pack_pairs(Tensor const& src, uint32_t* dst) {
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < size(src) / 2; ++j) dst[j] = pack_pair<Element>(src(2 * j), src(2 * j + 1));
}

// 1 / x for x >= 1 (a softmax row sum with anything visible: its maximum
// contributes exp2(0)): MUFU.RCP alone, without the IEEE reciprocal's
// slow-path call and its branches.
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float quad_allreduce_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_allreduce_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace sm90
}  // namespace flashmask
