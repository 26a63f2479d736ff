// Entry points of the Hopper (sm90a) kernels: TMA + wgmma + warp
// specialization. flashmask_api_cuda.cu chooses between these and the
// FA2-class kernels (see GpuKernel in flashmask_params.h).
#pragma once

#include <cuda_runtime.h>

#include "../../flashmask_params.h"

namespace flashmask {
namespace sm90 {

// True when this library was built with the sm_90a kernels
// (PADDLE_FLASHMASK_CUDA_ARCHS contains 90a).
bool compiled();
// The value head dim the Hopper kernels pair with a query/key head dim: the
// same, except MLA's 192 (q, k) with 128 (v), as DeepSeek-V3-class models use.
// Their dispatch is keyed on the query/key head dim alone.
constexpr int value_head_dim_for(int head_dim) { return head_dim == 192 ? 128 : head_dim; }

// True when the Hopper kernels take this call (dtype, head dims 64, 96, 128 or
// 256 with value alike or 192 with value 128, and 80 on 96's tiles; strides,
// length; the backward not past head dim 128 in deterministic mode).
bool fwd_supported(const FwdParams& p);
bool bwd_supported(const BwdParams& p);
// Query heads per backward CTA (BwdParams::bwd_head_group): a divisor of the
// GQA group, the largest not above `requested` (0: the default, 4, or 1 in
// deterministic mode).
int bwd_head_group(const BwdParams& p, int requested);
// BwdParams::bwd_group_max_steps for a plan whose bwd_head_group is set:
// `requested` < 0 takes the default; always 0 (uniform groups) in
// deterministic mode or with one head per CTA.
int bwd_group_max_steps(const BwdParams& p, int requested);
// Whether the backward stores dK/dV straight into dk/dv in the output dtype
// (BwdParams::dkv_direct): without GQA, where each CTA is the one writer of
// its (key block, head) rows, so no fp32 slots (twice the gradients' bytes),
// no zeroing and no conversion pass; PADDLE_FLASHMASK_SM90_BWD_DKV_DIRECT=0
// keeps the slots (for A/B timing). With GQA, fitted grouping decides per key
// block (cuda::dkv_written_flags).
bool bwd_dkv_direct(const BwdParams& p);
// Whether the backward of this plan takes its CTAs in the order of
// bwd_cta_order.cuh (GQA group by group, heaviest first within a group):
// under fitted grouping up to 16K keys by default, where a wave is a large
// share of the kernel; PADDLE_FLASHMASK_SM90_BWD_ORDER=1 / 0 forces it on /
// off (NOTES.md, v17).
bool bwd_cta_ordered(const BwdParams& p);
// Whether the backward's chains (key blocks whose steps are a large share of
// an SM's whole work: bwd_cta_order.cuh) start first, before every GQA
// group's slots, at any length (PADDLE_FLASHMASK_SM90_BWD_CHAINS_FIRST=0: in
// their group's place, as before).
bool bwd_chains_first(const BwdParams& p);
// The steps past which a slot is a chain, for a call of `total_steps` (heads x
// live query blocks over every key block) on `sms` SMs (chain_threshold), never
// below bwd_chain_min_steps (PADDLE_FLASHMASK_SM90_BWD_CHAIN_MIN_STEPS, default
// 256).
int bwd_chain_min_steps();
int64_t bwd_chain_threshold(int64_t total_steps, int sms);
// The order's settings (bwd_cta_order_kernel): the work is capped at
// PADDLE_FLASHMASK_SM90_BWD_ORDER_CAP steps (unset: the fitted groups' bound,
// bwd_group_max_steps; 0: group by group in the grid's order) and sorted in
// PADDLE_FLASHMASK_SM90_BWD_ORDER_CLASSES classes (default 4: 2 and 8
// measured alike or worse, 256 lost 15% on 128-512-token documents at 32K;
// NOTES.md, v17).
int bwd_cta_order_cap(const BwdParams& p);
int bwd_cta_order_classes();
// Both expect the mask block summary (cuda::compute_block_bounds) to be done;
// the backward also expects cuda::bwd_prepare and leaves cuda::bwd_finish to
// the caller, like the FA2-class backward, and follows the same deterministic
// contract (BwdParams::deterministic: no dQ work, dK/dV in accum_heads_k slots),
// with the plan of cuda::plan_bwd_cuda.
void run_fwd(const FwdParams& p, cudaStream_t stream);
void run_bwd(const BwdParams& p, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashmask
