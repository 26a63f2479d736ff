// Framework-neutral description of one FlashMask attention call.
//
// Nothing here knows about Paddle: the Paddle registration (custom_ops/paddle)
// fills these structs from its tensors, and every backend (CPU now, CUDA later)
// reads only these structs. Strides are in elements, so any layout the
// framework hands us (e.g. a transposed view) works without a copy.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHMASK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHMASK_HOST_DEVICE inline
#endif

namespace flashmask {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Which GPU kernel family runs a call. kAuto: the Hopper (sm90: TMA + wgmma)
// kernels on compute capability 9.0 when the build has them and they take the
// call's head dim and dtype, the FA2-class (mma.sync) kernels otherwise.
// Forcing one is for tests and benchmarks; forcing kSm90 where it cannot run
// is an error, never a silent fallback.
enum class GpuKernel : int { kAuto = 0, kFA2 = 1, kSm90 = 2 };

// Column-wise mask: for key column j up to four query-row bounds
// (LTS, LTE, UTS, UTE); see mask_bounds.h for how `num_cols` maps onto them.
struct MaskParams {
  const int32_t* startend_row_indices = nullptr;  // nullptr: no column mask
  int64_t batch_stride = 0;  // 0 broadcasts one mask over the batch
  int64_t head_stride = 0;   // 0 broadcasts one mask over the heads (Hm == 1)
  int64_t col_stride = 0;    // stride between key columns (== num_cols when contiguous)
  int num_heads = 1;         // Hm: 1 or num_heads_k
  int num_cols = 0;          // C: 0 (no column mask), 1, 2 or 4
  bool causal = false;       // also mask j > i + (seqlen_k - seqlen_q)
};

// Block-level mask on top of the column mask (Paddle's block_mask): one int32
// per 128 x 128 block of (query rows, key columns), 0 = every element of the
// block masked. [batch or 1, heads, ceil(Sq / 128), ceil(Sk / 128)], heads 1 or
// the mask's Hm (query head h uses h / (H / heads)).
struct BlockMaskParams {
  const int32_t* data = nullptr;  // nullptr: no block mask
  int64_t batch_stride = 0;       // 0 broadcasts over the batch
  int64_t head_stride = 0;        // 0 broadcasts over the heads
  int num_heads = 1;
  int col_blocks = 0;             // ceil(seqlen_k / 128)
};

struct FwdParams {
  DType dtype = DType::kFloat32;

  // [batch, seqlen, heads, head_dim] tensors.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* softmax_lse = nullptr;  // [batch, num_heads, seqlen_q], fp32

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int num_heads = 0;    // H (query heads)
  int num_heads_k = 0;  // Hk (key/value heads), H % Hk == 0
  int head_dim = 0;     // of q and k
  int head_dim_v = 0;   // of v and out (MLA: 128 with q/k at 192); 0 = head_dim
  FLASHMASK_HOST_DEVICE int value_head_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }

  float softmax_scale = 1.f;
  MaskParams mask;
  BlockMaskParams block_mask;  // CPU kernels only for now

  int num_threads = 0;  // CPU only; 0 = all cores available to the process
  GpuKernel gpu_kernel = GpuKernel::kAuto;  // GPU only

  // GPU only: workspace for the mask summary, [mask batches, Hm, ceil(Sk/64)]
  // BlockBounds (8 int32 each), written by the preprocessing kernel.
  int32_t* block_bounds = nullptr;

  // FA2-class GPU kernels only, set by their launcher (flashmask_launch.cuh):
  // where not null, CTA u of the launch computes the grid's CTA of rank
  // cta_order[u] (cuda/fa2_cta_order.cuh: the longest CTAs first), in the
  // rank order of fwd_grid.h / bwd_grid.h; null: each CTA its own grid cell.
  const int32_t* cta_order = nullptr;
};

struct BwdParams : FwdParams {
  const void* dout = nullptr;  // same layout as out
  void* dq = nullptr;          // same layout as q
  void* dk = nullptr;          // same layout as k
  void* dv = nullptr;          // same layout as v

  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  // GPU only: fp32 workspaces, then scaled and converted by bwd_finish.
  // dq_accum: [batch, seqlen_q, num_heads, head_dim] (contiguous), or tiled
  // (dq_accum_tiled below); size bwd_dq_accum_elems (flashmask_api.h).
  // dk_accum/dv_accum: [batch, seqlen_k, accum_heads_k, head_dim] (contiguous).
  // softmax_d: rowsum(dO * O) as [batch, num_heads, seqlen_q], written in
  // deterministic mode only, for the FA2-class dQ pass (the main kernels
  // read row_stats).
  float* dq_accum = nullptr;
  float* dk_accum = nullptr;
  float* dv_accum = nullptr;
  // dkv_direct with GQA (dkv_heads_expanded below): every query head's dK
  // (scaled) and dV in the output dtype, [batch, seqlen_k, num_heads,
  // head_dim] and [..., value_head_dim] (contiguous); bwd_dkv_heads_elems
  // (flashmask_api.h) gives their sizes.
  void* dk_heads = nullptr;
  void* dv_heads = nullptr;
  float* softmax_d = nullptr;
  // Both main backward kernels (sm90 and FA2-class): per query row, each
  // (batch, head) padded to whole 64-row blocks,
  // [2, batch, num_heads, bwd_padded_rows(seqlen_q)] fp32: LSE x log2(e)
  // (+inf where a row sees no key, and in the padding) and delta (0 in the
  // padding). bwd_prepare writes it; the kernels load each step's rows into
  // shared memory next to its Q/dO tile. Size: bwd_row_stats_elems.
  float* row_stats = nullptr;

  // GPU only (the CPU backward is always deterministic): make dq/dk/dv
  // bit-reproducible. The main backward kernel then does no dQ work at all (a
  // separate query-major kernel writes every dq_accum element once, no
  // atomics) and dK/dV go to slots with one writer each (accum_heads_k below),
  // so every accumulator element is touched by exactly one CTA; bwd_finish
  // sums each kv head's slots in a fixed order.
  bool deterministic = false;

  // FA2-class GPU backward only, set by its launcher (flashmask_launch.cuh,
  // bwd_light_last): the main backward kernel runs the last bwd_light_last
  // key blocks of every head after all the others, heads fastest (0: the
  // grid's own order, key blocks fastest). The grid then has num_heads rows
  // of key blocks followed by one row per deferred key block.
  int bwd_light_last = 0;

  // GPU backward plan, filled by plan_bwd_cuda (flashmask_api.h) before the
  // caller sizes dk_accum/dv_accum (it also resolves gpu_kernel to the
  // family these fields are planned for):
  // - bwd_head_group: consecutive query heads of one GQA group that one CTA
  //   covers, dK/dV summed in registers over them (the sm90 kernel; 1 else).
  // - accum_heads_k: head slots of dk_accum/dv_accum. A CTA whose first query
  //   head is h writes slot h / (num_heads / accum_heads_k): num_heads_k when
  //   the group's CTAs add into their kv head's slot with atomics, or
  //   num_heads / bwd_head_group when every slot has one writer
  //   (deterministic, or one CTA per whole group).
  // - dkv_accum_stored: the kernel stores every slot element (one writer, no
  //   atomics), so the accumulators need no zeroing first.
  // - dkv_direct (FA2-class staged backward, without GQA or deterministic;
  //   sm90 backward, without GQA):
  //   each CTA is the one writer of its (key block, query head)'s dK/dV rows
  //   and stores them in the output dtype (dK scaled), zeros where it saw no
  //   live query block, as FlashAttention-2 does: straight into dk/dv without
  //   GQA, else into dk_heads/dv_heads below, which bwd_finish sums per kv
  //   head (in fp32, in head order) into dk/dv. dk_accum/dv_accum are not used
  //   (no zeroing, atomics or fp32 conversion), and the caller may leave them null.
  // - bwd_group_max_steps (sm90, bwd_head_group > 1): 0 groups every key
  //   block alike. Above 0 the grouping follows each key block's work: its
  //   CTA covers the largest divisor d of bwd_head_group with d x (live
  //   query blocks) <= bwd_group_max_steps (at least 1 head), so light key
  //   blocks share their prologue and epilogue over several heads while heavy
  //   ones keep one head per CTA and no CTA becomes a long tail. The grid then
  //   has a CTA per head and those not first in their sub-group leave after
  //   listing; dK/dV go to num_heads_k slots (zeroed, added with atomics
  //   unless one CTA covers the whole GQA group).
  // - dq_accum_tiled (not deterministic): dq_accum holds whole 64-row
  //   tiles, [batch, num_heads, ceil(seqlen_q / 64), 64 x head_dim], each
  //   tile's floats in the family's dQ accumulator order: the sm90 kernel
  //   adds a tile with one bulk reduce per warpgroup and its launch converts
  //   it to dq; the FA2-class kernel adds 128 contiguous bytes per warp RED
  //   (cuda/dq_tile_layout.h) and bwd_finish converts. Zeroed by
  //   bwd_prepare.
  int bwd_head_group = 1;
  int accum_heads_k = 0;
  bool dkv_accum_stored = false;
  bool dkv_direct = false;
  int bwd_group_max_steps = 0;
  bool dq_accum_tiled = false;

  // Grouping fitted per key block is in force (the planner, the launch's
  // grid and the kernel's head mapping must all agree on it).
  FLASHMASK_HOST_DEVICE bool fitted_head_groups() const {
    return bwd_group_max_steps > 0 && bwd_head_group > 1;
  }
  // dK/dV stored per query head (dk_heads/dv_heads), then summed per kv head.
  FLASHMASK_HOST_DEVICE bool dkv_heads_expanded() const { return dkv_direct && num_heads != num_heads_k; }
};

// Bit flags reported by the index validation pass.
enum IndexError : int32_t {
  kIndexBelowZero = 1,      // some value < 0
  kIndexAboveSeqlenQ = 2,   // some value > seqlen_q
  kLowerStartAfterEnd = 4,  // LTS > LTE in a column
  kUpperStartAfterEnd = 8,  // UTS > UTE in a column
};

}  // namespace flashmask
