// Compile-time shape of the FA2-class kernels for one (head dim, dtype).
#pragma once

namespace flashmask {
namespace cuda {

// Key columns per tile; also the granularity of the mask block summary that
// the preprocessing kernel writes (one BlockBounds per kBlockN columns).
constexpr int kMaskBlockN = 64;
// Columns of a coarse mask summary (cuda::mask_coarse_summaries): 32 of the
// 64-column ones merged, so a forward list builder can pass 2048 masked keys
// at one read.
constexpr int kCoarseSummaryBlocks = 32;
constexpr int kCoarseMaskBlockN = kMaskBlockN * kCoarseSummaryBlocks;

// The head dim of the tiles a call's head dim runs on, in either kernel family:
// its own, or a wider instantiation's, as FlashAttention-2 and -3 run head dims
// between their instantiated ones: 80 on 96's. The columns past 80 are zero on
// load (the FA2-class copies zero-fill them, TMA fills what lies outside the
// tensor), so they add nothing to Q K^T and give columns of O, dQ, dK and dV
// that are never stored; the work is 96's.
constexpr int kPaddedHeadDim = 80;
constexpr int tile_head_dim(int head_dim) { return head_dim == kPaddedHeadDim ? 96 : head_dim; }
// Whether an instantiation has the padded kernels beside its own (kPadded).
template <int kKernelHeadDim>
constexpr bool takes_padded_head_dims() {
  return tile_head_dim(kPaddedHeadDim) == kKernelHeadDim;
}

// The shared memory a block may opt into decides some tiles: kDefault fits the
// A100 class (163 KB; the Hopper GPUs allow 227 KB), k99K the 99 KB of compute
// capability 8.6/8.9 (RTX 30x0/40x0, A10, A40, L4, L40). A kernel has k99K tiles
// of its own only where its default ones need more than 99 KB (the launch
// picks, flashmask_launch.cuh); elsewhere both classes name the same tiles.
enum class SmemClass { kDefault, k99K };

template <int kHeadDim_, typename Element_, SmemClass kClass = SmemClass::kDefault>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  // Up to 128: 4 warps, each owning kMTiles = 2 x 16 query rows, so every K/V
  // fragment read from shared memory feeds 2 MMAs (half the shared-memory
  // traffic per FLOP). 256: O alone is 128 registers a thread per 16 rows, so
  // 8 warps of 16 rows (FlashAttention-2's 128 x 64 tile for 256 on the A100:
  // 129 KB, one CTA an SM); in 99 KB, 4 warps of 16 rows (97 KB, FA2's 64 x 64
  // for 256 on sm86/sm89).
  static constexpr int kNWarps = kHeadDim_ <= 128 || kClass == SmemClass::k99K ? 4 : 8;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kMTiles = kHeadDim_ <= 128 ? 2 : 1;
  static constexpr int kBlockM = 16 * kMTiles * kNWarps;
  static constexpr int kBlockN = kMaskBlockN;
  static constexpr int kSmemQ = kBlockM * kHeadDim;   // elements
  static constexpr int kSmemKV = kBlockN * kHeadDim;  // elements, K or V
  // Q, K, V and the staged column bounds. K and V have one buffer each: V[n]
  // loads under S = QK^T and K[next] under O += PV (the FA2 schedule).
  static constexpr int kSmemBytes = (kSmemQ + 2 * kSmemKV) * 2 + kBlockN * 4 * 4;
  static_assert(kHeadDim % 32 == 0 && (kHeadDim <= 128 || kHeadDim == 256), "head dim 32, 64, 96, 128 or 256");
};

template <int kHeadDim_, typename Element_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  // 8 warps x 16 keys: a 128-key CTA halves the dQ atomics and the Q/dO
  // shared-memory loads per FLOP against a 64-key one.
  static constexpr int kNWarps = 8;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kBlockN = 16 * kNWarps;  // keys per CTA (two mask summary blocks)
  static constexpr int kBlockM = 64;            // query rows per iteration
  // dQ += dS K: the 4 row tiles of 16 x kNWarps / 4 slices of the head dim.
  static constexpr int kDQRowTiles = kBlockM / 16;
  static constexpr int kDQDimSplit = kNWarps / kDQRowTiles;
  static constexpr int kSmemQ = kBlockM * kHeadDim;
  static constexpr int kSmemKV = kBlockN * kHeadDim;
  static constexpr int kSmemDS = kBlockN * kBlockM;
  // K, V, double-buffered Q and dO, dS^T, double-buffered lse/delta rows and
  // the column bounds.
  static constexpr int kSmemBytes =
      (2 * kSmemKV + 4 * kSmemQ + kSmemDS) * 2 + 4 * kBlockM * 4 + kBlockN * 4 * 4;
  static_assert(kBlockN % kMaskBlockN == 0, "key tile spans whole mask summary blocks");
  static_assert(kNWarps % kDQRowTiles == 0 && (kHeadDim / 16) % kDQDimSplit == 0, "dQ split");
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 128, "head dim 32, 64, 96 or 128");
};

// The FA2-layout backward (flashmask_bwd_staged_kernel.cuh): 8 warps
// re-split per GEMM, 64 query rows per step (128 at head dim 64), P and dS
// staged in shared memory; FlashAttention-2's tiles for these head dims on the
// A100. Up to 128: 128 keys a CTA, S/dP split 2 (rows) x 4 (keys), dV/dK 4
// (keys) x 2 (head dim), Q double- and dO single-buffered (147 KB at 128). At
// 64, FA2's 128 x 128 step: a 64-row step's K-dim of 64 left its fixed costs
// (three barriers, the row statistics, the live-block scan) and its K/V
// fragment loads on half the MMAs (148 KB; the 99 KB tiles keep 64 rows). 256: 64 keys,
// S/dP 4 x 2, dV/dK 2 x 4 (dK and dV are 64 registers each), and Q
// single-buffered too (146 KB; double, 178 KB would exceed the A100's 163).
// In 99 KB, 64 keys with Q double-buffered: at 128 with 256's splits (98 KB),
// at 96 with dV/dK split 4 (keys) x 2 (head dim), 16 keys x 48 head dims a
// warp, since 2 x 4 would leave 24 head dims, not whole m16n16 blocks (78 KB).
template <int kHeadDim_, typename Element_, SmemClass kClass = SmemClass::kDefault>
struct BwdStagedTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kWide = kHeadDim_ > 128;
  static constexpr bool kNarrowKeys = kWide || (kClass == SmemClass::k99K && kHeadDim_ >= 96);
  static constexpr int kNWarps = 8;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kBlockN = kNarrowKeys ? 64 : 128;
  static constexpr bool kTallSteps = kHeadDim_ == 64 && kClass == SmemClass::kDefault;
  static constexpr int kBlockM = kTallSteps ? 128 : 64;  // a whole number of row_stats blocks and dQ tiles
  static constexpr int kSWarpsM = kNarrowKeys ? 4 : 2;  // S/dP warps along the rows
  static constexpr int kVWarpsN = kNarrowKeys && kHeadDim_ != 96 ? 2 : 4;  // dV/dK warps along the keys
  // dQ's warps along the rows: 2 (kBlockM / 2 rows x D / 4 each) where D / 4
  // is whole m16n16 blocks (128, 256, and 64 in 64-row steps), else 4
  // (kBlockM / 4 rows x D / 2; head dim 64's 128-row steps too, as FlashAttention-2
  // splits them: 32 rows x 32 dims a warp read a fifth less of dS and K than 64 x 16).
  static constexpr int kDQWarpsM = !kTallSteps && (kHeadDim / 4) % 16 == 0 ? 2 : 4;
  static constexpr int kQStages = kWide ? 1 : 2;
  // The next query block's Q/dO copies without a branch around them (past the
  // last block they copy zero bytes), so that ptxas interleaves their address
  // arithmetic with the GEMM after them. H200, backward: head dim 96 +3-5% on
  // every 8K cell (its 99 KB tiles +1.5-4%), 128 +0-1% (its 99 KB tiles -0.6
  // to -1.4%: those keep the branch). At 64 and 256 they moved nothing and
  // spilled (4 and 20-24 bytes): those keep it too (NOTES.md, forty-eighth session).
  static constexpr bool kUnbranchedNextCopies =
      kHeadDim_ == 96 || (kHeadDim_ == 128 && kClass == SmemClass::kDefault);
  static constexpr int kSmemQ = kBlockM * kHeadDim;   // elements, Q (each buffer) or dO
  static constexpr int kSmemKV = kBlockN * kHeadDim;  // elements, K or V
  static constexpr int kSmemPS = kBlockM * kBlockN;   // elements, P or dS
  // K, V, Q buffers, dO, P, dS, 2 x (LSE, delta) rows and the column bounds.
  static constexpr int kSmemBytes =
      (2 * kSmemKV + (kQStages + 1) * kSmemQ + 2 * kSmemPS) * 2 + 4 * kBlockM * 4 + kBlockN * 4 * 4;
  static_assert(kBlockN % kMaskBlockN == 0, "key tile spans whole mask summary blocks");
  static_assert(kHeadDim % 32 == 0 && (kHeadDim <= 128 || kHeadDim == 256), "head dim 32, 64, 96, 128 or 256");
};

// The deterministic backward's dQ kernel (flashmask_bwd_dq_kernel.cuh): the
// forward's tiling (query rows per CTA, key blocks inside the 64-column mask
// summary blocks) with one m-tile per warp, since S, dP and dQ accumulators
// all live in registers (at D=128: 32 + 32 + 64 per thread). At D=256 dQ
// alone is 128 registers, so 32-key blocks (S + dP 32 registers; 96 KB of
// shared memory: Q and dO 32 KB each, K and V 16 KB each).
template <int kHeadDim_, typename Element_>
struct BwdDQTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kMTiles = 1;
  static constexpr int kBlockM = 16 * kMTiles * kNWarps;
  // Keys per block: a whole mask summary block up to 128, half of one at 256
  // (the kernel classifies a block by the summary block it lies in).
  static constexpr int kBlockN = kHeadDim_ <= 128 ? kMaskBlockN : kMaskBlockN / 2;
  // Resident CTAs per SM the register allocation aims at: 3 (<= 168 registers)
  // fits D=32/64 without spills; D=96 needs 196 registers (32 bytes of spills
  // at 168), D=128 ~214 and D=256 (dQ 128 + S/dP 32) more, so 2.
  static constexpr int kMinBlocksPerSM = kHeadDim_ >= 96 ? 2 : 3;
  static constexpr int kSmemQ = kBlockM * kHeadDim;   // elements, Q or dO
  static constexpr int kSmemKV = kBlockN * kHeadDim;  // elements, K or V
  // Q, dO, K, V (one buffer each) and the staged column bounds.
  static constexpr int kSmemBytes = (2 * kSmemQ + 2 * kSmemKV) * 2 + kBlockN * 4 * 4;
  static_assert(kMaskBlockN % kBlockN == 0, "a key block lies inside one mask summary block");
  static_assert(kHeadDim % 32 == 0 && (kHeadDim <= 128 || kHeadDim == 256), "head dim 32, 64, 96, 128 or 256");
};

// GPUs of compute capability 8.6/8.9 (RTX 30x0/40x0, A10, A40, L4, L40) allow
// 99 KB of shared memory a block. Where a kernel's default tiles need more, the
// launch takes its k99K tiles (flashmask_launch.cuh), and refuses the kernels
// that have none (allow_large_smem). Python refuses the same calls first, with
// the head dims listed in paddle_flashmask/validation.py
// (FA2_FORWARD_BEYOND_99K, FA2_BACKWARD_BEYOND_99K), since Paddle 2.6 cannot
// carry the op's C++ error back: these asserts keep both lists true.
constexpr int kSmem99KOptin = 101376;
// The static shared memory the FA2-class kernels add to Traits::kSmemBytes (ptxas: 128 B).
constexpr int kStaticSmemBytes = 128;
template <typename Traits>
constexpr bool fits_99k() {
  return Traits::kSmemBytes + kStaticSmemBytes <= kSmem99KOptin;
}
// Whether a kernel runs on the 99 KB GPUs with its default tiles or its k99K ones.
template <template <int, typename, SmemClass> class Traits, int kHeadDim>
constexpr bool runs_in_99k() {
  return fits_99k<Traits<kHeadDim, float, SmemClass::kDefault>>() ||
         fits_99k<Traits<kHeadDim, float, SmemClass::k99K>>();
}
static_assert(runs_in_99k<FwdTraits, 32>() && runs_in_99k<FwdTraits, 64>() && runs_in_99k<FwdTraits, 96>() &&
                  runs_in_99k<FwdTraits, 128>() && runs_in_99k<FwdTraits, 256>(),
              "the forward runs in 99 KB at every head dim: update validation.FA2_FORWARD_BEYOND_99K");
static_assert(runs_in_99k<BwdStagedTraits, 32>() && runs_in_99k<BwdStagedTraits, 64>() &&
                  runs_in_99k<BwdStagedTraits, 96>() && runs_in_99k<BwdStagedTraits, 128>() &&
                  !runs_in_99k<BwdStagedTraits, 256>() && fits_99k<BwdDQTraits<256, float>>() &&
                  fits_99k<BwdDQTraits<128, float>>(),
              "the backward beyond 99 KB at head dim 256 only: update validation.FA2_BACKWARD_BEYOND_99K");
// The k99K tiles exist where the default ones do not fit: 256's forward, 64's, 96's and 128's backward.
static_assert(!fits_99k<FwdTraits<256, float>>() && !fits_99k<BwdStagedTraits<64, float>>() &&
                  !fits_99k<BwdStagedTraits<96, float>>() && !fits_99k<BwdStagedTraits<128, float>>(),
              "k99K tiles only where the default ones exceed 99 KB");

}  // namespace cuda
}  // namespace flashmask
