// Entry points of the kernel core. One set per backend, all taking the same
// params structs, so the framework glue only chooses by device.
#pragma once

#include <cstdint>

#include "flashmask_params.h"

namespace flashmask {

// ---- CPU --------------------------------------------------------------------
// Forward: writes out and softmax_lse (-inf on rows with every key masked).
void run_fwd_cpu(const FwdParams& params);
// Backward: writes dq, dk, dv from q, k, v, out, dout and softmax_lse.
// Deterministic: every output element is reduced by exactly one thread.
void run_bwd_cpu(const BwdParams& params);
// Sliding-window indices for one [seqlen_k, C] mask head (C = 1 when causal,
// else 2), exactly as Paddle's flashmask_attention builds them.
void fill_window_indices_cpu(int32_t* dst, int seqlen_q, int seqlen_k,
                             bool causal, int window_left, int window_right);
// OR of IndexError flags over all of `indices` [B, Hm, Sk, C] (contiguous).
int32_t check_indices_cpu(const int32_t* indices, int64_t num_columns,
                          int num_cols, bool causal, int seqlen_q);

// ---- CUDA (built only with a CUDA toolchain; see custom_ops/flashmask/cuda) ----
// `stream` is a cudaStream_t. Inputs fp16/bf16, head_dim 32, 64, 96 or 128; the
// workspaces in the params (block_bounds; for backward also dq/dk/dv_accum and
// softmax_d) must be allocated by the caller: sizes below and in the params.
bool cuda_supports(DType dtype, int head_dim, int head_dim_v);
void run_fwd_cuda(const FwdParams& params, void* stream);
// Fills the backward plan (bwd_head_group, bwd_group_max_steps,
// accum_heads_k, dkv_accum_stored, dkv_direct, dq_accum_tiled; see BwdParams) from the
// call's shapes, flags and pointers (q/k/v/dout set), and resolves gpu_kernel
// to the family planned for; run it before sizing the workspaces
// (dq/dk/dv_accum, dk/dv_heads, row_stats). On the sm90 path
// `head_group` > 0 asks for that many query heads per CTA (the largest
// divisor of the GQA group not above it is taken), 0 for the default;
// `group_max_steps` >= 0 overrides the per-key-block fitting (0: uniform
// groups), < 0 takes the default. Tests and benchmarks set them.
void plan_bwd_cuda(BwdParams& params, int head_group = 0, int group_max_steps = -1);
void run_bwd_cuda(const BwdParams& params, void* stream);
// fp32 elements of BwdParams::dq_accum for a planned call (B x Sq x H x D,
// or whole 64-row tiles when dq_accum_tiled).
int64_t bwd_dq_accum_elems(const BwdParams& params);
// fp32 elements of BwdParams::row_stats for a planned call (every backward
// reads it).
int64_t bwd_row_stats_elems(const BwdParams& params);
// Elements (of the output dtype) of BwdParams::dk_heads (value = false) or
// dv_heads (value = true) for a planned call: B x Sk x H x D (or Dv) where
// dkv_heads_expanded(), else 0 (leave them null).
int64_t bwd_dkv_heads_elems(const BwdParams& params, bool value);
// int32 elements of the block_bounds workspace: the mask's block summaries
// (none without a column mask), the persistent kernels' tile counters and the
// sm90 backward's per-key-block dK/dV flags (cuda/workspace.h).
int64_t block_bounds_elems(const FwdParams& params);
void fill_window_indices_cuda(int32_t* dst, int seqlen_q, int seqlen_k, bool causal,
                              int window_left, int window_right, void* stream);
// ORs IndexError flags into *flags (device memory, zeroed here).
void check_indices_cuda(const int32_t* indices, int64_t num_columns, int num_cols, bool causal,
                        int seqlen_q, int32_t* flags, void* stream);

}  // namespace flashmask
