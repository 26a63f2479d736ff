// Launch templates: one per (kernel, head dim, dtype), instantiated in the
// per-config .cu files so the builds stay small and parallel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../flashmask_params.h"
#include "bwd_grid.h"
#include "cuda_check.h"
#include "env_settings.h"
#include "exp_timeline.h"
#include "fa2_cta_order.cuh"
#include "flashmask_bwd_dq_kernel.cuh"
#include "flashmask_bwd_kernel.cuh"
#include "flashmask_bwd_staged_kernel.cuh"
#include "flashmask_fwd_kernel.cuh"
#include "kernel_traits.h"
#include "partial_test.cuh"

namespace flashmask {
namespace cuda {

template <int kHeadDim, typename T>
void run_fwd_(const FwdParams& p, cudaStream_t stream);
template <int kHeadDim, typename T>
void run_bwd_(const BwdParams& p, cudaStream_t stream);
// Deterministic backward only: dQ query-major into dq_accum (no atomics).
template <int kHeadDim, typename T>
void run_bwd_dq_(const BwdParams& p, cudaStream_t stream);

// Opts the kernel into `bytes` of dynamic shared memory, with a clear error
// where the GPU allows less per block: compute capability 8.6/8.9 (RTX
// 30x0/40x0, A10, L40) allows 99 KB, which the FA2-class backward at head
// dim 256 exceeds (the other kernels have tiles that fit: SmemClass).
template <typename Kernel>
void allow_large_smem(Kernel kernel, int bytes, int head_dim) {
  if (bytes <= 48 * 1024) return;
  const int limit = device_smem_optin();
  if (bytes > limit) {
    throw std::invalid_argument(
        "flashmask_attention: the FA2-class GPU kernel for head_dim " + std::to_string(head_dim) + " needs " +
        std::to_string(bytes) + " bytes of shared memory per block, this GPU allows " + std::to_string(limit) +
        " (GPUs of compute capability 8.6/8.9 lack the backward at head dim 256 so far; use head_dim "
        "32, 64, 96 or 128 there, or the CPU)");
  }
  FLASHMASK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// PADDLE_FLASHMASK_FA2_SMEM_CLASS: "99k" runs the 99 KB tiles (SmemClass::k99K)
// on every GPU, to test and time them on the larger ones; unset or "auto":
// each kernel takes its default tiles where the GPU allows them. Read at each
// launch, as PADDLE_FLASHMASK_FA2_BWD.
inline bool smem_class_99k_forced() {
  const char* env = std::getenv("PADDLE_FLASHMASK_FA2_SMEM_CLASS");
  const std::string choice = env != nullptr && *env != '\0' ? env : "auto";
  if (choice != "auto" && choice != "99k") {
    throw std::invalid_argument("PADDLE_FLASHMASK_FA2_SMEM_CLASS: expected 'auto' or '99k', got '" + choice + "'");
  }
  return choice == "99k";
}

// Whether a kernel whose default tiles are `Default` runs its k99K tiles: where
// the GPU allows a block less than the default tiles need, or when forced.
template <typename Default>
bool take_99k_tiles() {
  return smem_class_99k_forced() || Default::kSmemBytes + kStaticSmemBytes > device_smem_optin();
}

// The staged backward (BwdParams::dkv_direct, without GQA or deterministic):
// dK/dV stored by their one writer in the output dtype, FlashAttention-2's
// epilogue (with GQA per query head, summed per kv head after the kernel),
// rather than added into fp32 slots that are zeroed before and converted after.
// PADDLE_FLASHMASK_FA2_BWD_DKV_DIRECT=0 keeps the slots (to time both).
inline bool fa2_dkv_direct() { return env_switch("PADDLE_FLASHMASK_FA2_BWD_DKV_DIRECT", true); }

// With GQA outside deterministic mode as well, at head dims 64, 128 and 256 for
// groups of up to 4 query heads: each (key block, query head) CTA stores its
// rows in 16 bits and bwd_finish sums each kv head's group, in place of fp32
// adds into kv-head slots zeroed before and converted after. H200, 32:8,
// backward: head dim 128 sliding window 32K +3.1%, 128-512-token documents
// +1.3-2.2%, the rest +0-1.2%; 64 +1.4-3.5% on every mask (causal +-0.2%); 256
// +0-1.6% (NOTES.md, forty-eighth and forty-ninth sessions). Head dims 80 and
// 96 read -0.7% to +0.7%, and groups of 8 at 64 and 128 -1.1% to +2.5%: they
// keep the slots, which take fewer bytes (the per-head buffers take group / 2
// times the slots' bytes). PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS=0 keeps them always.
constexpr int kFa2GqaHeadsMaxGroup = 4;
inline bool fa2_gqa_heads_stored(int num_heads, int num_heads_k, int head_dim) {
  const bool measured_faster = head_dim == 64 || head_dim == 128 || head_dim == 256;
  return measured_faster && num_heads / num_heads_k <= kFa2GqaHeadsMaxGroup &&
         env_switch("PADDLE_FLASHMASK_FA2_BWD_GQA_HEADS", true);
}

// One CTA of Traits::kNThreads per grid cell, with the kernel's shared memory;
// `extra` follows the params among the kernel's arguments.
template <typename Traits, typename Kernel, typename Params, typename... Extra>
void launch_grid(Kernel kernel, const Params& p, dim3 grid, cudaStream_t stream, Extra... extra) {
  allow_large_smem(kernel, Traits::kSmemBytes, p.head_dim);
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, extra...);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

// One CTA per (head, block of `block` rows along `seqlen`, batch), the heads
// fastest: the forward's query blocks and the deterministic dQ pass's. The
// hardware hands out CTAs x fastest, and with the row blocks fastest each
// head's heavy blocks (the last query blocks under causal masks) started only
// once every earlier head had started, so the last head's heaviest CTAs ran
// alone at the end (H100, causal 8K, 32 heads: the forward 10% slower). With
// the heads fastest every head's heavy blocks go first and the light ones
// fill the last wave; the CTAs running at once read the same K/V blocks of
// every GQA group, which stay in L2. (The backward keeps the row blocks
// fastest but for its last key blocks: its CTAs add dQ into their head's fp32
// accumulator rows, and every head's at once outgrow L2: head dim 256 lost
// 12-37%; bwd_light_last below.)
template <typename Traits, typename Kernel, typename Params, typename... Extra>
void launch_rows_heads_fastest(Kernel kernel, const Params& p, int seqlen, int block, cudaStream_t stream,
                               Extra... extra) {
  constexpr int kMaxGridY = 65535;  // validation.FA2_MAX_QUERY_BLOCKS checks it first in Python
  const int blocks = (seqlen + block - 1) / block;
  if (blocks > kMaxGridY) {
    throw std::invalid_argument("flashmask_attention: the FA2-class GPU kernels take at most " +
                                std::to_string(int64_t(kMaxGridY) * block) + " query rows per call (" +
                                std::to_string(kMaxGridY) + " blocks of " + std::to_string(block) + "), got " +
                                std::to_string(seqlen));
  }
  launch_grid<Traits>(kernel, p, dim3(p.num_heads, blocks, p.batch), stream, extra...);
}

// A kernel's instantiation for the call's partial-tile test (partial_test_of),
// or its one for every test (kRunTime) at head dims that keep one.
template <template <typename, bool, bool, PartialTest> class KernelOf, typename Traits, bool kPadded, bool kOrdered>
auto kernel_for_test(PartialTest test) {
  if constexpr (!fa2_kernel_per_partial_test<Traits::kHeadDim>()) {
    return KernelOf<Traits, kPadded, kOrdered, PartialTest::kRunTime>::kernel;
  } else {
    switch (test) {
      case PartialTest::kVisibleRows:
        return KernelOf<Traits, kPadded, kOrdered, PartialTest::kVisibleRows>::kernel;
      case PartialTest::kMaskedRows:
        return KernelOf<Traits, kPadded, kOrdered, PartialTest::kMaskedRows>::kernel;
      default:
        return KernelOf<Traits, kPadded, kOrdered, PartialTest::kColumnBounds>::kernel;
    }
  }
}

// A kernel's instantiation for the call's head dim: its own, or, where the
// call's head dim runs on these tiles padded (tile_head_dim), the one
// that loads and stores p.head_dim columns; the one that takes p.cta_order
// where the launch orders its CTAs (`ordered`); and the call's partial-tile test.
template <template <typename, bool, bool, PartialTest> class KernelOf, typename Traits, typename Params>
auto kernel_for_head_dim(const Params& p, bool ordered = false) {
  const PartialTest test = partial_test_of(p.mask);
  if constexpr (takes_padded_head_dims<Traits::kHeadDim>()) {
    if (p.head_dim != Traits::kHeadDim) {
      if (tile_head_dim(p.head_dim) != Traits::kHeadDim) {
        throw std::logic_error("flashmask FA2-class kernels: head_dim " + std::to_string(p.head_dim) +
                               " reached the " + std::to_string(Traits::kHeadDim) + " kernel");
      }
      return ordered ? kernel_for_test<KernelOf, Traits, true, true>(test)
                     : kernel_for_test<KernelOf, Traits, true, false>(test);
    }
  }
  return ordered ? kernel_for_test<KernelOf, Traits, false, true>(test)
                 : kernel_for_test<KernelOf, Traits, false, false>(test);
}
template <typename Traits, bool kPadded, bool kOrdered, PartialTest kTest>
struct FwdKernelOf {
  static constexpr auto kernel = flashmask_fwd_kernel<Traits, kPadded, kOrdered, 1, kTest>;
};
template <int kHeadsPerCta>  // head pairs or quads (fwd_grid.h)
struct FwdHeadsKernel {
  template <typename Traits, bool kPadded, bool kOrdered, PartialTest kTest>
  struct Of {
    static constexpr auto kernel = flashmask_fwd_kernel<Traits, kPadded, kOrdered, kHeadsPerCta, kTest>;
  };
};
template <typename Traits, bool kPadded, bool kOrdered, PartialTest kTest>
struct BwdStagedKernelOf {
  static constexpr auto kernel = flashmask_bwd_staged_kernel<Traits, kPadded, kOrdered, kTest>;
};
// Its grid is never ordered, and it tests partial tiles from the column bounds
// at run time (the deterministic mode's dQ pass): one instantiation for all.
template <typename Traits, bool kPadded, bool, PartialTest>
struct BwdDQKernelOf {
  static constexpr auto kernel = flashmask_bwd_dq_kernel<Traits, kPadded>;
};

// The CTA orders' passes (fa2_cta_order.cuh) on the stream before the kernel,
// where the call can have heavy CTAs: a column mask and more blocks along the
// side a CTA walks (`walked`) than the floor (`min_blocks`); and where they
// fit: ranks in int32 and in the scatter pass's chunks.
constexpr int kFa2CountThreads = 256;
inline bool fa2_cta_order_pays(const FwdParams& p, int walked, int min_blocks, int64_t ctas) {
  return p.mask.startend_row_indices != nullptr && walked > min_blocks && ctas <= INT32_MAX &&
         fa2_order_chunks(ctas) <= kFa2MaxOrderChunks;
}

// After a count pass: the flag and scatter passes; returns the order.
template <typename Grid>
const int32_t* launch_fa2_order(const Grid& grid, int32_t* region, int blocks, int min_blocks, cudaStream_t stream) {
  int32_t* const ranks = fa2_order_ranks(region, grid.p, blocks);
  const unsigned chunks = unsigned(fa2_order_chunks(grid.ctas()));
  fa2_order_flag_kernel<<<chunks, kFa2OrderChunk, 0, stream>>>(grid, region, ranks, sm_count(), min_blocks);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
  fa2_order_scatter_kernel<<<chunks, kFa2OrderChunk, 0, stream>>>(grid, region, ranks, sm_count(), min_blocks);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
  return ranks;
}

// PADDLE_FLASHMASK_FA2_FWD_HEAVY_FIRST=0: the forward's grid order always;
// PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS sets the floor in 64-key blocks
// (tests lower it to order short calls this way). The grid of kRows-row query
// blocks of kHeadsPerCta heads a CTA (fwd_grid.h). Returns the order, or null
// for the grid's own.
template <typename Traits, int kRows = Traits::kBlockM, int kHeadsPerCta = 1>
const int32_t* fa2_fwd_cta_order(const FwdParams& p, cudaStream_t stream) {
  if (!env_switch("PADDLE_FLASHMASK_FA2_FWD_HEAVY_FIRST", true)) return nullptr;
  const int min_blocks =
      env_int("PADDLE_FLASHMASK_FA2_FWD_HEAVY_MIN_BLOCKS", kFa2HeavyMinRows / Traits::kBlockN, 1, 1 << 24);
  const int key_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const int query_blocks = (p.seqlen_q + kRows - 1) / kRows;
  const Fa2FwdOrderGrid<kHeadsPerCta> grid{p, query_blocks};
  if (!fa2_cta_order_pays(p, key_blocks, min_blocks, grid.ctas())) return nullptr;
  int32_t* const region = fa2_cta_order(p);
  FLASHMASK_CUDA_CHECK(cudaMemsetAsync(region, 0, kTileOrderHeaderInts * sizeof(int32_t), stream));
  const int64_t warps = summary_table_rows(p) * query_blocks;  // one an entry
  fa2_fwd_count_kernel<kFa2CountThreads, kRows, Traits::kBlockN, kHeadsPerCta>
      <<<unsigned((warps * 32 + kFa2CountThreads - 1) / kFa2CountThreads), kFa2CountThreads, 0, stream>>>(
          p, query_blocks, region);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
  return launch_fa2_order(grid, region, query_blocks, min_blocks, stream);
}

// Head pairs or quads (fwd_grid.h) where a mask cuts the tiles and the heads
// group up. H200, bf16 32:8, pairs against one head's 128 rows: forward +5-9%
// on causal documents and sliding windows at 8K-16K, +14-16% on 128-512-token
// documents, at every head dim. With no column mask a tile meets only the
// causal diagonal, where pairs read -1.5% to +3% by head dim (code
// placement): those calls keep their kernel.
// PADDLE_FLASHMASK_FA2_FWD_HEAD_PAIRS=0: one head's 128 rows a CTA always;
// PADDLE_FLASHMASK_FA2_FWD_HEAD_QUADS=0: pairs where quads would fit
// (fwd_takes_quads: head dims 96 and 256).
inline bool fa2_fwd_heads_a_tile(const FwdParams& p, int heads_a_tile, int64_t query_blocks) {
  const bool masked = p.mask.startend_row_indices != nullptr || p.block_mask.data != nullptr;
  return masked && fwd_heads_share_tiles(p, heads_a_tile) && query_blocks <= 65535 &&
         env_switch("PADDLE_FLASHMASK_FA2_FWD_HEAD_PAIRS", true) &&
         (heads_a_tile == 2 || env_switch("PADDLE_FLASHMASK_FA2_FWD_HEAD_QUADS", true));
}

// Launches the forward on tiles of kHeadsPerCta heads' kBlockM / kHeadsPerCta
// rows where they fit (fa2_fwd_heads_a_tile), in the grid's order or the one
// its own passes give; false where they do not fit.
template <typename Traits, int kHeadsPerCta>
bool launch_fwd_head_tiles(FwdParams p, cudaStream_t stream) {
  constexpr int kRows = Traits::kBlockM / kHeadsPerCta;
  const int64_t query_blocks = (int64_t(p.seqlen_q) + kRows - 1) / kRows;
  if (!fa2_fwd_heads_a_tile(p, kHeadsPerCta, query_blocks)) return false;
  p.cta_order = fa2_fwd_cta_order<Traits, kRows, kHeadsPerCta>(p, stream);
  const auto kernel =
      kernel_for_head_dim<FwdHeadsKernel<kHeadsPerCta>::template Of, Traits>(p, p.cta_order != nullptr);
  const dim3 grid(p.num_heads / kHeadsPerCta, unsigned(query_blocks), p.batch);
#ifdef FLASHMASK_EXP_TIMELINE
  launch_grid<Traits>(kernel, p, grid, stream, g_exp_timeline_fwd);
#else
  launch_grid<Traits>(kernel, p, grid, stream);
#endif
  return true;
}

// Head dims whose forward takes quads before pairs. H200 (sm_90a), bf16 32:8,
// quads against pairs on the benchmark's masks: head dim 96 +2-5% at 8K and
// 32K, 256 +3-4% on documents at 8K and even elsewhere; 64 -1% to +2% and 128
// -5% to -8% at 8K, where 128's quad kernel spills 160 bytes (57 spill
// instructions in its loop against the pairs' 28). The sm_80 build of 128's
// quad kernel spills no more than its pairs' (NOTES.md, forty-fifth session).
template <typename Traits>
constexpr bool fwd_takes_quads() {
  return Traits::kHeadDim == 96 || Traits::kHeadDim == 256;
}

// The forward on one set of tiles (with the timeline's buffer in a diagnostic
// build): of head quads or pairs where they fit, else of one head; either in
// the grid's order or the one the passes give (fa2_fwd_cta_order).
template <typename Traits>
void launch_fwd_tiles(const FwdParams& planned, cudaStream_t stream) {
  FwdParams p = planned;
  if constexpr (Traits::kBlockM == 2 * kFwdPairRows && Traits::kBlockM == 4 * kFwdQuadRows) {
    if constexpr (fwd_takes_quads<Traits>()) {
      if (launch_fwd_head_tiles<Traits, 4>(p, stream)) return;
    }
    if (launch_fwd_head_tiles<Traits, 2>(p, stream)) return;
  }
  p.cta_order = fa2_fwd_cta_order<Traits>(p, stream);
  const auto kernel = kernel_for_head_dim<FwdKernelOf, Traits>(p, p.cta_order != nullptr);
#ifdef FLASHMASK_EXP_TIMELINE
  launch_rows_heads_fastest<Traits>(kernel, p, p.seqlen_q, Traits::kBlockM, stream, g_exp_timeline_fwd);
#else
  launch_rows_heads_fastest<Traits>(kernel, p, p.seqlen_q, Traits::kBlockM, stream);
#endif
}

template <int kHeadDim, typename T>
void launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using Traits = FwdTraits<kHeadDim, T>;
  if constexpr (!fits_99k<Traits>()) {
    if (take_99k_tiles<Traits>()) return launch_fwd_tiles<FwdTraits<kHeadDim, T, SmemClass::k99K>>(p, stream);
  }
  launch_fwd_tiles<Traits>(p, stream);
}

// How many of the last key blocks of every head the main backward defers to
// after all the others, heads fastest (BwdParams::bwd_light_last). With the key
// blocks fastest (the grid's order otherwise) the last head's heaviest key
// blocks start in the last waves and run alone at the end; taking the heads
// fastest everywhere spreads the dQ accumulation over every head's rows at
// once, which outgrows L2 (NOTES.md, "CTA order"). Deferring only the last
// key blocks (under causal masks the lightest) fills the last wave with short
// CTAs whose dQ goes to the last k x kBlockN query rows of each head, which
// L2 holds. Measured (H100, one call, bf16 32:8): 16 of 128-key blocks takes
// causal 8K +4-6% (D64-128), causal documents 8K +10%, 16K and 32K within 1%;
// the 64-key blocks (head dim 256, the 99 KB tiles) lost 1-5% with 16 or 32,
// so they keep the grid's order. PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST=k
// overrides (0: off), at most `key_blocks`.
template <int kBlockN>
int bwd_light_last(int key_blocks) {
  constexpr int kDefault = kBlockN >= 128 ? 16 : 0;
  // At most 4096, so that num_heads + k grid rows stay within the grid's y limit (65535).
  return std::min(env_int("PADDLE_FLASHMASK_FA2_BWD_LIGHT_LAST", kDefault, 0, 4096), key_blocks);
}

// PADDLE_FLASHMASK_FA2_BWD_HEAVY_FIRST=0: the backward's grid order always;
// PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS sets the floor in the kernel's
// query steps (tests lower it to order short calls this way). `p` has its
// bwd_light_last. Returns the order, or null for the grid's own.
template <typename Traits>
const int32_t* fa2_bwd_cta_order(const BwdParams& p, int key_blocks, cudaStream_t stream) {
  if (!env_switch("PADDLE_FLASHMASK_FA2_BWD_HEAVY_FIRST", true)) return nullptr;
  const int min_steps =
      env_int("PADDLE_FLASHMASK_FA2_BWD_HEAVY_MIN_STEPS", kFa2HeavyMinRows / Traits::kBlockM, 1, 1 << 24);
  const int query_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const Fa2BwdOrderGrid grid{p, key_blocks};
  if (!fa2_cta_order_pays(p, query_blocks, min_steps, grid.ctas())) return nullptr;
  int32_t* const region = fa2_cta_order(p);
  FLASHMASK_CUDA_CHECK(cudaMemsetAsync(region, 0, kTileOrderHeaderInts * sizeof(int32_t), stream));
  const int64_t entries = summary_table_rows(p) * key_blocks;
  fa2_bwd_count_kernel<kFa2CountThreads, Traits::kBlockM, Traits::kBlockN>
      <<<unsigned((entries + kFa2CountThreads - 1) / kFa2CountThreads), kFa2CountThreads, 0, stream>>>(
          p, key_blocks, region);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
  return launch_fa2_order(grid, region, key_blocks, min_steps, stream);
}

// The main backward: rows of key blocks per head, then one row per deferred
// key block of one CTA per head (bwd_light_last; bwd_grid.h, as the kernels
// read it); or, with a CTA order (fa2_bwd_cta_order), one CTA per live rank,
// launched as `ordered_kernel` (null: the kernel takes no order).
template <typename Traits, typename Kernel>
void launch_bwd_rows(Kernel grid_kernel, Kernel ordered_kernel, const BwdParams& planned, cudaStream_t stream) {
  BwdParams p = planned;
  const int key_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  p.bwd_light_last = bwd_light_last<Traits::kBlockN>(key_blocks);
  p.cta_order = ordered_kernel != nullptr ? fa2_bwd_cta_order<Traits>(p, key_blocks, stream) : nullptr;
  const Kernel kernel = p.cta_order != nullptr ? ordered_kernel : grid_kernel;
  const dim3 grid = p.cta_order != nullptr ? dim3(unsigned(bwd_live_ctas(p, key_blocks)))
                                           : dim3(bwd_grid_x(key_blocks, p.num_heads, p.bwd_light_last),
                                                  p.num_heads + p.bwd_light_last, p.batch);
#ifdef FLASHMASK_EXP_TIMELINE
  if constexpr (std::is_same_v<Kernel, void (*)(BwdParams, unsigned long long*)>) {  // the staged kernel
    launch_grid<Traits>(kernel, p, grid, stream, g_exp_timeline);
  } else {
    launch_grid<Traits>(kernel, p, grid, stream);
  }
#else
  launch_grid<Traits>(kernel, p, grid, stream);
#endif
}

template <int kHeadDim, typename T>
void launch_bwd(const BwdParams& p, cudaStream_t stream) {
  // The kernel reads row_stats and, unless deterministic, adds dQ into tiles.
  if (p.row_stats == nullptr || p.dq_accum_tiled == p.deterministic) {
    throw std::invalid_argument(
        "flashmask FA2-class backward: plan it with plan_bwd_cuda (row_stats of bwd_row_stats_elems floats, "
        "dq_accum tiled unless deterministic)");
  }
  if (use_staged_bwd()) {
    using Traits = BwdStagedTraits<kHeadDim, T>;
    using Small = BwdStagedTraits<kHeadDim, T, SmemClass::k99K>;
    if constexpr (!fits_99k<Traits>() && fits_99k<Small>()) {
      if (take_99k_tiles<Traits>()) {
        launch_bwd_rows<Small>(kernel_for_head_dim<BwdStagedKernelOf, Small>(p),
                               kernel_for_head_dim<BwdStagedKernelOf, Small>(p, true), p, stream);
        return;
      }
    }
    launch_bwd_rows<Traits>(kernel_for_head_dim<BwdStagedKernelOf, Traits>(p),
                            kernel_for_head_dim<BwdStagedKernelOf, Traits>(p, true), p, stream);
  } else if constexpr (kHeadDim <= kSplitBwdMaxHeadDim) {
    if (p.dkv_direct) {  // planned while PADDLE_FLASHMASK_FA2_BWD said otherwise
      throw std::invalid_argument("flashmask FA2-class backward: dkv_direct is planned for the staged kernel only");
    }
    if (p.head_dim != kHeadDim) {  // Python's check_env_switches refuses it first
      throw std::invalid_argument("PADDLE_FLASHMASK_FA2_BWD=split takes head_dim 32, 64, 96 or 128, got " +
                                  std::to_string(p.head_dim) + "; unset it (or set 'staged') at this head_dim");
    }
    using Traits = BwdTraits<kHeadDim, T>;
    // The split kernel (for A/B timing) keeps the grid's order: reading an
    // order spilled it on sm_80 (44 -> 164 bytes at head dim 128).
    launch_bwd_rows<Traits>(flashmask_bwd_kernel<Traits>, static_cast<decltype(&flashmask_bwd_kernel<Traits>)>(nullptr),
                            p, stream);
  } else {
    throw std::invalid_argument("PADDLE_FLASHMASK_FA2_BWD=split takes head_dim 32, 64, 96 or 128, got " +
                                std::to_string(kHeadDim) + "; unset it (or set 'staged') at this head_dim");
  }
}

template <int kHeadDim, typename T>
void launch_bwd_dq(const BwdParams& p, cudaStream_t stream) {
  using Traits = BwdDQTraits<kHeadDim, T>;
  launch_rows_heads_fastest<Traits>(kernel_for_head_dim<BwdDQKernelOf, Traits>(p), p, p.seqlen_q, Traits::kBlockM,
                                    stream);
}

}  // namespace cuda
}  // namespace flashmask
