// FlashMask forward for Hopper (sm90a), FA3 style.
//
// Persistent: one CTA per SM takes (query block of 128 rows, head, batch)
// tiles from a global counter (fwd_tile_of) until none are left, with three
// warpgroups:
//   warpgroup 0 (producer, 24 registers):
//     warps 1-3 fetch the next tile and build its live key-block list from
//       the mask's block min/max (sm90_block_list.cuh) ahead of the
//       consumers: fully masked blocks never appear in it, partially masked
//       ones are flagged and masked elementwise from the column bounds, the
//       rest run with no mask work;
//     warp 0 issues TMA bulk tensor copies of each tile's Q (two buffers;
//       one past head dim 128) and of K/V for every live key block (128 keys;
//       64 at head dim 256; 176 for calls with no mask at head dim 128) into
//       a 2-stage mbarrier pipeline that runs on across tile boundaries;
//   warpgroups 1-2 (consumers, 240 registers): 64 query rows each;
//     S = Q K^T with wgmma from shared memory, online softmax in registers,
//     O += P V with wgmma taking P straight from registers.
// So the next tile's list, Q and first K/V blocks are ready when the consumers
// finish a tile: short live lists (documents, windows) pay no per-tile
// prologue.
#pragma once

#include <math_constants.h>

#include <cutlass/arch/reg_reconfig.h>

#include "../../flashmask_params.h"
#include "../../mask_bounds.h"
#include "../fast_exp2.cuh"
#include "fwd_tile_order.cuh"
#include "sm90_block_list.cuh"
#include "sm90_kernel_traits.h"
#include "sm90_utils.cuh"

namespace flashmask {
namespace sm90 {

template <typename Traits>
struct FwdKernelParams {
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  typename Traits::TmaO tma_o;  // the epilogue's stores (Traits::kTmaStoreO)
  FwdParams p;
  int* tile_counter;  // zeroed before the launch: tiles handed out so far past the first wave
  int heads_together;  // query heads handed out side by side (fwd_tile_of): H / Hk or 1
  const int32_t* tile_order;  // heavy tiles first (fwd_tile_order.cuh), or null: fwd_tile_of's order
};

// Masks a partially masked tile (query rows from r0, key columns from c0) of
// a call without column bounds: the causal diagonal and the ragged end. S
// viewed (rows, cols), `coords` the tile coordinates of each element.
// Branch-free.
template <typename Scores, typename Coords>
__device__ __forceinline__ void mask_partial_tile(Scores& scores, Coords const& coords,
                                                  const FwdParams& p, int r0, int c0) {
  const int causal_offset = p.seqlen_k - p.seqlen_q;
  const int col0 = get<1>(coords(0, 0));  // this thread's first column in the tile
  CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < size<1>(scores); ++c) {
    const int col = c0 + col0 + acc_col_offset(c);
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(scores); ++r) {
      const int row = r0 + get<0>(coords(r, 0));
      const bool masked = (col >= p.seqlen_k) | (p.mask.causal & (col > row + causal_offset));
      if (masked) scores(r, c) = -CUDART_INF_F;
    }
  }
}

// The same with column bounds: `cols` holds the tile's columns as
// MaskedRows (diagonal and ragged end folded in; two subtractions and two
// unsigned compares per element; v9: the four bounds compared directly cost
// 21% of the consumers' samples on causal document 8K) or, where the mask
// leaves one visible interval per column, VisibleRows (one of each, v13b),
// staged in shared memory.
template <typename Scores, typename Coords, typename Rows>
__device__ __forceinline__ void mask_partial_tile(Scores& scores, Coords const& coords, const Rows* cols,
                                                  int r0) {
  const int col0 = get<1>(coords(0, 0));  // this thread's first column in the tile
  CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < size<1>(scores); ++c) {
    const Rows m = cols[col0 + acc_col_offset(c)];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(scores); ++r) {
      if (row_masked(m, r0 + get<0>(coords(r, 0)))) scores(r, c) = -CUDART_INF_F;
    }
  }
}

// One online-softmax step over a tile of scores, in the log2 domain: the
// rows' running max and sum move on, the scores become probabilities and
// alpha[r] is the factor by which row r's output accumulator must be
// rescaled. O itself is not touched here, so that under the
// intra-warpgroup overlap this runs while O's P V GEMM is in flight. A row
// with nothing visible yet keeps P = 0 without NaN.
// The exponents as one MUFU.EX2 each (cuda::fast_exp2), but at head dim 64
// exp2f: with the bare MUFU.EX2 ptxas put a word of the column-mask overlap
// kernel's consumers on the stack there, and the forward at 64 timed the same
// either way (NOTES.md, sm90 v20).
template <typename Traits, int kRows, typename Scores>
__device__ __forceinline__ void online_softmax_step(Scores& scores, float (&row_max)[kRows],
                                                    float (&row_sum)[kRows], float (&alpha)[kRows],
                                                    float scale_log2) {
  constexpr bool kFastExp = Traits::kHeadDim != 64;
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    float tile_max = -CUDART_INF_F;
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(scores); ++c) tile_max = fmaxf(tile_max, scores(r, c));
    const float new_max = fmaxf(row_max[r], quad_allreduce_max(tile_max) * scale_log2);
    const float max_used = new_max == -CUDART_INF_F ? 0.f : new_max;
    auto exp2 = [](float x) { return kFastExp ? cuda::fast_exp2(x) : exp2f(x); };
    alpha[r] = exp2(row_max[r] - max_used);
    float sum = 0.f;
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(scores); ++c) {
      const float prob = exp2(scores(r, c) * scale_log2 - max_used);
      scores(r, c) = prob;
      sum += prob;
    }
    row_sum[r] = row_sum[r] * alpha[r] + sum;
    row_max[r] = new_max;
  }
}

template <int kRows, typename Acc>
__device__ __forceinline__ void rescale_rows(Acc& acc_rc, const float (&alpha)[kRows]) {
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(acc_rc); ++c) acc_rc(r, c) *= alpha[r];
  }
}

// Query blocks of a forward call (the persistent grid's tiles are
// query blocks x heads x batch).
template <typename Traits>
__host__ __device__ __forceinline__ int fwd_query_blocks(const FwdParams& p) {
  return (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
}

// Named barriers (id 0 is __syncthreads): each consumer warpgroup's staging
// of partial-tile column bounds, the list builders' compaction, and the
// consumer warpgroups' turns at issuing S = QK^T (pingpong).
enum class FwdBarrier : int {
  kStagedColumnsWG0 = 1,
  kStagedColumnsWG1 = 2,
  kListBuilders = 3,
  kSchedulerWG0 = 4,
  kSchedulerWG1 = 5,
  kOutStagedWG0 = 6,  // a consumer warpgroup's O is in shared memory (Traits::kTmaStoreO)
  kOutStagedWG1 = 7
};

// Pingpong: a consumer warpgroup issues its S = QK^T only after the other one
// issued its own, so one warpgroup's softmax runs under the other's GEMMs
// rather than both waiting on the tensor cores at once. Both warpgroups take
// the same steps (one list per tile), so the turns alternate over the whole
// kernel; warpgroup 1 grants warpgroup 0 the first turn.
__device__ __forceinline__ void scheduler_wait_turn(int wg) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(int(FwdBarrier::kSchedulerWG0) + wg) : "memory");
}
__device__ __forceinline__ void scheduler_pass_turn(int wg) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(int(FwdBarrier::kSchedulerWG0) + 1 - wg) : "memory");
}

// mbarrier waits/arrives as compiler memory fences too: the lists and list
// lengths they publish are plain shared-memory accesses.
__device__ __forceinline__ void wait_published(cutlass::arch::ClusterBarrier& bar, int phase) {
  bar.wait(phase);
  asm volatile("" ::: "memory");
}
__device__ __forceinline__ void arrive_published(cutlass::arch::ClusterBarrier& bar) {
  asm volatile("" ::: "memory");
  bar.arrive();
}

// kColumnMask: the call has startend_row_indices. Masks without (plain
// causal, full) get a kernel with no staging code at all, which keeps their
// main loop's registers and schedule free of it. kPingPong: see
// scheduler_wait_turn. kOverlap: the intra-warpgroup overlap of the main
// loop (the softmax of key block i under the P V GEMM of block i - 1).
// kOneVisible: the column mask leaves each column one visible interval
// (one_visible_interval: C = 1, non-causal C = 2), tested as VisibleRows.
template <typename Traits, bool kColumnMask, bool kPingPong, bool kOverlap, bool kOneVisible = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flashmask_fwd_sm90_kernel(CUTE_GRID_CONSTANT FwdKernelParams<Traits> const kp) {
  static_assert(!(kPingPong && kOverlap), "pingpong turns are taken in the serial loop only (sm90_launch.cuh)");
  static_assert(!kOneVisible || (kColumnMask && kOverlap), "one instantiation: column masks, overlap schedule");
  static_assert(!Traits::kWideKeys || (!kColumnMask && kOverlap && !kPingPong),
                "176-key tiles: calls with no mask, overlap schedule");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  using TileShape = typename Traits::TileShape;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  using SharedStorage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kQBuffers = Traits::kQBuffers;
  // The Q buffer of a slot: its own with two buffers, else the one buffer.
  auto q_buffer = [](int slot) { return kQBuffers == 2 ? slot : 0; };

  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
  const FwdParams& p = kp.p;
  const int query_blocks = fwd_query_blocks<Traits>(p);
  const int num_tiles = query_blocks * p.num_heads * p.batch;
  const int list_capacity = live_list_capacity((p.seqlen_k + kBlockN - 1) / kBlockN);
  // Slot k's live list (tiles alternate between slots 0 and 1).
  auto live_list = [&](int slot) {
    return reinterpret_cast<uint16_t*>(smem_raw + sizeof(SharedStorage)) + slot * list_capacity;
  };

  const int warp = cutlass::canonical_warp_idx_sync();
  const int warp_group = cutlass::canonical_warp_group_idx();
  const int lane_predicate = cute::elect_one_sync();

  if (warp == 0 && lane_predicate) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    if constexpr (Traits::kTmaStoreO) cute::prefetch_tma_descriptor(kp.tma_o.get_tma_descriptor());
    for (int slot = 0; slot < 2; ++slot) {
      ss.barrier_q[slot].init(1);
      // Every list builder: each arrives after its own list entries (below).
      ss.list_full[slot].init(Traits::kListThreads);
      // Every consumer thread and every lane of the TMA warp: each thread
      // publishes its own last reads of the slot.
      ss.tile_empty[slot].init(Traits::kNumMmaThreads + 32);
      ss.q_free[slot].init(Traits::kNumMmaWarpGroups);  // the TMA store issuers (kTmaStoreO)
    }
    cutlass::arch::fence_barrier_init();
  }
  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = Traits::kTmaBytesK;
  pipe_params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer
                                     : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = threadIdx.x % 128 == 0;
  pipe_params.num_consumers = Traits::kNumMmaThreads;
  Pipeline pipeline_k(ss.pipeline_k, pipe_params, Shape<_1, _1, _1>{});
  pipe_params.transaction_bytes = Traits::kTmaBytesV;  // V has its own head dim
  Pipeline pipeline_v(ss.pipeline_v, pipe_params, Shape<_1, _1, _1>{});
  __syncthreads();  // barriers initialised

  Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutVt{});

  if (warp_group == 0) {
    // ---------------- producer ----------------
    cutlass::arch::warpgroup_reg_dealloc<Traits::kLoadRegisters>();
    if (warp != 0) {
      // List builders: tile k goes to slot k % 2 once the consumers and the
      // TMA warp are done with tile k - 2 there. A tile index past the end
      // tells the other roles to stop.
      const int tid = threadIdx.x - 32;
      auto sync = [] {
        asm volatile("bar.sync %0, %1;\n" ::"n"(int(FwdBarrier::kListBuilders)), "n"(Traits::kListThreads)
                     : "memory");
      };
      auto draw = [&] { return int(gridDim.x) + atomicAdd(kp.tile_counter, 1); };
      // heavy tiles first (thread 0 reads the order's header once)
      const int num_heavy = kp.tile_order != nullptr && tid == 0 ? kp.tile_order[0] : 0;
      const int heavy_threshold = kp.tile_order != nullptr && tid == 0 ? kp.tile_order[1] : 0;
      auto tile_at = [&](int u) {
        if (kp.tile_order == nullptr) return u;
        return fwd_draw_tile(p, kp.tile_order, num_heavy, heavy_threshold, query_blocks, kp.heads_together,
                             num_tiles, u, draw);
      };
      int t = blockIdx.x;
      for (int k = 0;; ++k) {
        const int slot = k % 2;
        if (k >= 2) wait_published(ss.tile_empty[slot], (k / 2 - 1) % 2);
        if (k > 0 || kp.tile_order != nullptr) {
          if (tid == 0) ss.next_tile = tile_at(k > 0 ? draw() : int(blockIdx.x));
          sync();
          t = ss.next_tile;
          sync();  // read by all before thread 0 rewrites it
        }
        const bool done = t >= num_tiles;
        int num_live = 0;
        if (!done) {
          const FwdTile tile = fwd_tile_of(t, query_blocks, p.num_heads, kp.heads_together);
          if constexpr (Traits::kWideKeys) {
            num_live = build_all_key_blocks<Traits::kListThreads, kBlockN>(p, live_list(slot), tid, sync);
          } else {
            num_live = build_live_key_blocks<Traits::kListThreads, kBlockM, kBlockN>(
                p, tile.batch, tile.head, tile.m_block, live_list(slot), ss.warp_counts, tid, sync);
          }
        }
        if (tid == 0) {
          ss.tile_index[slot] = t;
          ss.num_live_blocks[slot] = num_live;
        }
        // Each builder publishes its own entries: with one arrival after the
        // builders' barrier the order was the same, but compute-sanitizer's
        // racecheck follows an mbarrier from its arriving threads only, and
        // reported every entry written by another builder as a race.
        arrive_published(ss.list_full[slot]);
        if (done) return;
      }
    }
    const auto shape_q = make_shape(p.seqlen_q, p.head_dim, p.num_heads, p.batch);
    const auto shape_k = make_shape(p.seqlen_k, p.head_dim, p.num_heads_k, p.batch);
    constexpr int kDimV = Traits::kHeadDimV;
    // The tensors' own head dims: narrower than the tiles' where the call runs padded (TMA fills zeros).
    const auto shape_v = make_shape(p.seqlen_k, p.value_head_dim(), p.num_heads_k, p.batch);
    Tensor mQ = kp.tma_q.get_tma_tensor(shape_q);
    Tensor mK = kp.tma_k.get_tma_tensor(shape_k);
    Tensor mV = kp.tma_v.get_tma_tensor(shape_v);
    PipelineState write = cutlass::make_producer_start_state<Pipeline>();
    for (int k = 0;; ++k) {
      const int slot = k % 2;
      wait_published(ss.list_full[slot], (k / 2) % 2);
      const int t = ss.tile_index[slot];
      if (t >= num_tiles) break;
      const FwdTile tile = fwd_tile_of(t, query_blocks, p.num_heads, kp.heads_together);
      const int head_k = tile.head / (p.num_heads / p.num_heads_k);
      const int num_live = ss.num_live_blocks[slot];
      const uint16_t* list = live_list(slot);
      Tensor gQ = local_tile(mQ(_, _, tile.head, tile.batch), select<0, 2>(TileShape{}),
                             make_coord(tile.m_block, _0{}));
      Tensor gK = local_tile(mK(_, _, head_k, tile.batch), select<1, 2>(TileShape{}), make_coord(_, _0{}));
      Tensor gV = local_tile(mV(_, _, head_k, tile.batch), make_shape(Int<kBlockN>{}, Int<kDimV>{}),
                             make_coord(_, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));
      auto [tKgK, tKsK] = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                        group_modes<0, 2>(gK));
      auto [tVgV, tVsV] = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                        group_modes<0, 2>(gV));
      // A tile with nothing live loads nothing; the arrive still completes
      // the phase the consumers wait on. With one Q buffer, the consumers
      // must be done with the previous tile (its slot's tile_empty, to which
      // this warp has already arrived) before Q is overwritten.
      auto load_q = [&](auto const& gq, auto& sq) {  // (structured bindings are not captured in C++17)
        if (kQBuffers == 1 && k > 0) wait_published(ss.tile_empty[(k - 1) % 2], ((k - 1) / 2) % 2);
        // The epilogue's TMA stores of tile k - 2 have read its O out of this buffer.
        if (Traits::kTmaStoreO && k >= 2) ss.q_free[slot].wait((k / 2 - 1) % 2);
        if (lane_predicate) {
          if (num_live > 0) {
            ss.barrier_q[slot].arrive_and_expect_tx(Traits::kTmaBytesQ);
            copy(kp.tma_q.with(reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType&>(
                                   ss.barrier_q[slot]),
                               0),
                 gq, sq(_, q_buffer(slot)));
          } else {
            ss.barrier_q[slot].arrive();
          }
        }
      };
      // Two Q buffers: Q first. One: the first K/V block first, which the
      // pipeline takes while the consumers still finish the previous tile.
      if (kQBuffers == 2 || num_live == 0) load_q(tQgQ, tQsQ);
      for (int i = 0; i < num_live; ++i) {
        const int n = live_block_index(list[i]);
        if (kQBuffers == 1 && i == 1) load_q(tQgQ, tQsQ);
        pipeline_k.producer_acquire(write);
        if (lane_predicate) {
          copy(kp.tma_k.with(*pipeline_k.producer_get_barrier(write), 0), tKgK(_, n),
               tKsK(_, write.index()));
        }
        pipeline_v.producer_acquire(write);
        if (lane_predicate) {
          copy(kp.tma_v.with(*pipeline_v.producer_get_barrier(write), 0), tVgV(_, n),
               tVsV(_, write.index()));
        }
        ++write;
      }
      if (kQBuffers == 1 && num_live == 1) load_q(tQgQ, tQsQ);
      arrive_published(ss.tile_empty[slot]);  // this lane's last list read is done
    }
    return;
  }

  // ---------------- consumers ----------------
  cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
  const int mma_tid = threadIdx.x - 128;
  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(mma_tid);
  auto thr_pv = mma_pv.get_thread_slice(mma_tid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K, slot)
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(typename Traits::TileShapePV{}));
  Tensor tOrO_rc = make_tensor(tOrO.data(), acc_as_rows_cols(tOrO.layout()));

  // (row, column) of every S accumulator element within the tile.
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(select<0, 1>(TileShape{})));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_as_rows_cols(tScS.layout()));
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShapePV{})));
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_as_rows_cols(tOcO.layout()));
  constexpr int kRows = decltype(size<0>(tOrO_rc))::value;  // 2 rows per thread
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;

  PipelineState read;
  // Column bounds of partial tiles, staged per warpgroup (one column per
  // thread) in two buffers alternating over partial tiles: a buffer is
  // rewritten only after this warpgroup's barrier on the other one, which
  // every thread reaches after its last read of this one.
  const int wg = mma_tid / 128;
  const int wg_tid = mma_tid % 128;
  int partial_tiles = 0;
  // A partial key block's column bounds (column-mask calls), one column per
  // thread of this warpgroup (64-key tiles: half of it). The overlap
  // schedule loads them a step ahead of their use (v13): loaded at the top of
  // the step that uses them, their global latency sat in front of that step's
  // QK^T issue (6% of the forward on 128-512-token documents).
  auto fetch_columns = [&](const int32_t* columns, int c0) FLASHMASK_INLINE -> ColumnBounds {
    const int col = c0 + wg_tid;
    return (kBlockN == 128 || wg_tid < kBlockN) && col < p.seqlen_k
               ? load_column_bounds(columns + int64_t(col) * p.mask.col_stride, p.mask.num_cols, p.mask.causal,
                                    p.seqlen_q)
               : ColumnBounds{0, 0, 0, 0};
  };
  // Stages fetched bounds as MaskedRows or VisibleRows (in the same
  // buffer); read back after this warpgroup's barrier.
  using StagedRows = std::conditional_t<kOneVisible, VisibleRows, MaskedRows>;
  static_assert(sizeof(StagedRows) <= sizeof(MaskedRows));
  auto stage_columns = [&](const ColumnBounds& b, int c0) FLASHMASK_INLINE -> StagedRows* {
    StagedRows* staged = reinterpret_cast<StagedRows*>(ss.col_bounds[wg][partial_tiles % 2]);
    if (kBlockN == 128 || wg_tid < kBlockN) {
      const int col = c0 + wg_tid, causal_offset = p.seqlen_k - p.seqlen_q;
      if constexpr (kOneVisible) {
        staged[wg_tid] = visible_rows(b, col, p.mask.causal, causal_offset, p.seqlen_k);
      } else {
        staged[wg_tid] = masked_rows(b, col, p.mask.causal, causal_offset, p.seqlen_k);
      }
    }
    ++partial_tiles;
    return staged;
  };
  // The bounds of the next partial block, in flight while a step runs.
  ColumnBounds ahead{0, 0, 0, 0};
  auto fetch_ahead = [&](const int32_t* columns, uint16_t entry) FLASHMASK_INLINE {
    if (kColumnMask && live_block_partial(entry)) ahead = fetch_columns(columns, live_block_index(entry) * kBlockN);
  };
  auto mask_tile = [&](auto& scores, const StagedRows* staged, int r0, int c0) FLASHMASK_INLINE {
    if constexpr (kColumnMask) {  // this warpgroup's columns are staged
      asm volatile("bar.sync %0, 128;\n" ::"r"(int(FwdBarrier::kStagedColumnsWG0) + wg) : "memory");
      mask_partial_tile(scores, tScS_rc, staged, r0);
    } else {
      mask_partial_tile(scores, tScS_rc, p, r0, c0);
    }
  };
  float row_max[kRows], row_sum[kRows], alpha[kRows];  // row_max in the scaled log2 domain
  auto start_rows = [&]() FLASHMASK_INLINE {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -CUDART_INF_F;
      row_sum[r] = 0.f;
    }
    clear(tOrO);
  };
  // Traits::kTmaStoreO: one thread per consumer warpgroup issues its TMA
  // stores and hands the Q buffer back to the TMA warp (q_free) once they
  // have read the staged O. It does so late, after the next tile's first
  // step, by when they have: waiting at once would hold the warpgroup's next
  // GEMMs for the copy's latency. The lists' slot (tile_empty) is released
  // as before, so the builders keep a whole tile of lead.
  const bool out_issuer = Traits::kTmaStoreO && wg_tid == 0;
  int stored_slot = -1;  // the slot whose staged O this thread's stores may still read
  auto release_stored_slot = [&]() FLASHMASK_INLINE {
    if (out_issuer && stored_slot >= 0) {
      tma_store_wait<0>();
      ss.q_free[stored_slot].arrive();
      stored_slot = -1;
    }
  };
  // The LSE (natural log) of this thread's rows, and 1 / row sum (0 for rows
  // that saw no key).
  auto finish_rows = [&](const FwdTile& tile, float (&inv)[kRows]) FLASHMASK_INLINE {
    float* lse = p.softmax_lse + (int64_t(tile.batch) * p.num_heads + tile.head) * p.seqlen_q;
    const int col0 = get<1>(tOcO_rc(0, 0));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float total = quad_allreduce_sum(row_sum[r]);
      const int row = tile.m_block * kBlockM + get<0>(tOcO_rc(r, 0));
      const bool empty = total == 0.f;  // NaN (a NaN score) is not empty: it stays NaN
      inv[r] = empty ? 0.f : rcp_approx(total);
      if (col0 == 0 && row < p.seqlen_q) {
        lse[row] = empty ? -CUDART_INF_F : (row_max[r] + log2f(total)) * 0.6931471805599453f;
      }
    }
  };
  // Normalises O into the Q buffer of `slot` (this warpgroup's rows, which
  // its last QK^T has read) and stores it with TMA, one store per panel.
  auto store_tile_tma = [&](const FwdTile& tile, int slot) FLASHMASK_INLINE {
    if constexpr (Traits::kTmaStoreO) {
      float inv[kRows];
      finish_rows(tile, inv);
      rescale_rows(tOrO_rc, inv);
      Tensor rO = make_tensor_like<Element>(tOrO);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tOrO); ++i) rO(i) = Element(tOrO(i));
      auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
      auto thr_copy_o = copy_o.get_thread_slice(mma_tid);
      Tensor sO = sQ(_, _, q_buffer(slot));  // (rows, Dv): Dv = D here
      cute::copy(copy_o, thr_copy_o.retile_S(rO), thr_copy_o.partition_D(sO));
      cutlass::arch::fence_view_async_shared();  // the TMA unit reads it next
      asm volatile("bar.sync %0, 128;\n" ::"r"(int(FwdBarrier::kOutStagedWG0) + wg) : "memory");
      if (out_issuer) {
        Tensor mO = kp.tma_o.get_tma_tensor(make_shape(p.seqlen_q, p.value_head_dim(), p.num_heads, p.batch));
        constexpr int kPanelCols = Traits::kPanelCols;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < Traits::kHeadDimV / kPanelCols; ++j) {
          Tensor gO = local_tile(mO(_, _, tile.head, tile.batch), Shape<Int<Traits::kOutRows>, Int<kPanelCols>>{},
                                 make_coord(tile.m_block * Traits::kNumMmaWarpGroups + wg, j));
          Tensor sPanel = make_tensor(make_smem_ptr(ss.smem_q.data() + Traits::out_panel_offset(q_buffer(slot), j, wg)),
                                      typename Traits::SmemLayoutOPanel{});
          auto [tOgO, tOsO] = tma_partition(kp.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sPanel),
                                            group_modes<0, 2>(gO));
          copy(kp.tma_o, tOsO, tOgO);
        }
        tma_store_arrive();
        stored_slot = slot;
      }
    }
  };
  // Normalises O and writes it and the LSE (natural log) of a finished tile
  // from registers (192/128 and 256; 64-128 take store_tile_tma).
  // Empty rows: O = 0, LSE = -inf. One branch per row (rows past the end
  // store nothing); inside it the row's 4-byte stores take immediate offsets
  // from one row pointer (v13: a predicate per store had compiled to a branch
  // and an address computation per store, 13 instructions each, a fifth of
  // the consumers' stall samples on 128-512-token documents).
  auto store_tile = [&](const FwdTile& tile) FLASHMASK_INLINE {
    const int r0 = tile.m_block * kBlockM;
    Element* out = static_cast<Element*>(p.out) + tile.batch * p.o_batch_stride + tile.head * p.o_head_stride;
    float* lse = p.softmax_lse + (int64_t(tile.batch) * p.num_heads + tile.head) * p.seqlen_q;
    const int col0 = get<1>(tOcO_rc(0, 0));  // this thread's first column; the rest at acc_col_offset
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float total = quad_allreduce_sum(row_sum[r]);
      const int row = r0 + get<0>(tOcO_rc(r, 0));
      const bool empty = total == 0.f;  // NaN (a NaN score) is not empty: it stays NaN
      const float inv = empty ? 0.f : rcp_approx(total);
      if (row < p.seqlen_q) {
        uint32_t* out_row = reinterpret_cast<uint32_t*>(out + int64_t(row) * p.o_row_stride + col0);
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(tOrO_rc); c += 2) {  // columns c and c + 1 are adjacent
          out_row[acc_col_offset(c) / 2] = pack_pair<Element>(tOrO_rc(r, c) * inv, tOrO_rc(r, c + 1) * inv);
        }
        if (col0 == 0) lse[row] = empty ? -CUDART_INF_F : (row_max[r] + log2f(total)) * 0.6931471805599453f;
      }
    }
  };

  // Intra-warpgroup overlap (FA3), the kOverlap schedules: step i issues
  // S_i = Q K_i^T, rescales O by step i-1's factor while that GEMM runs,
  // issues O += P_{i-1} V_{i-1}, waits for S_i alone and runs S_i's mask and
  // softmax while the P V GEMM is still on the tensor cores; only then does it
  // wait for that GEMM and turn S_i into P_i, which the next step multiplies
  // by V_i. A tile's first step (no P yet) is peeled off, so that every wgmma
  // of the loop is issued on a uniform path. P lives across steps in packed
  // 16-bit pairs, written only after the GEMM that reads it has retired.
  const auto s_layout = partition_fragment_C(mma_qk, select<0, 1>(TileShape{})).layout();
  uint32_t p_packed[decltype(size(s_layout))::value / 2];
  Tensor tOrP = make_tensor(make_rmem_ptr<Element>(reinterpret_cast<Element*>(p_packed)),
                            acc_as_a_operand(s_layout));
  PipelineState read_v = read;  // the stage of V_{i-1}
  const uint32_t softmax_pin = uint32_t(__cvta_generic_to_shared(&ss.softmax_pin[mma_tid]));
  // Step i > 0 of a tile whose Q is in `slot` (first steps: first_step below).
  // `next`: the following list entry (0 past the last), whose bounds are
  // fetched here if it is partial.
  auto overlap_step = [&](int slot, int r0, const int32_t* columns, int c0, uint16_t next,
                          auto partial) FLASHMASK_INLINE {
    constexpr bool kPartial = decltype(partial)::value;
    StagedRows* staged = (kColumnMask && kPartial) ? stage_columns(ahead, c0) : nullptr;
    fetch_ahead(columns, next);
    Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(TileShape{}));
    pipeline_k.consumer_wait(read);
    warpgroup_gemm</*zero_init=*/true, /*wait=*/-1>(mma_qk, tSrQ(_, _, _, q_buffer(slot)), tSrK(_, _, _, read.index()),
                                                    tSrS);
    rescale_rows(tOrO_rc, alpha);  // step i-1's factor, before P_{i-1} V_{i-1} lands in O
    warpgroup_fence_operand(tOrO);
    pipeline_v.consumer_wait(read_v);
    warpgroup_gemm</*zero_init=*/false, /*wait=*/-1>(mma_pv, tOrP, tOrV(_, _, _, read_v.index()), tOrO);
    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);  // S is read only after the wait
    pipeline_k.consumer_release(read);

    Tensor scores = make_tensor(tSrS.data(), acc_as_rows_cols(tSrS.layout()));
    if constexpr (kPartial) mask_tile(scores, staged, r0, c0);
    online_softmax_step<Traits>(scores, row_max, row_sum, alpha, scale_log2);
    // The row sums depend on every exp of the step; storing them (to a slot
    // of this thread's that nothing reads) pins the wait below after the
    // softmax: ptxas keeps memory operations and wgmma waits in order, but
    // would otherwise hoist the wait above the exps.
    static_assert(kRows == 2);
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(softmax_pin), "f"(row_sum[0]), "f"(row_sum[1])
                 : "memory");
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    pipeline_v.consumer_release(read_v);
    pack_pairs<Element>(tSrS, p_packed);
    read_v = read;
    ++read;
  };
  // Steps 1 .. num_live - 1 of a tile, each with and without the partial
  // block's mask on a path of its own: with both in one body, ptxas puts the
  // wait for the P V GEMM at the join after the mask, ahead of the softmax.
  auto overlap_steps = [&](int slot, int r0, const int32_t* columns, const uint16_t* list, int num_live) FLASHMASK_INLINE {
    for (int i = 1; i < num_live; ++i) {
      const uint16_t entry = list[i];
      const int c0 = live_block_index(entry) * kBlockN;
      const uint16_t next = i + 1 < num_live ? list[i + 1] : uint16_t(0);
      if (live_block_partial(entry)) {
        overlap_step(slot, r0, columns, c0, next, cute::true_type{});
      } else {
        overlap_step(slot, r0, columns, c0, next, cute::false_type{});
      }
    }
  };
  // A tile's first step: S_0 = Q K_0^T (its columns staged first if
  // partial), waited for at once (no P V is in flight yet), and its softmax.
  auto first_step = [&](int slot, int r0, const int32_t* columns, uint16_t entry, uint16_t next) FLASHMASK_INLINE {
    const bool partial = live_block_partial(entry);
    const int c0 = live_block_index(entry) * kBlockN;
    StagedRows* staged = (kColumnMask && partial) ? stage_columns(ahead, c0) : nullptr;
    fetch_ahead(columns, next);
    Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(TileShape{}));
    pipeline_k.consumer_wait(read);
    warpgroup_gemm</*zero_init=*/true, /*wait=*/0>(mma_qk, tSrQ(_, _, _, q_buffer(slot)), tSrK(_, _, _, read.index()), tSrS);
    pipeline_k.consumer_release(read);
    Tensor scores = make_tensor(tSrS.data(), acc_as_rows_cols(tSrS.layout()));
    if (partial) mask_tile(scores, staged, r0, c0);
    online_softmax_step<Traits>(scores, row_max, row_sum, alpha, scale_log2);
    pack_pairs<Element>(tSrS, p_packed);
    read_v = read;
    ++read;
  };
  // The last block's P V, after the last step's softmax.
  auto last_pv = [&]() FLASHMASK_INLINE {
    rescale_rows(tOrO_rc, alpha);
    warpgroup_fence_operand(tOrO);
    pipeline_v.consumer_wait(read_v);
    warpgroup_gemm</*zero_init=*/false, /*wait=*/0>(mma_pv, tOrP, tOrV(_, _, _, read_v.index()), tOrO);
    pipeline_v.consumer_release(read_v);
  };

  // The tile in slot k % 2 once its list is published: false past the last one.
  // The tile's coordinates, or only its index where registers are short
  // (FwdTraits::kKeepTileIndex), kept across the main loop for the epilogue.
  // Its Q is waited for apart (wait_q), after the previous tile's stores.
  struct OpenTile {
    FwdTile tile;
    int t;
    int r0, num_live;
    const uint16_t* list;
    const int32_t* columns;
  };
  auto open_tile = [&](int k, OpenTile& o) FLASHMASK_INLINE -> bool {
    const int slot = k % 2;
    wait_published(ss.list_full[slot], (k / 2) % 2);
    const int t = ss.tile_index[slot];
    if (t >= num_tiles) return false;
    const FwdTile tile = fwd_tile_of(t, query_blocks, p.num_heads, kp.heads_together);
    if constexpr (Traits::kKeepTileIndex) {
      o.t = t;
    } else {
      o.tile = tile;
    }
    o.r0 = tile.m_block * kBlockM;
    o.columns = kColumnMask ? mask_columns(p, tile.batch, tile.head) : nullptr;
    o.num_live = ss.num_live_blocks[slot];
    o.list = live_list(slot);
    return true;
  };
  auto wait_q = [&](int k) FLASHMASK_INLINE {
    ss.barrier_q[k % 2].wait((k / 2) % 2);  // Q landed (or nothing is live)
  };
  auto store_open_tile = [&](const OpenTile& o) FLASHMASK_INLINE {
    if constexpr (Traits::kKeepTileIndex) {
      store_tile(fwd_tile_of(o.t, query_blocks, p.num_heads, kp.heads_together));
    } else {
      store_tile(o.tile);
    }
  };

  // Tile k + 1 is opened (its list read, its first partial block's bounds
  // fetched) before tile k's stores, which then cover that load's latency.
  if (kPingPong && wg == 1) scheduler_pass_turn(wg);
  OpenTile o;
  bool more = open_tile(0, o);
  if (kOverlap && more && o.num_live > 0) fetch_ahead(o.columns, o.list[0]);
  for (int k = 0; more; ++k) {
    const int slot = k % 2;
    wait_q(k);
    start_rows();
    if constexpr (!kOverlap) {
      for (int i = 0; i < o.num_live; ++i) {
        const uint16_t entry = o.list[i];
        const bool partial = live_block_partial(entry);
        const int c0 = live_block_index(entry) * kBlockN;
        StagedRows* staged =
            (kColumnMask && partial) ? stage_columns(fetch_columns(o.columns, c0), c0) : nullptr;
        Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(TileShape{}));
        pipeline_k.consumer_wait(read);
        if constexpr (kPingPong) {
          scheduler_wait_turn(wg);
          warpgroup_gemm</*zero_init=*/true, /*wait=*/-1>(mma_qk, tSrQ(_, _, _, q_buffer(slot)),
                                                          tSrK(_, _, _, read.index()), tSrS);
          scheduler_pass_turn(wg);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tSrS);  // S is read only after the wait
        } else {
          warpgroup_gemm</*zero_init=*/true, /*wait=*/0>(mma_qk, tSrQ(_, _, _, q_buffer(slot)),
                                                         tSrK(_, _, _, read.index()), tSrS);
        }
        pipeline_k.consumer_release(read);

        Tensor scores = make_tensor(tSrS.data(), acc_as_rows_cols(tSrS.layout()));
        if (partial) mask_tile(scores, staged, o.r0, c0);
        online_softmax_step<Traits>(scores, row_max, row_sum, alpha, scale_log2);
        rescale_rows(tOrO_rc, alpha);

        auto tSrP = convert_tensor<Element>(tSrS);
        Tensor tOrP_serial = make_tensor(tSrP.data(), acc_as_a_operand(tSrP.layout()));
        pipeline_v.consumer_wait(read);
        warpgroup_gemm</*zero_init=*/false, /*wait=*/0>(mma_pv, tOrP_serial, tOrV(_, _, _, read.index()), tOrO);
        pipeline_v.consumer_release(read);
        if (Traits::kTmaStoreO && i == 0) release_stored_slot();
        ++read;
      }
    } else if (o.num_live > 0) {
      first_step(slot, o.r0, o.columns, o.list[0], o.num_live > 1 ? o.list[1] : uint16_t(0));
      release_stored_slot();
      overlap_steps(slot, o.r0, o.columns, o.list, o.num_live);
      last_pv();
    }
    release_stored_slot();  // (tiles with nothing live)
    // This thread no longer reads the slot's list (nor, but for the O staged
    // there under kTmaStoreO, its Q): the producer may refill it.
    arrive_published(ss.tile_empty[slot]);
    OpenTile next;
    more = open_tile(k + 1, next);
    if (kOverlap && more && next.num_live > 0) fetch_ahead(next.columns, next.list[0]);
    if constexpr (Traits::kTmaStoreO) {
      store_tile_tma(o.tile, slot);
    } else {
      store_open_tile(o);
    }
    o = next;
  }
  if (out_issuer && stored_slot >= 0) tma_store_wait<0>();  // the staged O is read before the CTA ends
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace sm90
}  // namespace flashmask
