// FlashMask backward for Hopper (sm90a), FA3 style.
//
// One CTA per (key block of 128, or 64 past head dim 128, group of query
// heads, batch); the group is
// `bwd_head_group` consecutive heads of one GQA group, which share K/V and the
// mask, so the CTA loads K/V, lists the live query blocks and writes dK/dV
// once for all of them. With fitted grouping (bwd_group_max_steps) the group
// shrinks where the key block has much work, down to one head per CTA. Three
// warpgroups:
//   warpgroup 0 (producer): TMA loads K and V once, then, head by head, Q and
//     dO tiles of 64 query rows, with those rows' LSE and delta
//     (BwdParams::row_stats), into a 2-stage mbarrier pipeline, for the live
//     query blocks only;
//   warpgroups 1-2 (consumers): 64 keys each. Per query block:
//     S^T = K Q^T and dP^T = V dO^T (wgmma, shared-memory operands),
//     P^T = exp(S^T - LSE), dS^T = P^T (dP^T - delta) in registers,
//     dS^T to shared memory, dV += P^T dO (wgmma, P^T from registers),
//     dQ = dS K (head dim split over the two warpgroups), dK += dS^T Q (dS^T
//     from registers); dQ goes through shared memory to the dQ writer warp
//     of warpgroup 0, which adds it to its tile of the fp32 dq_accum with
//     bulk reduce-adds, while the dK GEMM runs.
//   Head dims 192/128 and 256 (BwdTraits::kSplitHeadDim): the two warpgroups
//     share 64 keys and split the head dims of dK/dV/dQ instead; S = Q K^T
//     and dP = dO V^T are split over the keys, P and dS pass through shared
//     memory, and dQ goes to the dQ writer warp as above at 192/128 and to
//     dq_accum with vector atomics from the consumers at 256 (no room for its
//     staging buffer; BwdTraits::kStageDQ).
//     (192/128: q and k have 192 columns, v and dO 128; dK, dQ 192, dV 128.)
// dK/dV stay in registers for the whole CTA (summed over its heads) and go to
// the slot of the plan (BwdParams::accum_heads_k): stored where the CTA is
// the slot's one writer, added with atomics where the GQA group spans several
// CTAs (a heavy key block under fitted grouping, or uniform groups smaller
// than the GQA group). In deterministic mode the dQ step is skipped (a
// query-major kernel computes dQ) and the plan always gives one writer per
// slot.
// FlashMask: the whole CTA lists the live query blocks of this key block from
// the block min/max before the role split (sm90_block_list.cuh); fully masked
// blocks, including middle bands, are never loaded.
#pragma once

#include <math_constants.h>

#include <cutlass/arch/reg_reconfig.h>

#include "../../flashmask_params.h"
#include "../../mask_bounds.h"
#include "../fast_exp2.cuh"
#include "../kernel_traits.h"
#include "../exp_timeline.h"
#include "../workspace.h"
#include "bwd_cta_order.cuh"
#include "sm90_block_list.cuh"
#include "sm90_kernel_traits.h"
#include "sm90_utils.cuh"

namespace flashmask {
namespace sm90 {

template <typename Traits>
struct BwdKernelParams {
  typename Traits::TmaQ tma_q;
  typename Traits::TmadO tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  BwdParams p;
  // cuda::dkv_written_flags(p): non-null under fitted grouping, where a CTA
  // covering its whole GQA group writes dK/dV straight to dk/dv.
  int32_t* dkv_written;
  // cuda::fitted_head_counts(p): under fitted grouping, each key block's
  // heads per CTA, from bwd_fitted_heads_kernel.
  const int32_t* fitted_heads;
  // cuda::bwd_cta_order(p) as bwd_cta_order_kernel wrote it (heaviest
  // first): the grid slot a CTA takes, by its linear block index. Null: the
  // grid's own order.
  const int32_t* cta_order;
  // cuda::bwd_finish_counters(p): where dQ goes through the writer warp
  // (BwdTraits::kStageDQ), each CTA's writer adds the CTA's query heads to its
  // (batch, kv head)'s count once its last dQ adds are done, which
  // bwd_finish_kernel waits for. Null in deterministic mode (no finish kernel).
  int32_t* finish_done;
#ifdef FLASHMASK_EXP_TIMELINE
  unsigned long long* timeline;  // cuda::g_exp_timeline at the launch
#endif
};

// Named barriers (id 0 is __syncthreads): the consumers' dS hand-over, and
// per consumer warpgroup the dQ half-tile hand-over with the dQ writer warp
// (kdQFull + wg: stored, kdQEmpty + wg: read out). Split head dim
// (BwdTraits::kSplitHeadDim): kdS also hands P over, and kPdSFree says that
// both warpgroups' GEMMs of the last step have read P and dS.
enum BwdBarrier : int { kdS = 1, kdQFull = 2, kdQEmpty = 2 + 2, kPdSFree = 6 };
static_assert(kdQEmpty >= kdQFull + 2, "one full barrier per consumer warpgroup");
// Threads at a dQ hand-over: one consumer warpgroup and the writer warp.
constexpr int kdQHandOverThreads = 128 + 32;

// Named barrier kId over kThreads threads: wait for all (sync) or only signal
// (arrive). Immediate ids: a barrier id held in a register pushed the
// consumers (at 240 registers) into spilling.
template <int kId, int kThreads, bool kArrive = false>
__device__ __forceinline__ void named_barrier() {
  if constexpr (kArrive) {
    asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
  }
}

// The dQ hand-over barrier `kId` of warpgroup 0, or kId + 1 of warpgroup 1.
template <int kId, bool kArrive = false>
__device__ __forceinline__ void dq_hand_over(bool second) {
  if (second) {
    named_barrier<kId + 1, kdQHandOverThreads, kArrive>();
  } else {
    named_barrier<kId, kdQHandOverThreads, kArrive>();
  }
}

// Waits until at most kPending of this thread's bulk async groups still read
// shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Adds `bytes` of fp32 from shared to global memory (an async bulk reduce,
// done by the copy engine: no atomics issued by the threads).
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, int bytes) {
  const uint32_t saddr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(saddr), "r"(bytes)
               : "memory");
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from
// global to shared memory with the copy engine, completing on `bar`'s
// transaction count like a TMA tile load.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, int bytes, uint64_t* bar) {
  const uint32_t saddr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t baddr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(saddr),
      "l"(gmem), "r"(bytes), "r"(baddr)
      : "memory");
}

// Adds a thread's dQ accumulators (split head dim: its warpgroup's half of the
// step's tile) to the tile of dq_accum in accumulator order, the order
// dq_tiles_to_dq_kernel reads back: float4 k of thread t at k x 128 + t.
template <typename Accum>
__device__ __forceinline__ void add_dq_half(float* half, const Accum& dq, int wg_tid) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // float4 atomics are sm90+
  static_assert(decltype(size(dq))::value % 4 == 0, "whole float4s");
  float4* dst = reinterpret_cast<float4*>(half);
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < size(dq) / 4; ++k) {
    atomicAdd(dst + k * 128 + wg_tid, make_float4(dq(4 * k), dq(4 * k + 1), dq(4 * k + 2), dq(4 * k + 3)));
  }
#endif
}

// Adds (or stores, when this CTA is the element's only writer) a pair of
// adjacent fp32 values.
__device__ __forceinline__ void accumulate_pair(float* dst, float a, float b, bool sole_writer) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // float2 atomics are sm90+
  if (sole_writer) {
    *reinterpret_cast<float2*>(dst) = make_float2(a, b);
  } else {
    atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
  }
#endif
}

// Stores a pair of adjacent gradient values in the output dtype.
template <typename Element>
__device__ __forceinline__ void store_pair(Element* dst, float a, float b) {
  const uint32_t bits = uint32_t(Element(a).raw()) | (uint32_t(Element(b).raw()) << 16);
  *reinterpret_cast<uint32_t*>(dst) = bits;
}

// The columns of a gradient whose tiles have kCols: the call's head dim where a
// narrower one runs on these tiles (cuda::takes_padded_head_dims: 80 on 96's),
// else kCols itself, a constant, so that the other instantiations' stores keep
// no column test.
template <int kCols>
__device__ __forceinline__ int padded_cols(int head_dim, Int<kCols>) {
  if constexpr (cuda::takes_padded_head_dims<kCols>()) {
    return head_dim;
  } else {
    return kCols;
  }
}

// The tiles of (batch, head) in the tiled dq_accum (BwdParams::dq_accum_tiled):
// ceil(seqlen_q / kBlockM) consecutive tiles of kTileFloats floats.
template <int kTileFloats, int kBlockM>
__device__ __forceinline__ float* dq_head_tiles(const BwdParams& p, int batch, int head) {
  const int64_t m_blocks = cuda::bwd_padded_rows(p.seqlen_q) / kBlockM;
  return p.dq_accum + (int64_t(batch) * p.num_heads + head) * m_blocks * kTileFloats;
}

// Fitted grouping (BwdParams::bwd_group_max_steps): heads per CTA for a key
// block with `num_live` live query blocks, the largest divisor of head_group
// whose steps fit in max_steps (every CTA of the key block computes the same).
__device__ __forceinline__ int fitted_head_count(int head_group, int num_live, int max_steps) {
  for (int d = head_group; d > 1; --d) {
    if (head_group % d == 0 && d * num_live <= max_steps) return d;
  }
  return 1;
}

// Fitted grouping's count pass, one CTA per (key block, group of
// bwd_head_group heads, batch): the heads per CTA of the key block
// (fitted_head_count of its live query blocks, classified as
// build_live_query_blocks does; the group's heads share their masks) into
// counts[batch][group][key block]. The backward reads it first, so its CTAs
// that do not lead a sub-group leave at once (v13c: each built the whole
// list first, 15% of the backward's stall samples on 128-512-token documents).
// The live query blocks themselves go to `live` (alike indexed) where the
// CTAs are ordered by their work (bwd_cta_order_kernel); else it is null.
// It also zeroes the key block's dK/dV slot rows (head_dim / value head dim
// floats a row: the tensors', not the tiles', where 80 runs on 96's)
// where the backward's CTAs will add into them: not where one CTA covers the
// whole GQA group and stores dK/dV straight to dk/dv (write_dkv), so that
// masks of short live lists (most key blocks grouped whole) skip most of
// the accumulators' zeroing, which bwd_prepare leaves to this pass.
template <int kBlockM, int kBlockN, int kThreads>
__global__ void __launch_bounds__(kThreads)
    bwd_fitted_heads_kernel(BwdParams p, int32_t* counts, int32_t* live_blocks) {
  const int n_block = blockIdx.x, group = blockIdx.y, batch = blockIdx.z;
  const int head = group * p.bwd_head_group;
  const int2 range = query_block_range<kBlockM, kBlockN>(p, n_block);
  const BlockBounds* summary = summary_row(p, batch, head);
  int live = 0;
  for (int m = range.x + int(threadIdx.x); m < range.y; m += kThreads) {
    live += classify_block<kBlockM, kBlockN>(p, summary, batch, head, m, n_block) != TileKind::kSkip;
  }
  for (int offset = 16; offset > 0; offset /= 2) live += __shfl_xor_sync(0xffffffffu, live, offset);
  __shared__ int warp_live[kThreads / 32];
  __shared__ int heads_per_cta;
  if (threadIdx.x % 32 == 0) warp_live[threadIdx.x / 32] = live;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_live[w];
    const int64_t at = (int64_t(batch) * gridDim.y + group) * gridDim.x + n_block;
    heads_per_cta = fitted_head_count(p.bwd_head_group, total, p.bwd_group_max_steps);
    counts[at] = heads_per_cta;
    if (live_blocks != nullptr) live_blocks[at] = total;
  }
  __syncthreads();
  // write_dkv's sole writer: the key block's CTA covers the kv head's whole group.
  if (int64_t(p.accum_heads_k) * heads_per_cta == p.num_heads) return;
  const int head_k = head / (p.num_heads / p.num_heads_k);
  const int rows = min(kBlockN, p.seqlen_k - n_block * kBlockN);
  const int64_t first_row = int64_t(batch) * p.seqlen_k + int64_t(n_block) * kBlockN;
  auto zero_rows = [&](float* accum, int dim) {  // whole float4s: head dims are multiples of 16
    const int vectors = dim / 4;
    for (int i = threadIdx.x; i < rows * vectors; i += kThreads) {
      const int r = i / vectors, c = i % vectors * 4;
      *reinterpret_cast<float4*>(accum + ((first_row + r) * p.accum_heads_k + head_k) * dim + c) =
          make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  zero_rows(p.dk_accum, p.head_dim);
  zero_rows(p.dv_accum, p.value_head_dim());
}

// kOneVisible: the column mask leaves each key one visible interval of
// query rows (one_visible_interval), staged and tested as VisibleRows.
template <typename Traits, bool kOneVisible>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flashmask_bwd_sm90_kernel(CUTE_GRID_CONSTANT BwdKernelParams<Traits> const kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using SharedStorage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kDim = Traits::kHeadDim;    // q, k, dQ, dK
  constexpr int kDimV = Traits::kHeadDimV;  // v, dO, dV
  static_assert(cuda::kBwdRowBlock == kBlockM, "padded rows: whole steps and dQ tiles");
  // One dK/dV flag per key block (cuda::dkv_block, which launch_bwd checks).

  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
  uint16_t* live_list = reinterpret_cast<uint16_t*>(smem_raw + sizeof(SharedStorage));
  using KeyRows = std::conditional_t<kOneVisible, VisibleRows, MaskedRows>;
  static_assert(sizeof(KeyRows) <= sizeof(MaskedRows));
  KeyRows* const key_rows_of = reinterpret_cast<KeyRows*>(ss.key_rows);

  // The finish kernel (launched as this grid's programmatic dependent) may
  // start once every CTA of this grid has started: it then only takes SMs
  // these CTAs leave, and waits for their counts, never for a CTA that has
  // no SM yet.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const BwdParams& p = kp.p;
  const bool fitted = p.fitted_head_groups();
  // The (key block, head, batch) this CTA takes: the order's slot (fitted
  // grouping, bwd_cta_order.cuh), or its grid row's head (fitted: its
  // sub-group is known once the list is built).
  int n_block = blockIdx.x, batch = blockIdx.z, first_head;
  if (kp.cta_order != nullptr) {
    const int slot = kp.cta_order[(int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x];
    n_block = slot % gridDim.x;
    first_head = slot / gridDim.x % p.num_heads;
    batch = slot / gridDim.x / p.num_heads;
  } else {
    first_head = fitted ? fitted_head_of(blockIdx.y, p.num_heads, p.bwd_head_group) : blockIdx.y * p.bwd_head_group;
  }
  const int head_k = first_head / (p.num_heads / p.num_heads_k);
  // Fitted: the key block's heads per CTA, counted ahead; a CTA that does not
  // lead its sub-group leaves before any work (uniform exit).
  const int fitted_heads =
      fitted ? kp.fitted_heads[(int64_t(batch) * (p.num_heads / p.bwd_head_group) + first_head / p.bwd_head_group) *
                                   gridDim.x + n_block]
             : 0;
  if (fitted && first_head % fitted_heads != 0) return;
#ifdef FLASHMASK_EXP_TIMELINE
  cuda::ExpTimeline tl;  // the first consumer thread's view
  tl.start();
#endif
  const int warp = cutlass::canonical_warp_idx_sync();
  const int warp_group = cutlass::canonical_warp_group_idx();
  const int lane_predicate = cute::elect_one_sync();

  if (warp == 0 && lane_predicate) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    ss.barrier_kv.init(1);
    cutlass::arch::fence_barrier_init();
  }
  typename Pipeline::Params pipe_params;
  // Q and dO share a stage, with the rows' LSE and delta.
  pipe_params.transaction_bytes = Traits::kTmaBytesQdO + 2 * Traits::kRowStatsBytes;
  pipe_params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer
                                     : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = threadIdx.x % 128 == 0;
  pipe_params.num_consumers = Traits::kNumMmaThreads;
  Pipeline pipeline(ss.pipeline_qdo, pipe_params, Shape<_1, _1, _1>{});
  __syncthreads();  // barriers initialised
  // The heads of the group share the mask head, hence the list.
  const int num_live = build_live_query_blocks<Traits::kNThreads, kBlockM, kBlockN>(
      p, batch, first_head, n_block, live_list, ss.warp_counts);
  // The masked query rows of each key (one mask head for the CTA's heads),
  // with the causal diagonal and keys past the end folded in: partial steps
  // read them from shared memory (MaskedRows: two unsigned compares per
  // element; held in registers they pushed the consumers into spilling).
  if (threadIdx.x < kBlockN) {
    const int key = n_block * kBlockN + threadIdx.x;
    const int32_t* columns = mask_columns(p, batch, first_head);
    ColumnBounds bounds{0, 0, 0, 0};
    if (columns != nullptr && key < p.seqlen_k) {
      bounds = load_column_bounds(columns + int64_t(key) * p.mask.col_stride, p.mask.num_cols,
                                  p.mask.causal, p.seqlen_q);
    }
    const int causal_offset = p.seqlen_k - p.seqlen_q;
    if constexpr (kOneVisible) {
      key_rows_of[threadIdx.x] = visible_rows(bounds, key, p.mask.causal, causal_offset, p.seqlen_k);
    } else {
      key_rows_of[threadIdx.x] = masked_rows(bounds, key, p.mask.causal, causal_offset, p.seqlen_k);
    }
  }
  // Heads of this CTA (fitted: its sub-group, as counted).
  if (threadIdx.x == 0) {
    ss.num_live_blocks = num_live;
    ss.cta_heads = fitted ? fitted_heads : p.bwd_head_group;
  }
  __syncthreads();

  Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutKt{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdO{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Traits::SmemLayoutdOt{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutdSt{});

  if (warp_group == 0) {
    // ---------------- producer ----------------
    cutlass::arch::warpgroup_reg_dealloc<Traits::kLoadRegisters>();
    if (warp == 1 && !p.deterministic && Traits::kStageDQ) {
      // dQ writer: each step's two half tiles, once their warpgroups stored
      // them, are added to the step's tile of dq_accum (same float order) with
      // one bulk reduce each; a half's buffer is handed back as soon as the
      // copy engine has read it.
      static_assert(Traits::kNumMmaWarpGroups == 2, "two dQ halves");
      constexpr int kHalf = Traits::kDQHalfFloats;
      const int lane = threadIdx.x % 32;
      const int steps = ss.cta_heads * num_live;
      // The CTA's first head's tiles; the warp runs on 24 registers, hence
      // the 32-bit tile index within the heads that follow.
      const int m_blocks = int(cuda::bwd_padded_rows(p.seqlen_q) / kBlockM);
      float* const head_tiles = dq_head_tiles<kBlockM * kDim, kBlockM>(p, batch, first_head);
      for (int step = 0; step < steps; ++step) {
        const int tile_index = step / num_live * m_blocks + live_block_index(live_list[step % num_live]);
        float* tile = head_tiles + int64_t(tile_index) * (kBlockM * kDim);
        for (int wg = 0; wg < 2; ++wg) {
          dq_hand_over<kdQFull>(wg == 1);
          if (lane == 0) {
            bulk_reduce_add_f32(tile + wg * kHalf, ss.smem_dq.data() + wg * kHalf, kHalf * 4);
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
          }
        }
        const bool more = step + 1 < steps;
        if (lane == 0) bulk_wait_read<1>();  // the first half read out
        __syncwarp();
        if (more) dq_hand_over<kdQEmpty, /*kArrive=*/true>(false);
        if (lane == 0) bulk_wait_read<0>();
        __syncwarp();
        if (more) dq_hand_over<kdQEmpty, /*kArrive=*/true>(true);
      }
      if (lane == 0) {
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the adds are done
        if (kp.finish_done != nullptr) {  // count this CTA's heads done (release)
          asm volatile("fence.proxy.async.global;\n" ::: "memory");
          asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(
                           kp.finish_done + int64_t(batch) * p.num_heads_k + head_k),
                       "r"(ss.cta_heads)
                       : "memory");
        }
      }
      return;
    }
    if (warp != 0 || num_live == 0) return;
    const auto shape_q = make_shape(p.seqlen_q, p.head_dim, p.num_heads, p.batch);
    const auto shape_k = make_shape(p.seqlen_k, p.head_dim, p.num_heads_k, p.batch);
    const auto shape_do = make_shape(p.seqlen_q, p.value_head_dim(), p.num_heads, p.batch);
    const auto shape_v = make_shape(p.seqlen_k, p.value_head_dim(), p.num_heads_k, p.batch);
    const auto tile_q = make_shape(Int<kBlockM>{}, Int<kDim>{});
    const auto tile_do = make_shape(Int<kBlockM>{}, Int<kDimV>{});
    Tensor gK = local_tile(kp.tma_k.get_tma_tensor(shape_k)(_, _, head_k, batch),
                           make_shape(Int<kBlockN>{}, Int<kDim>{}), make_coord(n_block, _0{}));
    Tensor gV = local_tile(kp.tma_v.get_tma_tensor(shape_v)(_, _, head_k, batch),
                           make_shape(Int<kBlockN>{}, Int<kDimV>{}), make_coord(n_block, _0{}));
    auto [tKgK, tKsK] = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                      group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(gV));
    if (lane_predicate) {
      ss.barrier_kv.arrive_and_expect_tx(Traits::kTmaBytesKV);
      auto& bar = reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType&>(ss.barrier_kv);
      copy(kp.tma_k.with(bar, 0), tKgK, tKsK);
      copy(kp.tma_v.with(bar, 0), tVgV, tVsV);
    }
    PipelineState write = cutlass::make_producer_start_state<Pipeline>();
    const int64_t stats_padded = cuda::bwd_padded_rows(p.seqlen_q);
    const int64_t stats_plane = int64_t(p.batch) * p.num_heads * stats_padded;
    for (int head = first_head; head < first_head + ss.cta_heads; ++head) {
      Tensor gQ = local_tile(kp.tma_q.get_tma_tensor(shape_q)(_, _, head, batch), tile_q,
                             make_coord(_, _0{}));
      Tensor gdO = local_tile(kp.tma_do.get_tma_tensor(shape_do)(_, _, head, batch), tile_do,
                              make_coord(_, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));
      auto [tdOgdO, tdOsdO] = tma_partition(kp.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO),
                                            group_modes<0, 2>(gdO));
      const float* stats = p.row_stats + (int64_t(batch) * p.num_heads + head) * stats_padded;
      for (int i = 0; i < num_live; ++i) {
        const int m = live_block_index(live_list[i]);
        pipeline.producer_acquire(write);
        if (lane_predicate) {
          uint64_t* bar = pipeline.producer_get_barrier(write);
          copy(kp.tma_q.with(*bar, 0), tQgQ(_, m), tQsQ(_, write.index()));
          copy(kp.tma_do.with(*bar, 0), tdOgdO(_, m), tdOsdO(_, write.index()));
          const float* rows = stats + int64_t(m) * kBlockM;
          bulk_copy_g2s(ss.smem_lse.data() + write.index() * kBlockM, rows, Traits::kRowStatsBytes, bar);
          bulk_copy_g2s(ss.smem_delta.data() + write.index() * kBlockM, rows + stats_plane,
                        Traits::kRowStatsBytes, bar);
        }
        ++write;
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
  const int mma_tid = threadIdx.x - 128;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadK mma_dk;
  typename Traits::TiledMmadV mma_dv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(mma_tid);
  auto thr_dk = mma_dk.get_thread_slice(mma_tid);
  auto thr_dv = mma_dv.get_thread_slice(mma_tid);
  auto thr_dq = mma_dq.get_thread_slice(mma_tid);

  // One of dK (kCols = D) and dV (Dv) of the CTA's keys from this thread's
  // accumulators `acc` of its GEMM (`thr`: either layout, the coordinates come
  // from the partition): `direct`, to the gradient in the output dtype
  // (scaled by `scale`); else added to (stored, for the slot's sole writer)
  // the plan's fp32 slot, unscaled. `head_dim`: the gradient's (and slot
  // rows') columns, kCols but where a head dim runs on wider tiles (80 on
  // 96's: padded_cols), whose columns past it (zero: Q, K, V, dO were loaded
  // zero-filled) stay out.
  auto write_grad = [&](auto const& acc, auto const& thr, auto cols, int head_dim, void* grad, int64_t row_stride,
                        int64_t head_stride, int64_t batch_stride, float* accum, float scale, bool direct,
                        int slot, bool sole_writer) FLASHMASK_INLINE {
    constexpr int kCols = decltype(cols)::value;
    const int dim = padded_cols(head_dim, cols);
    const int c0 = n_block * kBlockN;
    Tensor coords = thr.partition_C(make_identity_tensor(make_shape(Int<kBlockN>{}, Int<kCols>{})));
    Tensor c_rc = make_tensor(coords.data(), acc_as_rows_cols(coords.layout()));
    Tensor a_rc = make_tensor(acc.data(), acc_as_rows_cols(acc.layout()));
    const int col0 = get<1>(c_rc(0, 0));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(a_rc); ++r) {
      const int key = c0 + get<0>(c_rc(r, 0));
      if (key >= p.seqlen_k) continue;
      if (direct) {
        Element* dst = static_cast<Element*>(grad) + batch * batch_stride + key * row_stride +
                       head_k * head_stride + col0;
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(a_rc); c += 2) {
          if (col0 + acc_col_offset(c) >= dim) continue;  // pairs start at even columns, dim is even
          store_pair(dst + acc_col_offset(c), a_rc(r, c) * scale, a_rc(r, c + 1) * scale);
        }
      } else {
        float* dst = accum + ((int64_t(batch) * p.seqlen_k + key) * p.accum_heads_k + slot) * dim + col0;
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(a_rc); c += 2) {
          if (col0 + acc_col_offset(c) >= dim) continue;
          accumulate_pair(dst + acc_col_offset(c), a_rc(r, c), a_rc(r, c + 1), sole_writer);
        }
      }
    }
  };
  // dK and dV of the CTA's keys. Without GQA (BwdParams::dkv_direct), and
  // under fitted grouping with one CTA for the whole GQA group: dK (scaled
  // here) and dV go straight to dk/dv in the output dtype (no fp32 round trip
  // through the accumulators); fitted, the key block's flag tells bwd_finish
  // to leave it, and every CTA of the key block computes the same flag. Else
  // to the plan's fp32 slots (bwd_finish scales dK).
  auto write_dkv = [&](auto const& tdKrdK, auto const& tdVrdV) FLASHMASK_INLINE {
    const bool sole_writer = int64_t(p.accum_heads_k) * ss.cta_heads == p.num_heads;
    const bool direct = sole_writer && (p.dkv_direct || kp.dkv_written != nullptr);
    if (kp.dkv_written != nullptr && mma_tid == 0) {
      const int key_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
      kp.dkv_written[(int64_t(batch) * p.num_heads_k + head_k) * key_blocks + n_block] = direct;
    }
    const int slot = first_head / (p.num_heads / p.accum_heads_k);
    write_grad(tdKrdK, thr_dk, Int<kDim>{}, p.head_dim, p.dk, p.dk_row_stride, p.dk_head_stride,
               p.dk_batch_stride, p.dk_accum, p.softmax_scale, direct, slot, sole_writer);
    write_grad(tdVrdV, thr_dv, Int<kDimV>{}, p.value_head_dim(), p.dv, p.dv_row_stride, p.dv_head_stride,
               p.dv_batch_stride, p.dv_accum, 1.f, direct, slot, sole_writer);
  };

  // This warpgroup's half of a step's dQ to shared memory in accumulator
  // order, 16 bytes per thread and store (the writer warp drained the
  // previous step's half before signalling kdQEmpty), handed to the writer
  // warp, which adds it to dq_accum in that order (BwdTraits::kStageDQ).
  auto stage_dq_half = [&](auto const& tdQrdQ, int step) FLASHMASK_INLINE {
    static_assert(decltype(size(tdQrdQ))::value % 4 == 0, "whole float4s");
    const bool second_wg = mma_tid >= 128;
    float4* dq_half = reinterpret_cast<float4*>(ss.smem_dq.data() + (second_wg ? Traits::kDQHalfFloats : 0));
    if (step > 0) dq_hand_over<kdQEmpty>(second_wg);
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < size(tdQrdQ) / 4; ++k) {
      dq_half[k * 128 + mma_tid % 128] =
          make_float4(tdQrdQ(4 * k), tdQrdQ(4 * k + 1), tdQrdQ(4 * k + 2), tdQrdQ(4 * k + 3));
    }
    cutlass::arch::fence_view_async_shared();  // the copy engine reads it next
    dq_hand_over<kdQFull, /*kArrive=*/true>(second_wg);
  };

  // The same in both layouts: dV/dK's dO and Q, dQ's operands, dK/dV's
  // accumulators (for the whole CTA).
  Tensor tdVrdO = thr_dv.partition_fragment_B(sdOt);  // (MMA, N, K, stage)
  Tensor tdKrQ = thr_dk.partition_fragment_B(sQt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);    // (MMA, M, K, dS buffer)
  Tensor tdQrK = thr_dq.partition_fragment_B(sKt);
  Tensor tdVrdV = partition_fragment_C(mma_dv, make_shape(Int<kBlockN>{}, Int<kDimV>{}));
  Tensor tdKrdK = partition_fragment_C(mma_dk, make_shape(Int<kBlockN>{}, Int<kDim>{}));
  clear(tdVrdV);
  clear(tdKrdK);

  if constexpr (Traits::kSplitHeadDim) {
    // S = Q K^T and dP = dO V^T, (queries, keys): this warpgroup's 32 keys.
    Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);     // (MMA, M, K, stage)
    Tensor tSrK = thr_sdp.partition_fragment_B(sK);
    Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO);  // (MMA, M, K, stage)
    Tensor tdPrV = thr_sdp.partition_fragment_B(sV);
    // P and dS of the step, (queries, keys) as the accumulators write them and
    // (keys, queries) as dV/dK read them (the same bytes).
    Tensor sP = make_tensor(make_smem_ptr(ss.smem_p.data()), typename Traits::SmemLayoutdS{});
    Tensor sPt = make_tensor(make_smem_ptr(ss.smem_p.data()), typename Traits::SmemLayoutPdSt{});
    Tensor sdStK = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Traits::SmemLayoutPdSt{});
    // P and dS leave the accumulators by stmatrix, transposed: the
    // accumulators hold key pairs, shared memory is query-contiguous.
    // (Element-wise copies through the swizzled tensor compiled to generic
    // 16-bit ST.E with 64-bit address math, one per element.)
    auto copy_pds = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_sdp);
    auto thr_copy_pds = copy_pds.get_thread_slice(mma_tid);
    Tensor tPsP = thr_copy_pds.partition_D(sP);     // (CPY, CPY_M, CPY_N, 1)
    Tensor tdSsdS = thr_copy_pds.partition_D(sdS);  // (CPY, CPY_M, CPY_N, 1)
    Tensor tdVrPt = thr_dv.partition_fragment_A(sPt);
    Tensor tdKrdSt = thr_dk.partition_fragment_A(sdStK);
    // (query, key) of every S element within the tile.
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(make_shape(Int<kBlockM>{}, Int<kBlockN>{})));
    Tensor tScS_rc = make_tensor(tScS.data(), acc_as_rows_cols(tScS.layout()));
    constexpr int kRows = decltype(size<0>(tScS_rc))::value;  // this thread's queries (2)
    constexpr int kCols = decltype(size<1>(tScS_rc))::value;
    const int wg_tid = mma_tid % 128;
    const bool second_wg = mma_tid >= 128;
    const float scale_log2 = p.softmax_scale * 1.4426950408889634f;

    if (num_live > 0) ss.barrier_kv.wait(0);
#ifdef FLASHMASK_EXP_TIMELINE
    tl.first_step = clock64();
#endif
    PipelineState read;
    int step = 0;
    for (int head = first_head; head < first_head + ss.cta_heads; ++head) {
      [[maybe_unused]] float* const head_tiles = dq_head_tiles<kBlockM * kDim, kBlockM>(p, batch, head);
      for (int i = 0; i < ss.num_live_blocks; ++i, ++step) {
        const uint16_t entry = live_list[i];
        const int m = live_block_index(entry);
        const int stage = read.index();
        Tensor tSrS = partition_fragment_C(mma_sdp, make_shape(Int<kBlockM>{}, Int<kBlockN>{}));
        Tensor tdPrdP = partition_fragment_C(mma_sdp, make_shape(Int<kBlockM>{}, Int<kBlockN>{}));
        Tensor scores = make_tensor(tSrS.data(), acc_as_rows_cols(tSrS.layout()));
        Tensor dp = make_tensor(tdPrdP.data(), acc_as_rows_cols(tdPrdP.layout()));
        pipeline.consumer_wait(read);
        warpgroup_gemm</*zero_init=*/true, /*wait=*/-1>(mma_sdp, tSrQ(_, _, _, stage), tSrK, tSrS);
        warpgroup_gemm</*zero_init=*/true, /*wait=*/-1>(mma_sdp, tdPrdO(_, _, _, stage), tdPrV, tdPrdP);
        const float* stage_lse = ss.smem_lse.data() + stage * kBlockM;
        const float* stage_delta = ss.smem_delta.data() + stage * kBlockM;
        float lse_log2[kRows];
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) lse_log2[r] = stage_lse[get<0>(tScS_rc(r, 0))];

        warpgroup_wait<1>();  // S is ready
        if (live_block_partial(entry)) {
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < kCols; ++c) {
            const KeyRows key_rows = key_rows_of[get<1>(tScS_rc(0, c))];
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kRows; ++r) {
              if (row_masked(key_rows, m * kBlockM + get<0>(tScS_rc(r, c)))) scores(r, c) = -CUDART_INF_F;
            }
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) {
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < kCols; ++c) scores(r, c) = cuda::fast_exp2(scores(r, c) * scale_log2 - lse_log2[r]);
        }
        warpgroup_wait<0>();  // dP is ready
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const float row_delta = stage_delta[get<0>(tScS_rc(r, 0))];
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < kCols; ++c) dp(r, c) = scores(r, c) * (dp(r, c) - row_delta);
        }
        auto rP = convert_tensor<Element>(tSrS);
        auto rdS = convert_tensor<Element>(tdPrdP);
        // P and dS have one buffer each: both warpgroups' GEMMs of the last
        // step (waited for at its end) must have read them.
        if (step > 0) named_barrier<kPdSFree, Traits::kNumMmaThreads>();
        cute::copy(copy_pds, thr_copy_pds.retile_S(rP), tPsP(_, _, _, 0));
        cute::copy(copy_pds, thr_copy_pds.retile_S(rdS), tdSsdS(_, _, _, 0));
        cutlass::arch::fence_view_async_shared();  // the tensor cores read them next
        named_barrier<kdS, Traits::kNumMmaThreads>();  // both warpgroups' keys of P and dS stored

        // dQ first: wgmma groups retire in order, so once two are left in
        // flight dQ is done and its atomics run under the dV and dK GEMMs.
        Tensor tdQrdQ = partition_fragment_C(mma_dq, make_shape(Int<kBlockM>{}, Int<kDim>{}));
        warpgroup_gemm</*zero_init=*/true, /*wait=*/-1>(mma_dq, tdQrdS(_, _, _, 0), tdQrK, tdQrdQ);
        warpgroup_gemm</*zero_init=*/false, /*wait=*/-1>(mma_dv, tdVrPt, tdVrdO(_, _, _, stage), tdVrdV);
        warpgroup_gemm</*zero_init=*/false, /*wait=*/-1>(mma_dk, tdKrdSt, tdKrQ(_, _, _, stage), tdKrdK);
        warpgroup_wait<2>();
        warpgroup_fence_operand(tdQrdQ);
        if constexpr (Traits::kStageDQ) {
          stage_dq_half(tdQrdQ, step);
        } else {
          float* tile = head_tiles + int64_t(m) * (kBlockM * kDim);
          add_dq_half(tile + (second_wg ? Traits::kDQHalfFloats : 0), tdQrdQ, wg_tid);
        }
        warpgroup_wait<0>();  // dV and dK have read dO and Q
        pipeline.consumer_release(read);
        ++read;
      }
    }
#ifdef FLASHMASK_EXP_TIMELINE
    tl.loop_end = clock64();
#endif
    write_dkv(tdKrdK, tdVrdV);
#ifdef FLASHMASK_EXP_TIMELINE
    if (mma_tid == 0) tl.record(kp.timeline, step, first_head, n_block);
#endif
  } else {
    Tensor tSrK = thr_sdp.partition_fragment_A(sK);
    Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);    // (MMA, N, K, stage)
    Tensor tdPrV = thr_sdp.partition_fragment_A(sV);
    Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);  // (MMA, N, K, stage)
    // dS^T leaves the accumulators by stmatrix (query pairs, query-contiguous
    // shared memory). (The element-wise copy through the swizzled tensor
    // compiled to generic 32-bit ST.E with 64-bit address math, ~100
    // instructions a step.)
    auto copy_ds = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto thr_copy_ds = copy_ds.get_thread_slice(mma_tid);
    Tensor tdSsdS = thr_copy_ds.partition_D(sdSt);  // (CPY, CPY_M, CPY_N, dS buffer)

    // (key, query) of every S^T element within the tile.
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(make_shape(Int<kBlockN>{}, Int<kBlockM>{})));
    Tensor tScS_rc = make_tensor(tScS.data(), acc_as_rows_cols(tScS.layout()));
    constexpr int kRows = decltype(size<0>(tScS_rc))::value;  // this thread's keys (2)

    const float scale_log2 = p.softmax_scale * 1.4426950408889634f;

    if (num_live > 0) ss.barrier_kv.wait(0);
#ifdef FLASHMASK_EXP_TIMELINE
    tl.first_step = clock64();
#endif
    PipelineState read;
    int step = 0;  // over heads and live blocks: the dS buffer and dQ hand-over
    for (int head = first_head; head < first_head + ss.cta_heads; ++head) {
      // The count is re-read from shared memory (the barriers' memory clobbers
      // force it) rather than held in a register across the loop.
      for (int i = 0; i < ss.num_live_blocks; ++i, ++step) {
        const uint16_t entry = live_list[i];
        const int m0 = live_block_index(entry) * kBlockM;
        const int stage = read.index();
        const int buf = step % 2;
        Tensor tSrS = partition_fragment_C(mma_sdp, make_shape(Int<kBlockN>{}, Int<kBlockM>{}));
        Tensor tdPrdP = partition_fragment_C(mma_sdp, make_shape(Int<kBlockN>{}, Int<kBlockM>{}));
        Tensor scores = make_tensor(tSrS.data(), acc_as_rows_cols(tSrS.layout()));
        Tensor dp = make_tensor(tdPrdP.data(), acc_as_rows_cols(tdPrdP.layout()));
        constexpr int kCols = decltype(size<1>(scores))::value;
        pipeline.consumer_wait(read);
        warpgroup_gemm</*zero_init=*/true, /*wait=*/-1>(mma_sdp, tSrK, tSrQ(_, _, _, stage), tSrS);
        warpgroup_gemm</*zero_init=*/true, /*wait=*/-1>(mma_sdp, tdPrV, tdPrdO(_, _, _, stage), tdPrdP);
        // LSE (x log2 e; +inf for rows that see no key and past the end, so P =
        // 0 there) and delta of this thread's query columns: staged in shared
        // memory with the stage's Q/dO (v9; loaded from global memory here, the
        // LSE's latency stalled the step, 10% of the consumers' samples in v8).
        const int col0 = get<1>(tScS_rc(0, 0));  // this thread's first query column
        const float* stage_lse = ss.smem_lse.data() + stage * kBlockM + col0;
        const float* stage_delta = ss.smem_delta.data() + stage * kBlockM + col0;
        float lse_log2[kCols];
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kCols; ++c) lse_log2[c] = stage_lse[acc_col_offset(c)];

        warpgroup_wait<1>();  // S^T is ready
        if (live_block_partial(entry)) {
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const KeyRows key_rows = key_rows_of[get<0>(tScS_rc(r, 0))];
            CUTLASS_PRAGMA_UNROLL
            for (int c = 0; c < kCols; ++c) {
              // Branch-free (bitwise) so the mask adds no control flow per element.
              if (row_masked(key_rows, m0 + col0 + acc_col_offset(c))) scores(r, c) = -CUDART_INF_F;
            }
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) {
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < kCols; ++c) scores(r, c) = cuda::fast_exp2(scores(r, c) * scale_log2 - lse_log2[c]);
        }
        warpgroup_wait<0>();  // dP^T is ready
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kCols; ++c) {
          const float row_delta = stage_delta[acc_col_offset(c)];
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) dp(r, c) = scores(r, c) * (dp(r, c) - row_delta);
        }

        auto rP = convert_tensor<Element>(tSrS);
        auto rdS = convert_tensor<Element>(tdPrdP);
        if (!p.deterministic) {
          // dS^T to shared memory for dQ; the tensor cores read it next, through
          // the async proxy. Two buffers: the one written here was last read by
          // the dQ GEMM two steps ago, finished before the last barrier.
          cute::copy(copy_ds, thr_copy_ds.retile_S(rdS), tdSsdS(_, _, _, buf));
          cutlass::arch::fence_view_async_shared();
        }
        Tensor tdVrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));
        Tensor tdKrdS = make_tensor(rdS.data(), acc_as_a_operand(rdS.layout()));
        warpgroup_gemm</*zero_init=*/false, /*wait=*/-1>(mma_dv, tdVrP, tdVrdO(_, _, _, stage), tdVrdV);
        if (!p.deterministic) {
          named_barrier<kdS, Traits::kNumMmaThreads>();  // both halves of dS^T stored
          // dQ before dK, so dQ's trip to shared memory runs
          // under the dK GEMM: wgmma groups retire in order, so waiting until
          // one is left in flight means dV and dQ are done and only dK runs.
          Tensor tdQrdQ = partition_fragment_C(mma_dq, make_shape(Int<kBlockM>{}, Int<kDim>{}));
          warpgroup_gemm</*zero_init=*/true, /*wait=*/-1>(mma_dq, tdQrdS(_, _, _, buf), tdQrK, tdQrdQ);
          warpgroup_gemm</*zero_init=*/false, /*wait=*/1>(mma_dk, tdKrdS, tdKrQ(_, _, _, stage), tdKrdK);
          warpgroup_fence_operand(tdQrdQ);
          stage_dq_half(tdQrdQ, step);
          warpgroup_wait<0>();  // dK has read Q
          pipeline.consumer_release(read);  // Q and dO of this stage are no longer read
        } else {
          warpgroup_gemm</*zero_init=*/false, /*wait=*/0>(mma_dk, tdKrdS, tdKrQ(_, _, _, stage), tdKrdK);
          pipeline.consumer_release(read);
        }
        ++read;
      }
    }  // heads

#ifdef FLASHMASK_EXP_TIMELINE
    tl.loop_end = clock64();
#endif
    write_dkv(tdKrdK, tdVrdV);
#ifdef FLASHMASK_EXP_TIMELINE
    if (mma_tid == 0) tl.record(kp.timeline, step, first_head, n_block);
#endif
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// The backward's finish: dq = dq_accum x softmax_scale from the tiles the
// main kernel added up (BwdParams::dq_accum_tiled), and under fitted grouping
// dK/dV of the key blocks it left in their fp32 slots. Items: every (batch,
// kv head) unit's dQ tiles (its query heads', 64 rows each), in the order the
// main kernel's CTAs finish the units, then every unit's key blocks' dK/dV.
struct FinishWork {
  int32_t* done;               // per unit: query heads x key blocks whose dQ is added (the writer warps' counts)
  int32_t* next_item;          // the next item to take
  const int32_t* dkv_written;  // cuda::dkv_written_flags; null: no dK/dV items
  int expected;                // a unit's count once complete: key blocks x GQA group
  int m_blocks;                // dQ tiles of a head
  int key_blocks;
  int dq_items;                // units x GQA group x m_blocks, then units x key_blocks dK/dV items
  int items;
};

// Waits (one thread) until *count reaches `expected`, with acquire semantics
// so that the main kernel's writes before its counts are visible after the
// CTA's next barrier. The counts complete within the main kernel's last
// CTAs' lifetime (every one of them has started before this kernel does); past
// kFinishWaitLimitNs a miscount traps (a launch error) instead of hanging.
constexpr uint64_t kFinishWaitLimitNs = uint64_t(120) * 1000 * 1000 * 1000;
__device__ __forceinline__ void wait_for_count(const int32_t* count, int expected) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(start));
  for (;;) {
    int seen;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(count) : "memory");
    if (seen >= expected) return;
    __nanosleep(256);
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
    if (now - start > kFinishWaitLimitNs) __trap();
  }
}

// One dQ tile: thread t reads back, 16 bytes at a time (L2 only: the tile was
// added up there), what consumer thread t stored and places each value
// through the same partition of the dQ GEMM (so the order is defined in one
// place, the tiled wgmma) into a shared tile, which then leaves in 16-byte
// row chunks (element-wise scattered stores made this pass twice as slow as
// the bytes it moves).
template <typename Traits, typename Element>
__device__ __forceinline__ void convert_dq_tile(const BwdParams& p, int batch, int head, int m, Element* rows) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kDim = Traits::kHeadDim;
  constexpr int kRowElems = cuda::dq_staging_row_elems(kDim);
  typename Traits::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(threadIdx.x);
  Tensor cdq = thr_dq.partition_C(make_identity_tensor(make_shape(Int<kBlockM>{}, Int<kDim>{})));
  const float* tile = dq_head_tiles<kBlockM * kDim, kBlockM>(p, batch, head) + int64_t(m) * (kBlockM * kDim);
  const float4* half = reinterpret_cast<const float4*>(tile + threadIdx.x / 128 * Traits::kDQHalfFloats);
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < size(cdq) / 4; ++k) {
    const float4 v = __ldcg(half + k * 128 + threadIdx.x % 128);
    const float values[4] = {v.x, v.y, v.z, v.w};
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < 4; ++e) {
      rows[get<0>(cdq(4 * k + e)) * kRowElems + get<1>(cdq(4 * k + e))] = Element(values[e] * p.softmax_scale);
    }
  }
  __syncthreads();
  Element* dq = static_cast<Element*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride;
  cuda::write_staged_dq_rows<kBlockM, kDim>(dq, p.dq_row_stride, rows, m, p.seqlen_q,
                                            padded_cols(p.head_dim, Int<kDim>{}));
}

// A key block's dK (scaled) and dV from its kv-head slot to dk/dv, unless the
// main kernel wrote them there itself (its flag in `written`).
template <typename Traits, typename Element>
__device__ __forceinline__ void convert_dkv_block(const BwdParams& p, const int32_t* written, int batch, int head_k,
                                                  int n_block, int key_blocks) {
  if (__ldcg(written + (int64_t(batch) * p.num_heads_k + head_k) * key_blocks + n_block) != 0) return;
  const int rows = min(Traits::kBlockN, p.seqlen_k - n_block * Traits::kBlockN);
  const int64_t first_key = int64_t(batch) * p.seqlen_k + int64_t(n_block) * Traits::kBlockN;
  auto convert = [&](const float* accum, void* grad, int dim, int64_t row_stride, int64_t head_stride,
                     int64_t batch_stride, float scale) {
    Element* const grad_rows = static_cast<Element*>(grad) + batch * batch_stride + head_k * head_stride +
                               int64_t(n_block) * Traits::kBlockN * row_stride;
    // kLoads float4 a thread in flight before any store (a loop of one load
    // and two stores kept one load in flight).
    constexpr int kLoads = 4;
    const int vectors = rows * dim / 4;
    for (int i0 = threadIdx.x; i0 < vectors; i0 += kLoads * blockDim.x) {
      float4 v[kLoads];
      CUTLASS_PRAGMA_UNROLL
      for (int u = 0; u < kLoads; ++u) {
        const int i = i0 + u * blockDim.x, r = i / (dim / 4), c = i % (dim / 4) * 4;
        if (i < vectors) {
          v[u] = __ldcg(reinterpret_cast<const float4*>(accum + ((first_key + r) * p.accum_heads_k + head_k) * dim + c));
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int u = 0; u < kLoads; ++u) {
        const int i = i0 + u * blockDim.x, r = i / (dim / 4), c = i % (dim / 4) * 4;
        if (i < vectors) {
          Element* const dst = grad_rows + r * row_stride + c;
          store_pair(dst, v[u].x * scale, v[u].y * scale);
          store_pair(dst + 2, v[u].z * scale, v[u].w * scale);
        }
      }
    }
  };
  // The slots' rows have the tensors' head dims (bwd_fitted_heads_kernel).
  convert(p.dk_accum, p.dk, padded_cols(p.head_dim, Int<Traits::kHeadDim>{}), p.dk_row_stride, p.dk_head_stride,
          p.dk_batch_stride, p.softmax_scale);
  convert(p.dv_accum, p.dv, padded_cols(p.value_head_dim(), Int<Traits::kHeadDimV>{}), p.dv_row_stride,
          p.dv_head_stride, p.dv_batch_stride, 1.f);
}

// Launched as the main kernel's programmatic dependent, so its CTAs start on
// the SMs that kernel's last wave leaves (sm90 v18: the conversions ran after
// the whole main kernel, on a GPU whose SMs had been idling in its tail).
// The CTAs take items in order from one counter. A dQ item waits for its
// unit's count where the writer warps count (kStageDQ); else, and for the
// dK/dV items (the consumers' own atomics, which no CTA waits for), the CTA
// waits for the whole main kernel (griddepcontrol.wait) before its first one.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumMmaThreads) bwd_finish_kernel(BwdParams p, FinishWork w) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  __shared__ __align__(16) Element rows[Traits::kBlockM * cuda::dq_staging_row_elems(Traits::kHeadDim)];
  __shared__ int cta_item;
  const int group = p.num_heads / p.num_heads_k;
  const int unit_dq_items = group * w.m_blocks;
  int checked_unit = -1;   // thread 0: the last unit seen complete (items only grow)
  bool main_done = false;  // the main kernel has ended (uniform over the CTA)
  for (;;) {
    if (threadIdx.x == 0) {
      const int item = atomicAdd(w.next_item, 1);
      const int unit = item / unit_dq_items;
      if (Traits::kStageDQ && item < w.dq_items && unit != checked_unit) {
        wait_for_count(w.done + unit, w.expected);
        checked_unit = unit;
      }
      cta_item = item;
    }
    __syncthreads();
    const int item = cta_item;
    if (item >= w.items) break;
    if (!main_done && (!Traits::kStageDQ || item >= w.dq_items)) {
      asm volatile("griddepcontrol.wait;\n" ::: "memory");
      main_done = true;
    }
    if (item < w.dq_items) {
      const int unit = item / unit_dq_items, j = item % unit_dq_items;
      const int batch = unit / p.num_heads_k, head_k = unit % p.num_heads_k;
      convert_dq_tile<Traits>(p, batch, head_k * group + j / w.m_blocks, j % w.m_blocks, rows);
    } else {
      const int unit = (item - w.dq_items) / w.key_blocks, n_block = (item - w.dq_items) % w.key_blocks;
      convert_dkv_block<Traits, Element>(p, w.dkv_written, unit / p.num_heads_k, unit % p.num_heads_k, n_block,
                                         w.key_blocks);
    }
    __syncthreads();  // rows and cta_item are taken again
  }
  // What follows on the stream may read what the main kernel wrote itself
  // (dK/dV of whole-group key blocks): end no earlier than it.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace sm90
}  // namespace flashmask
