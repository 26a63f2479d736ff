// Host side of the Hopper kernels: TMA descriptors over the caller's strided
// [batch, seqlen, heads, dim] tensors, shared-memory sizing and the launch.
// Instantiated per (head dim, dtype) in flashmask_*_sm90_hdim*.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <cutlass/numeric_types.h>

#include "../cuda_check.h"
#include "../workspace.h"
#include "flashmask_bwd_sm90_kernel.cuh"
#include "flashmask_fwd_sm90_kernel.cuh"

namespace flashmask {
namespace sm90 {

// Our API's 16-bit types -> CUTLASS's.
template <typename T> struct CutlassElement;
template <> struct CutlassElement<__half> { using type = cutlass::half_t; };
template <> struct CutlassElement<__nv_bfloat16> { using type = cutlass::bfloat16_t; };

template <int kHeadDim, typename T>
void run_fwd_(const FwdParams& p, cudaStream_t stream);
template <int kHeadDim, typename T>
void run_bwd_(const BwdParams& p, cudaStream_t stream);

// Shared storage plus `num_lists` live-block lists (one uint16 per block of
// the streamed dimension: key blocks forward, query blocks backward).
template <typename Traits>
int smem_bytes(int list_blocks, int num_lists = 1) {
  return int(sizeof(typename Traits::SharedStorage)) + num_lists * live_list_capacity(list_blocks) * 2;
}

// Pingpong between the forward's consumer warpgroups (scheduler_wait_turn),
// opt-in with PADDLE_FLASHMASK_SM90_FWD_PINGPONG=1. Off by default: on the
// H200 it cost 5-8% (causal 16K forward 632 -> 584 TFLOP/s), since without
// the intra-warpgroup overlap (NOTES.md, v6) each warpgroup still waits on its
// own S, and the turns only add barrier latency (NOTES.md, v8).
inline bool fwd_pingpong() {
  const char* env = std::getenv("PADDLE_FLASHMASK_SM90_FWD_PINGPONG");
  if (env == nullptr || *env == '\0' || std::string(env) == "0") return false;
  if (std::string(env) == "1") return true;
  throw std::invalid_argument(std::string("PADDLE_FLASHMASK_SM90_FWD_PINGPONG must be 0 or 1, got '") + env + "'");
}

// (seqlen, head dim, heads, batch) view of one of q/k/v for its TMA descriptor.
template <typename Element>
auto gmem_view(const void* ptr, int seqlen, int head_dim, int heads, int batch, int64_t row_stride,
               int64_t head_stride, int64_t batch_stride) {
  return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)),
                     make_shape(seqlen, head_dim, heads, batch),
                     make_stride(row_stride, _1{}, head_stride, batch_stride));
}

template <int kHeadDim, typename T>
void launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using Element = typename CutlassElement<T>::type;
  using Traits = FwdTraits<kHeadDim, Element>;
  FwdKernelParams<Traits> kp{};
  kp.p = p;
  auto mQ = gmem_view<Element>(p.q, p.seqlen_q, p.head_dim, p.num_heads, p.batch, p.q_row_stride,
                               p.q_head_stride, p.q_batch_stride);
  auto mK = gmem_view<Element>(p.k, p.seqlen_k, p.head_dim, p.num_heads_k, p.batch, p.k_row_stride,
                               p.k_head_stride, p.k_batch_stride);
  auto mV = gmem_view<Element>(p.v, p.seqlen_k, p.head_dim, p.num_heads_k, p.batch, p.v_row_stride,
                               p.v_head_stride, p.v_batch_stride);
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Traits::SmemLayoutQ{}),
                           select<0, 2>(typename Traits::TileShape{}), _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Traits::SmemLayoutK{}),
                           select<1, 2>(typename Traits::TileShape{}), _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename Traits::SmemLayoutV{}),
                           select<1, 2>(typename Traits::TileShape{}), _1{});

  const bool column_mask = p.mask.startend_row_indices != nullptr;
  auto kernel = fwd_pingpong() ? (column_mask ? flashmask_fwd_sm90_kernel<Traits, true, true>
                                              : flashmask_fwd_sm90_kernel<Traits, false, true>)
                               : (column_mask ? flashmask_fwd_sm90_kernel<Traits, true, false>
                                              : flashmask_fwd_sm90_kernel<Traits, false, false>);
  const int smem = smem_bytes<Traits>((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, 2);
  FLASHMASK_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Persistent: one CTA per SM; after the first wave the CTAs take tiles
  // from a counter in the caller's workspace, zeroed here on the stream.
  kp.tile_counter = cuda::tile_counters(p);
  FLASHMASK_CUDA_CHECK(cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream));
  const int64_t tiles = int64_t(fwd_query_blocks<Traits>(p)) * p.num_heads * p.batch;
  const dim3 grid(unsigned(std::min<int64_t>(tiles, sm_count())));
  kernel<<<grid, Traits::kNThreads, smem, stream>>>(kp);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

template <int kHeadDim, typename T>
void launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using Element = typename CutlassElement<T>::type;
  using Traits = BwdTraits<kHeadDim, Element>;
  BwdKernelParams<Traits> kp{};
  kp.p = p;
  kp.dkv_written = cuda::dkv_written_flags(p);
  auto mQ = gmem_view<Element>(p.q, p.seqlen_q, p.head_dim, p.num_heads, p.batch, p.q_row_stride,
                               p.q_head_stride, p.q_batch_stride);
  auto mdO = gmem_view<Element>(p.dout, p.seqlen_q, p.head_dim, p.num_heads, p.batch,
                                p.do_row_stride, p.do_head_stride, p.do_batch_stride);
  auto mK = gmem_view<Element>(p.k, p.seqlen_k, p.head_dim, p.num_heads_k, p.batch, p.k_row_stride,
                               p.k_head_stride, p.k_batch_stride);
  auto mV = gmem_view<Element>(p.v, p.seqlen_k, p.head_dim, p.num_heads_k, p.batch, p.v_row_stride,
                               p.v_head_stride, p.v_batch_stride);
  const auto tile_q = make_shape(Int<Traits::kBlockM>{}, Int<kHeadDim>{});
  const auto tile_k = make_shape(Int<Traits::kBlockN>{}, Int<kHeadDim>{});
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Traits::SmemLayoutQ{}), tile_q, _1{});
  kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, mdO, take<0, 2>(typename Traits::SmemLayoutQ{}), tile_q, _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, typename Traits::SmemLayoutK{}, tile_k, _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, typename Traits::SmemLayoutK{}, tile_k, _1{});

  auto kernel = flashmask_bwd_sm90_kernel<Traits>;
  const int smem = smem_bytes<Traits>((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM);
  FLASHMASK_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int group = p.num_heads / p.num_heads_k;
  if (p.bwd_head_group < 1 || group % p.bwd_head_group != 0) {
    throw std::invalid_argument("flashmask sm90 backward: bwd_head_group must divide the GQA group");
  }
  if (p.dq_accum_tiled == p.deterministic) {
    throw std::invalid_argument(
        "flashmask sm90 backward: dq_accum_tiled must be planned (plan_bwd_cuda): tiles unless deterministic");
  }
  if (p.row_stats == nullptr) {
    throw std::invalid_argument(
        "flashmask sm90 backward: row_stats is null (allocate bwd_row_stats_elems floats after plan_bwd_cuda)");
  }
  // Fitted grouping: a CTA per head, sub-groups formed in the kernel.
  const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN,
                  p.fitted_head_groups() ? p.num_heads : p.num_heads / p.bwd_head_group, p.batch);
  kernel<<<grid, Traits::kNThreads, smem, stream>>>(kp);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
  if (p.dq_accum_tiled) {  // else dQ is the deterministic pass's, converted by bwd_finish
    const dim3 tiles(unsigned(cuda::bwd_padded_rows(p.seqlen_q) / Traits::kBlockM), p.num_heads, p.batch);
    dq_tiles_to_dq_kernel<Traits><<<tiles, Traits::kNumMmaThreads, 0, stream>>>(p);
    FLASHMASK_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace sm90
}  // namespace flashmask
