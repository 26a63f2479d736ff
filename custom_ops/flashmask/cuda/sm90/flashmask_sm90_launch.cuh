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
#include "../env_settings.h"
#include "../kernel_traits.h"
#include "../workspace.h"
#include "flashmask_bwd_sm90_kernel.cuh"
#include "flashmask_fwd_sm90_kernel.cuh"
#include "flashmask_sm90_api.h"

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

// The forward's schedule. Default: the intra-warpgroup overlap (the
// softmax of block i under the P V GEMM of block i - 1; NOTES.md, v11):
// +0-5% over the serial loop on causal 8K/32K, causal document 32K and sliding
// windows (H100 harness, two passes), even at 16K and D = 64 (within 1%),
// -2-3% on 128-512-token documents at 8K. PADDLE_FLASHMASK_SM90_FWD_OVERLAP=0
// gives the serial loop.
inline bool fwd_overlap() { return cuda::env_switch("PADDLE_FLASHMASK_SM90_FWD_OVERLAP", true); }

// Pingpong between the consumer warpgroups (scheduler_wait_turn),
// PADDLE_FLASHMASK_SM90_FWD_PINGPONG=1, runs the serial loop with turns and
// takes precedence over the overlap. It has not paid: -5-8% alone on the
// H200 (v8a); with the overlap -1-9% on causal (D = 64 16K 425 -> 388), at
// best +2% elsewhere, and one timing pass of that combination stalled at
// causal 16K on the H100 (not reproduced), so the combination is not built.
inline bool fwd_pingpong() { return cuda::env_switch("PADDLE_FLASHMASK_SM90_FWD_PINGPONG", false); }

// The forward's tile order (fwd_tile_of): the query heads of a GQA group side
// by side, so the CTAs that read the same K/V blocks run at once and fetch
// them from HBM once (PADDLE_FLASHMASK_SM90_FWD_GQA_TILES=0: one head's
// query blocks side by side, as before).
inline bool fwd_gqa_tiles() { return cuda::env_switch("PADDLE_FLASHMASK_SM90_FWD_GQA_TILES", true); }

// Heavy tiles first (fwd_tile_order.cuh) where a column-masked call has more
// key blocks than a tile needs to be heavy; PADDLE_FLASHMASK_SM90_FWD_HEAVY_FIRST=0:
// fwd_tile_of's order always, as before.
// PADDLE_FLASHMASK_SM90_FWD_HEAVY_MIN_BLOCKS sets heavy_threshold's floor (tests
// lower it to order short calls this way).
inline int fwd_heavy_min_blocks() {
  return cuda::env_int("PADDLE_FLASHMASK_SM90_FWD_HEAVY_MIN_BLOCKS", kHeavyMinBlocks, 1, 1 << 15);
}
template <typename Traits>
bool fwd_heavy_first(const FwdParams& p) {
  return p.mask.startend_row_indices != nullptr &&
         (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN > fwd_heavy_min_blocks() &&
         cuda::env_switch("PADDLE_FLASHMASK_SM90_FWD_HEAVY_FIRST", true);
}

// The two passes that order the forward's tiles heavy first (count, select),
// on the stream before the forward; returns the order for FwdKernelParams.
template <typename Traits>
const int32_t* launch_fwd_tile_order(const FwdParams& p, int heads_together, cudaStream_t stream) {
  int32_t* const order = cuda::fwd_tile_order(p);
  const int query_blocks = fwd_query_blocks<Traits>(p);
  const int key_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const int list_bytes = live_list_capacity(key_blocks) * int(sizeof(uint16_t));
  fwd_tile_count_kernel<Traits::kListThreads, Traits::kBlockM, Traits::kBlockN>
      <<<dim3(query_blocks, unsigned(cuda::summary_table_rows(p))), Traits::kListThreads, list_bytes, stream>>>(
          p, query_blocks, order);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
  constexpr int kSelectThreads = 1024;
  fwd_heavy_select_kernel<kSelectThreads><<<1, kSelectThreads, 0, stream>>>(p, query_blocks, heads_together,
                                                                           sm_count(), fwd_heavy_min_blocks(), order);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
  return order;
}

// The backward's finish (bwd_finish_kernel) as the main kernel's programmatic
// dependent, on the SMs its last wave leaves (sm90 v18, NOTES.md);
// PADDLE_FLASHMASK_SM90_BWD_FINISH_OVERLAP=0 launches it after the main
// kernel instead (the same kernel and work).
inline bool bwd_finish_overlap() { return cuda::env_switch("PADDLE_FLASHMASK_SM90_BWD_FINISH_OVERLAP", true); }

// The kernels' head dims are compile-time: the call's must be the instantiation's,
// or (kPaddedOk) run on its tiles (cuda::tile_head_dim: 80 on 96's), where the
// kernel's TMA loads fill the columns past the tensors' head dims with zeros and
// its stores leave those columns out: the forward where O leaves by TMA (the
// register epilogue of 192/128 and 256 writes all kHeadDimV columns), the
// backward always (write_grad, the finish's conversions).
template <typename Traits, bool kPaddedOk>
void check_head_dims(const FwdParams& p) {
  const bool padded = kPaddedOk && cuda::tile_head_dim(p.head_dim) == Traits::kHeadDim &&
                      cuda::tile_head_dim(p.value_head_dim()) == Traits::kHeadDimV;
  if (!padded && (p.head_dim != Traits::kHeadDim || p.value_head_dim() != Traits::kHeadDimV)) {
    throw std::invalid_argument("flashmask sm90: head dims " + std::to_string(p.head_dim) + "/" +
                                std::to_string(p.value_head_dim()) + " reached the " +
                                std::to_string(Traits::kHeadDim) + "/" + std::to_string(Traits::kHeadDimV) +
                                " kernel");
  }
}

template <typename Traits>
using FwdKernel = void (*)(FwdKernelParams<Traits>);

// one_visible (column masks under the overlap schedule, the default): the
// instantiation that tests partial tiles against one visible interval per
// column (one_visible_interval in mask_bounds.h).
template <typename Traits, bool kColumnMask>
FwdKernel<Traits> fwd_kernel_for(bool pingpong, bool overlap, bool one_visible) {
  if (pingpong) return flashmask_fwd_sm90_kernel<Traits, kColumnMask, /*kPingPong=*/true, /*kOverlap=*/false>;
  if (!overlap) return flashmask_fwd_sm90_kernel<Traits, kColumnMask, false, false>;
  if constexpr (kColumnMask) {
    if (one_visible) return flashmask_fwd_sm90_kernel<Traits, true, false, true, /*kOneVisible=*/true>;
  }
  return flashmask_fwd_sm90_kernel<Traits, kColumnMask, false, true>;
}

// (seqlen, head dim, heads, batch) view of one of q/k/v for its TMA descriptor.
template <typename Element>
auto gmem_view(const void* ptr, int seqlen, int head_dim, int heads, int batch, int64_t row_stride,
               int64_t head_stride, int64_t batch_stride) {
  return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)),
                     make_shape(seqlen, head_dim, heads, batch),
                     make_stride(row_stride, _1{}, head_stride, batch_stride));
}

// 176-key tiles for calls with no mask at all at head dim 128 (FwdTraits::
// kWideKeys; PADDLE_FLASHMASK_SM90_FWD_WIDE_KEYS=0: the 128-key kernel).
inline bool fwd_wide_keys() { return cuda::env_switch("PADDLE_FLASHMASK_SM90_FWD_WIDE_KEYS", true); }

// Whether a head dim 128 call takes the 176-key kernel: no mask at all, the
// default schedule, and its two key-block lists fit beside the tiles.
template <typename WideTraits>
bool fwd_takes_wide_keys(const FwdParams& p, bool pingpong, bool overlap) {
  const bool no_mask = p.mask.startend_row_indices == nullptr && !p.mask.causal && p.block_mask.data == nullptr;
  return no_mask && overlap && !pingpong && fwd_wide_keys() &&
         smem_bytes<WideTraits>((p.seqlen_k + WideTraits::kBlockN - 1) / WideTraits::kBlockN, 2) <= device_smem_optin();
}

template <typename Traits>
void launch_fwd_kernel(const FwdParams& p, FwdKernel<Traits> kernel, cudaStream_t stream) {
  using Element = typename Traits::Element;
  check_head_dims<Traits, /*kPaddedOk=*/Traits::kTmaStoreO>(p);
  FwdKernelParams<Traits> kp{};
  kp.p = p;
  auto mQ = gmem_view<Element>(p.q, p.seqlen_q, p.head_dim, p.num_heads, p.batch, p.q_row_stride,
                               p.q_head_stride, p.q_batch_stride);
  auto mK = gmem_view<Element>(p.k, p.seqlen_k, p.head_dim, p.num_heads_k, p.batch, p.k_row_stride,
                               p.k_head_stride, p.k_batch_stride);
  // The tensors' own head dims (narrower than the tiles' where padded: tile_head_dim).
  auto mV = gmem_view<Element>(p.v, p.seqlen_k, p.value_head_dim(), p.num_heads_k, p.batch, p.v_row_stride,
                               p.v_head_stride, p.v_batch_stride);
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Traits::SmemLayoutQ{}),
                           select<0, 2>(typename Traits::TileShape{}), _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Traits::SmemLayoutK{}),
                           select<1, 2>(typename Traits::TileShape{}), _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename Traits::SmemLayoutV{}),
                           make_shape(Int<Traits::kBlockN>{}, Int<Traits::kHeadDimV>{}), _1{});
  if constexpr (Traits::kTmaStoreO) {
    auto mO = make_tensor(make_gmem_ptr(static_cast<Element*>(p.out)),
                          make_shape(p.seqlen_q, p.value_head_dim(), p.num_heads, p.batch),
                          make_stride(p.o_row_stride, _1{}, p.o_head_stride, p.o_batch_stride));
    kp.tma_o = make_tma_copy(SM90_TMA_STORE{}, mO, typename Traits::SmemLayoutOPanel{},
                             Shape<Int<Traits::kOutRows>, Int<Traits::kPanelCols>>{}, _1{});
  }

  const int smem = smem_bytes<Traits>((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, 2);
  FLASHMASK_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Persistent: one CTA per SM; after the first wave the CTAs take tiles
  // from a counter in the caller's workspace, zeroed here on the stream.
  kp.tile_counter = cuda::tile_counters(p);
  kp.heads_together = fwd_gqa_tiles() ? p.num_heads / p.num_heads_k : 1;
  FLASHMASK_CUDA_CHECK(cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream));
  kp.tile_order = nullptr;
  if constexpr (!Traits::kWideKeys) {  // the wide-key kernel takes calls with no mask
    if (fwd_heavy_first<Traits>(p)) kp.tile_order = launch_fwd_tile_order<Traits>(p, kp.heads_together, stream);
  }
  const int64_t tiles = int64_t(fwd_query_blocks<Traits>(p)) * p.num_heads * p.batch;
  const dim3 grid(unsigned(std::min<int64_t>(tiles, sm_count())));
  kernel<<<grid, Traits::kNThreads, smem, stream>>>(kp);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

template <int kHeadDim, typename T>
void launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using Element = typename CutlassElement<T>::type;
  using Traits = FwdTraits<kHeadDim, Element>;
  const bool column_mask = p.mask.startend_row_indices != nullptr;
  const bool pingpong = fwd_pingpong(), overlap = fwd_overlap();
  if constexpr (kHeadDim == 128) {
    using WideTraits = FwdTraits<kHeadDim, Element, /*kWideKeys=*/true>;
    if (fwd_takes_wide_keys<WideTraits>(p, pingpong, overlap)) {
      return launch_fwd_kernel<WideTraits>(
          p, flashmask_fwd_sm90_kernel<WideTraits, /*kColumnMask=*/false, /*kPingPong=*/false, /*kOverlap=*/true>,
          stream);
    }
  }
  const bool one_visible = one_visible_interval(p.mask.num_cols, p.mask.causal);
  launch_fwd_kernel<Traits>(p,
                            column_mask ? fwd_kernel_for<Traits, true>(pingpong, overlap, one_visible)
                                        : fwd_kernel_for<Traits, false>(pingpong, overlap, one_visible),
                            stream);
}

// What bwd_finish_kernel converts (FinishWork), launched right after the main
// kernel, whose CTAs count into cuda::bwd_finish_counters (zeroed before it).
template <typename Traits>
void launch_finish(const BwdParams& p, cudaStream_t stream) {
  int32_t* const counters = cuda::bwd_finish_counters(p);
  const int64_t units = int64_t(p.batch) * p.num_heads_k;
  const int group = p.num_heads / p.num_heads_k;
  FinishWork w;
  w.done = counters;
  w.next_item = counters + units;
  w.dkv_written = cuda::dkv_written_flags(p);
  w.key_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  w.expected = w.key_blocks * group;
  w.m_blocks = int(cuda::bwd_padded_rows(p.seqlen_q) / Traits::kBlockM);
  const int64_t dq_items = units * group * w.m_blocks;
  const int64_t items = dq_items + (w.dkv_written != nullptr ? units * w.key_blocks : 0);
  // As many CTAs as fit at once (the last wave's SMs take them as they free up).
  static const int per_sm = [] {
    int n = 0;
    FLASHMASK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, bwd_finish_kernel<Traits>,
                                                                       Traits::kNumMmaThreads, 0));
    return std::max(1, n);
  }();
  const int64_t grid = std::min<int64_t>(items, int64_t(sm_count()) * per_sm);
  if (items + grid >= (int64_t(1) << 31)) {  // every CTA takes one item past the last
    throw std::invalid_argument("flashmask sm90 backward: too many dQ tiles for the finish's int32 items");
  }
  w.dq_items = int(dq_items);
  w.items = int(items);
  cudaLaunchAttribute dependent[1];
  dependent[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(grid));
  config.blockDim = dim3(Traits::kNumMmaThreads);
  config.stream = stream;
  config.attrs = dependent;
  config.numAttrs = bwd_finish_overlap() ? 1 : 0;
  FLASHMASK_CUDA_CHECK(cudaLaunchKernelEx(&config, bwd_finish_kernel<Traits>, p, w));
}

template <int kHeadDim, typename T>
void launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using Element = typename CutlassElement<T>::type;
  using Traits = BwdTraits<kHeadDim, Element>;
  constexpr int kHeadDimV = Traits::kHeadDimV;
  check_head_dims<Traits, /*kPaddedOk=*/true>(p);
  BwdKernelParams<Traits> kp{};
  kp.p = p;
  kp.dkv_written = cuda::dkv_written_flags(p);
  int32_t* const fitted_heads = cuda::fitted_head_counts(p);  // the count pass writes, the kernel reads
  kp.fitted_heads = fitted_heads;
  // Counts for the finish kernel (launch_finish), zeroed before any CTA adds.
  kp.finish_done = p.dq_accum_tiled ? cuda::bwd_finish_counters(p) : nullptr;
  if (kp.finish_done != nullptr) {
    FLASHMASK_CUDA_CHECK(
        cudaMemsetAsync(kp.finish_done, 0, cuda::finish_counter_elems(p) * sizeof(int32_t), stream));
  }
#ifdef FLASHMASK_EXP_TIMELINE
  kp.timeline = cuda::g_exp_timeline;
#endif
  auto mQ = gmem_view<Element>(p.q, p.seqlen_q, p.head_dim, p.num_heads, p.batch, p.q_row_stride,
                               p.q_head_stride, p.q_batch_stride);
  auto mdO = gmem_view<Element>(p.dout, p.seqlen_q, p.value_head_dim(), p.num_heads, p.batch, p.do_row_stride,
                                p.do_head_stride, p.do_batch_stride);
  auto mK = gmem_view<Element>(p.k, p.seqlen_k, p.head_dim, p.num_heads_k, p.batch, p.k_row_stride,
                               p.k_head_stride, p.k_batch_stride);
  auto mV = gmem_view<Element>(p.v, p.seqlen_k, p.value_head_dim(), p.num_heads_k, p.batch, p.v_row_stride,
                               p.v_head_stride, p.v_batch_stride);
  const auto tile_q = make_shape(Int<Traits::kBlockM>{}, Int<kHeadDim>{});
  const auto tile_do = make_shape(Int<Traits::kBlockM>{}, Int<kHeadDimV>{});
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Traits::SmemLayoutQ{}), tile_q, _1{});
  kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, mdO, take<0, 2>(typename Traits::SmemLayoutdO{}), tile_do, _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mK, typename Traits::SmemLayoutK{},
                           make_shape(Int<Traits::kBlockN>{}, Int<kHeadDim>{}), _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mV, typename Traits::SmemLayoutV{},
                           make_shape(Int<Traits::kBlockN>{}, Int<kHeadDimV>{}), _1{});

  auto kernel = one_visible_interval(p.mask.num_cols, p.mask.causal) && p.mask.startend_row_indices != nullptr
                    ? flashmask_bwd_sm90_kernel<Traits, true>
                    : flashmask_bwd_sm90_kernel<Traits, false>;
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
  if (cuda::dkv_block(kHeadDim) != Traits::kBlockN) {
    throw std::logic_error("flashmask sm90 backward: the dK/dV flags' key block is not the kernel's");
  }
  if (Traits::kSplitHeadDim && p.deterministic) {
    throw std::invalid_argument("flashmask sm90 backward: head dims 192 and 256 have no deterministic mode");
  }
  if (p.row_stats == nullptr) {
    throw std::invalid_argument(
        "flashmask sm90 backward: row_stats is null (allocate bwd_row_stats_elems floats after plan_bwd_cuda)");
  }
  // Fitted grouping: a CTA per head, sub-groups counted first (the count
  // pass), so that only their leaders' CTAs stay.
  const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN,
                  p.fitted_head_groups() ? p.num_heads : p.num_heads / p.bwd_head_group, p.batch);
  if (p.fitted_head_groups()) {
    if (fitted_heads == nullptr) {
      throw std::logic_error("flashmask sm90 backward: fitted grouping without its head counts");
    }
    // sorted: classes within each group (short calls); chains: the longest
    // key blocks first at any length (bwd_cta_order.cuh)
    const bool sorted = bwd_cta_ordered(p), chains = bwd_chains_first(p);
    int32_t* const live_blocks = sorted || chains ? cuda::bwd_live_block_counts(p) : nullptr;
    constexpr int kCountThreads = 128;
    bwd_fitted_heads_kernel<Traits::kBlockM, Traits::kBlockN, kCountThreads>
        <<<dim3(grid.x, p.num_heads / p.bwd_head_group, p.batch), kCountThreads, 0, stream>>>(
            p, fitted_heads, live_blocks);
    FLASHMASK_CUDA_CHECK(cudaGetLastError());
    if (sorted || chains) {
      constexpr int kOrderThreads = 256;
      int32_t* const order = cuda::bwd_cta_order(p);
      kp.cta_order = order;
      bwd_cta_order_kernel<kOrderThreads>
          <<<dim3(p.num_heads / p.bwd_head_group, p.batch), kOrderThreads, 0, stream>>>(
              p, fitted_heads, live_blocks, int(grid.x), bwd_cta_order_cap(p), bwd_cta_order_classes(), chains,
              sorted, sm_count(), bwd_chain_min_steps(), order);
      FLASHMASK_CUDA_CHECK(cudaGetLastError());
    }
  }
  kernel<<<grid, Traits::kNThreads, smem, stream>>>(kp);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
  if (p.dq_accum_tiled) launch_finish<Traits>(p, stream);  // else dQ is the deterministic pass's (bwd_finish)
}

}  // namespace sm90
}  // namespace flashmask
