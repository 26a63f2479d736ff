// Which calls the Hopper kernels take, and the (head dim, dtype) dispatch.
// Built in every CUDA build; the kernels themselves only where
// FLASHMASK_WITH_SM90 is defined (the arch list has 90a, see _op_sources.py).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "../env_settings.h"
#include "../head_dim_dispatch.h"
#include "../kernel_traits.h"
#include "bwd_cta_order.cuh"
#include "flashmask_sm90_api.h"

namespace flashmask {
namespace sm90 {

#if defined(FLASHMASK_WITH_SM90)
template <int kHeadDim, typename T>
void run_fwd_(const FwdParams& p, cudaStream_t stream);
template <int kHeadDim, typename T>
void run_bwd_(const BwdParams& p, cudaStream_t stream);
#endif

namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// TMA needs 16-byte aligned bases and global strides in multiples of 16 bytes.
bool tma_friendly(const void* ptr, int64_t row, int64_t head, int64_t batch) {
  return aligned16(ptr) && row % 8 == 0 && head % 8 == 0 && batch % 8 == 0;
}

// Longest sequences whose live-block lists still fit next to the tiles in
// shared memory (and in the lists' 15-bit block index): past head dim 128
// the tiles leave less room (192/128: 219 KB of tiles and staging; 256: 64-key
// tiles, twice the forward's list entries). Python's
// long_sequence.sm90_max_seqlen has the same rule.
int max_seqlen(int head_dim) { return head_dim > 128 ? 1 << 18 : 1 << 19; }

// The (q/k, v) head dims instantiated: 64, 96, 128 and 256 with v alike, and
// MLA's 192 with 128; and 80 on 96's tiles (cuda::tile_head_dim).
bool head_dims_built(int head_dim, int head_dim_v) {
  const int tiles = cuda::tile_head_dim(head_dim);
  const bool built = tiles == 64 || tiles == 96 || tiles == 128 || tiles == 192 || tiles == 256;
  return built && head_dim_v == value_head_dim_for(head_dim);
}
// Tiles of a persistent forward (query blocks of 128 x heads x batch): int
// indices handed out by an int counter.
constexpr int64_t kMaxTiles = int64_t(1) << 30;
// Backward head grouping: at most 4 query heads per CTA, and a grouped CTA at
// most 80 steps of 64 query rows per 16K query rows (at least 80): a
// 1024-token window's key block, 18 live blocks, still takes 4 heads; a key
// block that sees 1280+ rows keeps fewer up to 16K. The bound grows with the
// sequence because what it guards against is a grouped CTA that outlasts the
// rest of the backward, whose length grows with it. H200, Paddle bench (v10):
// 160 instead of 80 at 32K took causal document / share question fwd+bwd over
// Flex from 1.34 / 1.33 to 1.38 / 1.37x, while at 8K it cost causal
// document 1.65 -> 1.51x; no bound at all (uniform groups) made the global
// columns' CTAs a tail (global+sliding window 32K 1.92 -> 1.34x).
constexpr int kDefaultBwdHeadGroup = 4;
constexpr int kDefaultBwdGroupMaxSteps = 80;
constexpr int kBwdGroupStepsPerRows = 16384;
// The backward's CTA order (bwd_cta_ordered) by default up to this many keys.
// H100 harness, two passes (NOTES.md, v17c): at 8K causal +3%, causal
// document +4%, head dim 64 +3-5%, sliding window and 128-512-token documents
// -1-1.5%; at 32K nothing to gain (causal, causal document within 0.5%) and
// 128-512-token documents -3%.
constexpr int kBwdOrderMaxKeys = 16384;
constexpr int kDefaultBwdOrderClasses = 4;

}  // namespace

// Consecutive query heads that share K/V AND their column and block masks: a
// grouped CTA lists one head's live blocks for all of its heads. The GQA group,
// cut down where the mask has a head per query head (Hm = H).
static int shared_mask_heads(const BwdParams& p) {
  int shared = p.num_heads / p.num_heads_k;
  const auto heads_per_mask = [&](int mask_heads) { return mask_heads > 1 ? p.num_heads / mask_heads : shared; };
  if (p.mask.startend_row_indices != nullptr) shared = std::gcd(shared, heads_per_mask(p.mask.num_heads));
  if (p.block_mask.data != nullptr) shared = std::gcd(shared, heads_per_mask(p.block_mask.num_heads));
  return shared;
}

int bwd_head_group(const BwdParams& p, int requested) {
  // Default: up to 4 heads, with the grouping fitted to each key block's work
  // (bwd_group_max_steps), so light key blocks (windows, ends of documents)
  // share their prologue and epilogue and heavy ones keep a CTA per head.
  // Deterministic runs need a fixed slot per CTA, hence uniform grouping,
  // and there the default stays 1 (NOTES.md, sm90 v7a/v8).
  if (requested <= 0) requested = p.deterministic ? 1 : kDefaultBwdHeadGroup;
  const int group = shared_mask_heads(p);
  for (int g = std::min(requested, group); g > 1; --g) {
    if (group % g == 0) return g;
  }
  return 1;
}

int bwd_group_max_steps(const BwdParams& p, int requested) {
  if (p.deterministic || p.bwd_head_group <= 1) return 0;
  if (requested >= 0) return requested;
  return kDefaultBwdGroupMaxSteps * std::max(1, p.seqlen_q / kBwdGroupStepsPerRows);
}

bool bwd_dkv_direct(const BwdParams& p) {
  return p.num_heads == p.num_heads_k && cuda::env_switch("PADDLE_FLASHMASK_SM90_BWD_DKV_DIRECT", true);
}

// Whether the plan has a CTA order to write: fitted grouping, not
// deterministic, and int32 slots.
static bool bwd_orderable(const BwdParams& p) {
  if (!p.fitted_head_groups() || p.deterministic) return false;
  return int64_t(p.batch) * p.num_heads * ((p.seqlen_k + 63) / 64) < (int64_t(1) << 31);
}

bool bwd_cta_ordered(const BwdParams& p) {
  return bwd_orderable(p) && cuda::env_switch("PADDLE_FLASHMASK_SM90_BWD_ORDER", p.seqlen_k <= kBwdOrderMaxKeys);
}

bool bwd_chains_first(const BwdParams& p) {
  return bwd_orderable(p) && cuda::env_switch("PADDLE_FLASHMASK_SM90_BWD_CHAINS_FIRST", true);
}

int bwd_chain_min_steps() {
  return cuda::env_int("PADDLE_FLASHMASK_SM90_BWD_CHAIN_MIN_STEPS", kChainMinSteps, 1, 1 << 24);
}

int64_t bwd_chain_threshold(int64_t total_steps, int sms) {
  return chain_threshold(total_steps, sms, bwd_chain_min_steps());
}

int bwd_cta_order_cap(const BwdParams& p) {
  return cuda::env_int("PADDLE_FLASHMASK_SM90_BWD_ORDER_CAP", p.bwd_group_max_steps, 0, 1 << 24);
}

int bwd_cta_order_classes() {
  return cuda::env_int("PADDLE_FLASHMASK_SM90_BWD_ORDER_CLASSES", kDefaultBwdOrderClasses, 1, kOrderBuckets);
}

bool compiled() {
#if defined(FLASHMASK_WITH_SM90)
  return true;
#else
  return false;
#endif
}

bool fwd_supported(const FwdParams& p) {
  // Causal with C = 4 (no public API makes it) does not fit MaskedRows.
  const bool mask_fits = !(p.mask.startend_row_indices != nullptr && p.mask.causal && p.mask.num_cols == 4);
  return compiled() && mask_fits && p.dtype != DType::kFloat32 && head_dims_built(p.head_dim, p.value_head_dim()) &&
         p.seqlen_k <= max_seqlen(p.head_dim) && p.seqlen_q <= max_seqlen(p.head_dim) &&
         int64_t((p.seqlen_q + 127) / 128) * p.num_heads * p.batch < kMaxTiles &&
         tma_friendly(p.q, p.q_row_stride, p.q_head_stride, p.q_batch_stride) &&
         tma_friendly(p.k, p.k_row_stride, p.k_head_stride, p.k_batch_stride) &&
         tma_friendly(p.v, p.v_row_stride, p.v_head_stride, p.v_batch_stride) &&
         tma_friendly(p.out, p.o_row_stride, p.o_head_stride, p.o_batch_stride);  // O leaves by TMA (64-128)
}

// Pairs of 16-bit gradient values stored as one 32-bit word (the backward
// writes dK/dV directly where one CTA covers a whole GQA group).
bool pair_stores_aligned(const void* ptr, int64_t row, int64_t head, int64_t batch) {
  return reinterpret_cast<uintptr_t>(ptr) % 4 == 0 && row % 2 == 0 && head % 2 == 0 && batch % 2 == 0;
}

bool bwd_supported(const BwdParams& p) {
  // No deterministic mode past head dim 128: 192 has no deterministic dQ pass
  // (the FA2-class dQ kernel takes no value head dim of its own), and a
  // deterministic 256 runs the FA2-class backward (main kernel and dQ pass).
  return fwd_supported(p) && !(p.deterministic && p.head_dim > 128) &&
         tma_friendly(p.dout, p.do_row_stride, p.do_head_stride, p.do_batch_stride) &&
         pair_stores_aligned(p.dk, p.dk_row_stride, p.dk_head_stride, p.dk_batch_stride) &&
         pair_stores_aligned(p.dv, p.dv_row_stride, p.dv_head_stride, p.dv_batch_stride);
}

#if defined(FLASHMASK_WITH_SM90)
namespace {

struct FwdLauncher {
  const FwdParams& p;
  cudaStream_t stream;
  template <int D, typename T>
  void run() const {
    run_fwd_<D, T>(p, stream);
  }
};

struct BwdLauncher {
  const BwdParams& p;
  cudaStream_t stream;
  template <int D, typename T>
  void run() const {
    run_bwd_<D, T>(p, stream);
  }
};

// The Hopper instantiations: 192 pairs with value head dim 128 (fwd_supported),
// 80 runs on 96's tiles.
template <typename Params, typename Launcher>
bool dispatch(const Params& p, const Launcher& launcher) {
  return cuda::dispatch_head_dim<64, 96, 128, 192, 256>(cuda::tile_head_dim(p.head_dim),
                                                        p.dtype == DType::kBFloat16, launcher);
}

}  // namespace
#endif

void run_fwd(const FwdParams& p, cudaStream_t stream) {
#if defined(FLASHMASK_WITH_SM90)
  if (dispatch(p, FwdLauncher{p, stream})) return;
#endif
  (void)p, (void)stream;
  throw std::invalid_argument("flashmask sm90 forward: unsupported call (see fwd_supported)");
}

void run_bwd(const BwdParams& p, cudaStream_t stream) {
#if defined(FLASHMASK_WITH_SM90)
  if (dispatch(p, BwdLauncher{p, stream})) return;
#endif
  (void)p, (void)stream;
  throw std::invalid_argument("flashmask sm90 backward: unsupported call (see bwd_supported)");
}

}  // namespace sm90
}  // namespace flashmask
