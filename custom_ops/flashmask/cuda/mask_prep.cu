// Small kernels around the attention kernels: the FlashMask block summary,
// sliding-window indices, index validation, the backward's row statistics
// (rowsum(dO * O)) and the fp32 -> output conversion of the gradients (with
// the fixed-order GQA reduction of the deterministic mode).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "../flashmask_api.h"
#include "../mask_bounds.h"
#include "cuda_check.h"
#include "dq_tile_layout.h"
#include "kernel_traits.h"
#include "workspace.h"
#include "mma_utils.cuh"

namespace flashmask {
namespace cuda {
namespace {

// The summaries' groups a CTA's items fall in (rows, or coarse runs of
// kCoarseSummaryBlocks): reduced in shared memory, one slot set per group the
// CTA spans (at most one per item: summary_groups_spanned), then flushed by
// atomicMin into the global slots.
struct GroupSlots {
  int (*cta)[kEncodedBoundsInts];  // [groups spanned][kEncodedBoundsInts], shared memory
  SummaryGroupSpan span;
  int* global;                     // the group table, encoded (mask_row_aggregates, ...)

  __device__ void reset(int tid, int threads) const {
    for (int i = tid; i < span.count * kEncodedBoundsInts; i += threads) {
      cta[i / kEncodedBoundsInts][i % kEncodedBoundsInts] = 0x7fffffff;
    }
  }
  __device__ void add(int64_t group, const int* encoded) const {
#pragma unroll
    for (int i = 0; i < kEncodedBoundsInts; ++i) atomicMin(&cta[group - span.first][i], encoded[i]);
  }
  __device__ void flush(int tid, int threads) const {
    for (int i = tid; i < span.count * kEncodedBoundsInts; i += threads) {
      const int g = i / kEncodedBoundsInts, f = i % kEncodedBoundsInts;
      atomicMin(global + (span.first + g) * kEncodedBoundsInts + f, cta[g][f]);
    }
  }
};

// One thread per (mask batch, mask head, key block): min/max of its bounds,
// then merged into its row's aggregate (mask_row_aggregates) and its coarse
// summary (mask_coarse_summaries), both encoded as minima (encode_block_bounds;
// their slots start at the identity). A CTA's threads meet in shared memory
// first, so a group of n blocks takes about n / kBoundsThreads global atomics a
// slot.
constexpr int kBoundsThreads = 128;  // so a CTA's items span at most this many groups of either kind

__global__ void __launch_bounds__(kBoundsThreads)
block_bounds_kernel(MaskParams mask, int num_mask_batches, int seqlen_q, int seqlen_k, int k_blocks,
                    BlockBounds* out, int* aggregates, int* coarse) {
  __shared__ int row_slots[kBoundsThreads][kEncodedBoundsInts];
  __shared__ int coarse_slots[kBoundsThreads][kEncodedBoundsInts];
  const int64_t first_item = int64_t(blockIdx.x) * blockDim.x;
  const int64_t item = first_item + threadIdx.x;
  const int64_t total = int64_t(num_mask_batches) * mask.num_heads * k_blocks;
  const int64_t items_here = total - first_item < int64_t(blockDim.x) ? total - first_item : int64_t(blockDim.x);
  const GroupSlots rows{row_slots, summary_groups_spanned(first_item, items_here, k_blocks, k_blocks), aggregates};
  const GroupSlots runs{coarse_slots,
                        summary_groups_spanned(first_item, items_here, k_blocks, kCoarseSummaryBlocks), coarse};
  rows.reset(threadIdx.x, blockDim.x);
  runs.reset(threadIdx.x, blockDim.x);
  __syncthreads();
  if (item < total) {
    const int block = int(item % k_blocks);
    const int head = int((item / k_blocks) % mask.num_heads);
    const int batch = int(item / (int64_t(k_blocks) * mask.num_heads));
    const int32_t* cols =
        mask.startend_row_indices + batch * mask.batch_stride + head * mask.head_stride;
    BlockBounds s = empty_block_bounds();
    const int end = min(seqlen_k, (block + 1) * kMaskBlockN);
    for (int j = block * kMaskBlockN; j < end; ++j) {
      extend_block_bounds(
          s, load_column_bounds(cols + int64_t(j) * mask.col_stride, mask.num_cols, mask.causal,
                                seqlen_q));
    }
    out[item] = s;
    int encoded[kEncodedBoundsInts];
    encode_block_bounds(s, encoded);
    rows.add(summary_group_of(item, k_blocks, k_blocks), encoded);
    runs.add(summary_group_of(item, k_blocks, kCoarseSummaryBlocks), encoded);
  }
  __syncthreads();
  rows.flush(threadIdx.x, blockDim.x);
  runs.flush(threadIdx.x, blockDim.x);
}

__global__ void window_kernel(int32_t* dst, int seqlen_q, int seqlen_k, bool causal, int left,
                              int right) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= seqlen_k) return;
  const int cols = causal ? 1 : 2;
  dst[int64_t(j) * cols] = int32_t(min(int64_t(j) + left + 1, int64_t(seqlen_q)));
  if (!causal) {
    const int64_t ute = int64_t(j) - right;
    dst[int64_t(j) * cols + 1] = int32_t(ute < 0 ? 0 : (ute > seqlen_q ? seqlen_q : ute));
  }
}

__global__ void check_indices_kernel(const int32_t* indices, int64_t num_columns, int num_cols,
                                     bool causal, int seqlen_q, int32_t* flags) {
  const bool has_lower_end = num_cols == 4 || (causal && num_cols == 2);
  int32_t local = 0;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < num_columns;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int32_t* col = indices + c * num_cols;
    for (int k = 0; k < num_cols; ++k) {
      if (col[k] < 0) local |= kIndexBelowZero;
      if (col[k] > seqlen_q) local |= kIndexAboveSeqlenQ;
    }
    if (has_lower_end && col[0] > col[1]) local |= kLowerStartAfterEnd;
    if (num_cols == 4 && col[2] > col[3]) local |= kUpperStartAfterEnd;
  }
  if (local) atomicOr(flags, local);
}

// kVec consecutive elements, loaded or stored as one access.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T x[kVec];
};

// delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d] (d over the value
// head dim), kLanes lanes per
// row (32 / kLanes rows per warp and pass), kVec elements per load. A grid of
// a few waves strides over the rows so that every SM keeps many rows' loads in
// flight: one warp per row and a block per 8 rows was latency-bound (v9's one
// extra LSE load per row cost 0.1 ms at 32K). The same lanes write the row's
// row_stats for the main backward kernels.
template <typename T, int kVec, int kLanes>
__global__ void softmax_d_kernel(BwdParams p) {
  static_assert(32 % kLanes == 0, "a row's lanes lie in one warp");
  constexpr int kRowsPerWarp = 32 / kLanes;
  const int lane = threadIdx.x % 32;
  const int sub = lane % kLanes;  // this lane's part of its row
  const int64_t rows = int64_t(p.batch) * p.num_heads * p.seqlen_q;
  const int64_t first_warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t num_warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int64_t padded = bwd_padded_rows(p.seqlen_q);
  const int64_t plane = int64_t(p.batch) * p.num_heads * padded;
  // `base` is uniform over the warp, so every lane runs the shuffles below.
  for (int64_t base = first_warp * kRowsPerWarp; base < rows; base += num_warps * kRowsPerWarp) {
    const int64_t row_id = base + lane / kLanes;
    const bool active = row_id < rows;
    const int i = int(row_id % p.seqlen_q);
    const int h = int((row_id / p.seqlen_q) % p.num_heads);
    const int b = int(row_id / (int64_t(p.seqlen_q) * p.num_heads));
    // The row's LSE for row_stats, loaded before the O/dO loads so their
    // latencies overlap.
    const float lse = active && p.row_stats != nullptr && sub == 0 ? p.softmax_lse[row_id] : 0.f;
    float sum = 0.f;
    const int dim_v = p.value_head_dim();
    if (active) {
      const T* o = static_cast<const T*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride +
                   h * p.o_head_stride;
      const T* g = static_cast<const T*>(p.dout) + b * p.do_batch_stride + i * p.do_row_stride +
                   h * p.do_head_stride;
      for (int d = sub * kVec; d < dim_v; d += kLanes * kVec) {
        const Pack<T, kVec> ov = *reinterpret_cast<const Pack<T, kVec>*>(o + d);
        const Pack<T, kVec> gv = *reinterpret_cast<const Pack<T, kVec>*>(g + d);
#pragma unroll
        for (int e = 0; e < kVec; ++e) sum += to_float(ov.x[e]) * to_float(gv.x[e]);
      }
    }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (!active) continue;  // the warp's last pass; no shuffle follows
    // softmax_d feeds the deterministic dQ pass only; the main kernels read
    // row_stats.
    if (sub == 0 && p.deterministic) p.softmax_d[row_id] = sum;
    if (p.row_stats != nullptr) {  // the padded copy (BwdParams::row_stats)
      float* stats = p.row_stats + (int64_t(b) * p.num_heads + h) * padded;
      if (sub == 0) {
        stats[i] = lse == -CUDART_INF_F ? CUDART_INF_F : lse * 1.4426950408889634f;
        stats[plane + i] = sum;
      }
      if (i == p.seqlen_q - 1) {  // the last row's lanes fill the padding: P = 0, delta = 0
        for (int64_t k = p.seqlen_q + sub; k < padded; k += kLanes) {
          stats[k] = CUDART_INF_F;
          stats[plane + k] = 0.f;
        }
      }
    }
  }
}

// dst = src * scale over n elements (both contiguous), kVec per thread and step.
template <typename T, int kVec>
__global__ void convert_grad_kernel(const float* src, T* dst, int64_t n, float scale) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; i < n;
       i += int64_t(gridDim.x) * blockDim.x * kVec) {
    const Pack<float, kVec> v = *reinterpret_cast<const Pack<float, kVec>*>(src + i);
    Pack<T, kVec> out;
#pragma unroll
    for (int e = 0; e < kVec; ++e) out.x[e] = from_float<T>(v.x[e] * scale);
    *reinterpret_cast<Pack<T, kVec>*>(dst + i) = out;
  }
}

// dq = dq_accum x scale from the FA2-class backward's tiles
// (BwdParams::dq_accum_tiled, dq_tile_layout.h). One CTA per (64-row tile,
// head, batch): each warp reads two runs of 32 consecutive floats at a time
// (what two REDs of the kernel added: registers e and e + 1 of an m16n8
// fragment, neighbouring columns of the same rows; DQTileLayout::pair_start)
// and places each lane's pair into a shared tile in the output dtype with one
// 4-byte store, which then leaves in 16-byte row chunks (element-wise
// scattered stores made sm90's conversion twice as slow as the bytes it moves;
// flashmask_bwd_sm90_kernel.cuh, dq_tiles_to_dq_kernel). A float a thread and
// step, each with its own 2-byte store, kept the MIO pipe busy at 2.6 TB/s
// (H200: the pairs took the pass from 0.212 to 0.197 ms at 8K; NOTES.md).
constexpr int kDQConvertThreads = 256;
template <typename T, int kDim>
__global__ void __launch_bounds__(kDQConvertThreads) fa2_dq_tiles_to_dq_kernel(BwdParams p) {
  using Layout = DQTileLayout<kDim>;
  constexpr int kRowElems = dq_staging_row_elems(kDim);
  static_assert(Layout::kPairs % kDQConvertThreads == 0, "whole passes over the tile");
  // 64 x (kDim + 8) x 2 bytes: 33792 at head dim 256, within the 48 KB of static shared memory.
  static_assert(Layout::kRows * kRowElems * sizeof(T) <= 48 * 1024, "static shared memory");
  __shared__ __align__(16) T rows[Layout::kRows * kRowElems];
  const int m = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const float* tile = p.dq_accum + dq_tile_offset(batch, head, m, p.num_heads, p.seqlen_q, kDim);
#pragma unroll
  for (int k = 0; k < Layout::kPairs / kDQConvertThreads; ++k) {
    const int i = Layout::pair_start(k * kDQConvertThreads + threadIdx.x);
    const DQTileElement x = Layout::element(i);  // an even column; float i + 32 holds the next one
    *reinterpret_cast<uint32_t*>(&rows[x.row * kRowElems + x.col]) =
        pack2<T>(tile[i] * p.softmax_scale, tile[i + 32] * p.softmax_scale);
  }
  __syncthreads();
  T* dq = static_cast<T*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride;
  // The columns dq has: fewer than the tiles' where the call's head dim runs on them padded.
  const int cols = takes_padded_head_dims<kDim>() ? p.head_dim : kDim;
  write_staged_dq_rows<Layout::kRows, kDim>(dq, p.dq_row_stride, rows, m, p.seqlen_q, cols);
}

// dK/dV from several head slots per kv head: src [rows, Hk * group, D] (fp32
// slots, or the output dtype's per-query-head rows of dkv_direct), dst
// [rows, Hk, D]; each output sums its kv head's `group` slots in fp32 in slot
// order, so the result does not depend on scheduling. kVec elements per thread.
template <typename S, typename T, int kVec>
__global__ void reduce_group_convert_kernel(const S* src, T* dst, int64_t n, int head_dim,
                                            int group, float scale) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; i < n;
       i += int64_t(gridDim.x) * blockDim.x * kVec) {
    const int64_t row_head = i / head_dim;  // (row, kv head), row-major
    const S* s = src + row_head * group * head_dim + i % head_dim;
    Pack<float, kVec> sum{};
    for (int g = 0; g < group; ++g) {
      const Pack<S, kVec> v = *reinterpret_cast<const Pack<S, kVec>*>(s + int64_t(g) * head_dim);
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum.x[e] += to_float(v.x[e]);
    }
    Pack<T, kVec> out;
#pragma unroll
    for (int e = 0; e < kVec; ++e) out.x[e] = from_float<T>(sum.x[e] * scale);
    *reinterpret_cast<Pack<T, kVec>*>(dst + i) = out;
  }
}

int grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return int(blocks < 65535 * 32 ? (blocks > 0 ? blocks : 1) : 65535 * 32);
}

// Blocks of `threads` for a grid-stride pass over `work_items`: a few waves
// of the device at most, so each thread handles several items and the SMs
// keep loads in flight rather than retire a short-lived block per item group.
int streaming_grid(int64_t work_items, int threads) {
  const int64_t wanted = (work_items + threads - 1) / threads;
  return int(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(sm_count()) * 2048 / threads * 2)));
}

bool aligned_to(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Elements per vector access: 8 (16-byte loads of 16-bit rows, 2 x 16 bytes
// of fp32) in the fast paths, 4 in the older ones.
constexpr int kWideVec = 8;
constexpr int kConvertVec = 4;

// softmax_d's loads of O and dO rows as v-element packs.
template <typename T>
bool rows_vectorizable(const BwdParams& p, int v) {
  return p.value_head_dim() % v == 0 && aligned_to(p.out, sizeof(T) * v) && aligned_to(p.dout, sizeof(T) * v) &&
         p.o_row_stride % v == 0 && p.o_head_stride % v == 0 && p.o_batch_stride % v == 0 &&
         p.do_row_stride % v == 0 && p.do_head_stride % v == 0 && p.do_batch_stride % v == 0;
}

template <typename T, int kVec, int kLanes>
void launch_softmax_d(const BwdParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.num_heads * p.seqlen_q;
  softmax_d_kernel<T, kVec, kLanes><<<streaming_grid(rows * kLanes, 256), 256, 0, stream>>>(p);
}

template <typename T>
void launch_softmax_d(const BwdParams& p, cudaStream_t stream) {
  // A row of value head_dim = 8 x lanes elements per 4, 8, 16 or 32 lanes.
  const bool wide = rows_vectorizable<T>(p, kWideVec);
  const int dim_v = p.value_head_dim();
  if (wide && dim_v == 32) {
    launch_softmax_d<T, kWideVec, 4>(p, stream);
  } else if (wide && dim_v == 64) {
    launch_softmax_d<T, kWideVec, 8>(p, stream);
  } else if (wide && dim_v == 128) {
    launch_softmax_d<T, kWideVec, 16>(p, stream);
  } else if (wide && dim_v == 256) {
    launch_softmax_d<T, kWideVec, 32>(p, stream);
  } else if (rows_vectorizable<T>(p, kConvertVec)) {
    launch_softmax_d<T, kConvertVec, 32>(p, stream);
  } else {
    launch_softmax_d<T, 1, 32>(p, stream);
  }
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_convert(const float* src, void* dst, int64_t n, float scale, cudaStream_t stream) {
  if (n % kWideVec == 0 && aligned_to(src, 32) && aligned_to(dst, sizeof(T) * kWideVec)) {
    convert_grad_kernel<T, kWideVec><<<streaming_grid(n / kWideVec, 256), 256, 0, stream>>>(
        src, static_cast<T*>(dst), n, scale);
  } else {
    convert_grad_kernel<T, 1><<<grid_for(n, 256), 256, 0, stream>>>(src, static_cast<T*>(dst), n, scale);
  }
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

// dq from the FA2-class backward's dQ tiles, one CTA per tile; the tiles have
// the kernel's head dim (tile_head_dim), dq the call's.
template <typename T>
void launch_fa2_dq_tiles_to_dq(const BwdParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned(bwd_padded_rows(p.seqlen_q) / kBwdRowBlock), p.num_heads, p.batch);
  switch (tile_head_dim(p.head_dim)) {
    case 32: fa2_dq_tiles_to_dq_kernel<T, 32><<<grid, kDQConvertThreads, 0, stream>>>(p); break;
    case 64: fa2_dq_tiles_to_dq_kernel<T, 64><<<grid, kDQConvertThreads, 0, stream>>>(p); break;
    case 96: fa2_dq_tiles_to_dq_kernel<T, 96><<<grid, kDQConvertThreads, 0, stream>>>(p); break;
    case 128: fa2_dq_tiles_to_dq_kernel<T, 128><<<grid, kDQConvertThreads, 0, stream>>>(p); break;
    case 256: fa2_dq_tiles_to_dq_kernel<T, 256><<<grid, kDQConvertThreads, 0, stream>>>(p); break;
    default:
      throw std::logic_error("flashmask backward: no FA2-class dQ tiles at head_dim " + std::to_string(p.head_dim));
  }
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename S>
void launch_reduce_group(const S* src, void* dst, int64_t n, int head_dim, int group, float scale,
                         cudaStream_t stream) {
  if (head_dim % kConvertVec == 0 && aligned_to(src, sizeof(S) * kConvertVec) &&
      aligned_to(dst, sizeof(T) * kConvertVec)) {
    reduce_group_convert_kernel<S, T, kConvertVec><<<grid_for(n / kConvertVec, 256), 256, 0, stream>>>(
        src, static_cast<T*>(dst), n, head_dim, group, scale);
  } else {
    reduce_group_convert_kernel<S, T, 1><<<grid_for(n, 256), 256, 0, stream>>>(
        src, static_cast<T*>(dst), n, head_dim, group, scale);
  }
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

// dK/dV accumulator plan check (see BwdParams and plan_bwd_cuda).
void check_accum_heads(const BwdParams& p) {
  const int group = p.num_heads / p.num_heads_k;
  const int hg = p.bwd_head_group;
  const bool one_writer = p.accum_heads_k > 0 && int64_t(p.accum_heads_k) * hg == p.num_heads;
  // Groups fitted per key block vary from CTA to CTA: kv-head slots, added to.
  const bool fitted = p.fitted_head_groups();
  const bool ok = hg >= 1 && group % hg == 0 && p.bwd_group_max_steps >= 0 &&
                  (one_writer || (!p.deterministic && p.accum_heads_k == p.num_heads_k)) &&
                  (!p.dkv_accum_stored || one_writer) &&
                  (!fitted || (!p.deterministic && !p.dkv_accum_stored && p.accum_heads_k == p.num_heads_k));
  if (p.dkv_heads_expanded() && (p.dk_heads == nullptr || p.dv_heads == nullptr)) {
    throw std::invalid_argument(
        "flashmask backward: dkv_direct with GQA stores dK/dV per query head: allocate dk_heads and dv_heads "
        "(bwd_dkv_heads_elems elements of the output dtype each)");
  }
  if (!ok) {
    throw std::invalid_argument(
        "flashmask backward: inconsistent dK/dV plan (bwd_head_group " + std::to_string(hg) +
        ", bwd_group_max_steps " + std::to_string(p.bwd_group_max_steps) + ", accum_heads_k " +
        std::to_string(p.accum_heads_k) + "); fill it with plan_bwd_cuda");
  }
}

template <typename T>
void bwd_pre_post(const BwdParams& p, cudaStream_t stream, bool pre) {
  const int64_t q_elems = int64_t(p.batch) * p.seqlen_q * p.num_heads * p.head_dim;
  const int dim_v = p.value_head_dim();
  const int64_t k_elems = int64_t(p.batch) * p.seqlen_k * p.num_heads_k * p.head_dim;
  const int64_t v_elems = k_elems / p.head_dim * dim_v;
  if (pre) {
    check_accum_heads(p);
    // Else the kernel stores every element, or (fitted sm90 grouping) the
    // count pass zeroes the slots its CTAs will add into (bwd_fitted_heads_kernel).
    if (!p.dkv_accum_stored && !p.dkv_direct && dkv_written_flags(p) == nullptr) {
      const int64_t k_accum_elems = k_elems / p.num_heads_k * p.accum_heads_k;
      const int64_t v_accum_elems = v_elems / p.num_heads_k * p.accum_heads_k;
      FLASHMASK_CUDA_CHECK(cudaMemsetAsync(p.dk_accum, 0, k_accum_elems * sizeof(float), stream));
      FLASHMASK_CUDA_CHECK(cudaMemsetAsync(p.dv_accum, 0, v_accum_elems * sizeof(float), stream));
    }
    // Deterministic: run_bwd_dq_ writes every dq_accum element, nothing adds,
    // so it needs no zeroing. Tiles (the main kernels add into them): one
    // contiguous memset, padding rows included.
    if (p.dq_accum_tiled) {
      FLASHMASK_CUDA_CHECK(cudaMemsetAsync(p.dq_accum, 0, bwd_dq_accum_elems(p) * sizeof(float), stream));
    }
    launch_softmax_d<T>(p, stream);
    return;
  }
  // dQ rows (deterministic pass) or FA2-class tiles; the sm90 launch
  // converted its tiles after its kernel.
  if (!p.dq_accum_tiled) {
    launch_convert<T>(p.dq_accum, p.dq, q_elems, p.softmax_scale, stream);
  } else if (p.gpu_kernel != GpuKernel::kSm90) {
    launch_fa2_dq_tiles_to_dq<T>(p, stream);
  }
  const int group = p.accum_heads_k / p.num_heads_k;
  if (dkv_written_flags(p) != nullptr) {
    // Fitted sm90 grouping: the launch's finish kernel converted the key
    // blocks left in their slots (sm90::bwd_finish_kernel).
  } else if (p.dkv_heads_expanded()) {
    // The main kernel stored every query head's dK (scaled) and dV: sum each kv head's.
    const int heads_per_kv = p.num_heads / p.num_heads_k;
    launch_reduce_group<T>(static_cast<const T*>(p.dk_heads), p.dk, k_elems, p.head_dim, heads_per_kv, 1.f, stream);
    launch_reduce_group<T>(static_cast<const T*>(p.dv_heads), p.dv, v_elems, dim_v, heads_per_kv, 1.f, stream);
  } else if (p.dkv_direct) {
    // The main kernel stored dk/dv itself.
  } else if (group == 1) {
    launch_convert<T>(p.dk_accum, p.dk, k_elems, p.softmax_scale, stream);
    launch_convert<T>(p.dv_accum, p.dv, v_elems, 1.f, stream);
  } else {
    launch_reduce_group<T>(p.dk_accum, p.dk, k_elems, p.head_dim, group, p.softmax_scale, stream);
    launch_reduce_group<T>(p.dv_accum, p.dv, v_elems, dim_v, group, 1.f, stream);
  }
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void compute_block_bounds(const FwdParams& p, cudaStream_t stream) {
  const MaskParams& mask = p.mask;
  if (mask.startend_row_indices == nullptr) return;
  const int k_blocks = summary_blocks(p);
  const int64_t rows = summary_table_rows(p);
  const int64_t total = rows * k_blocks;
  // The row aggregates and the coarse summaries lie one after the other: one memset to their identity.
  int* const aggregates = mask_row_aggregates(p);
  const int64_t groups = rows * (1 + coarse_summaries(p));
  FLASHMASK_CUDA_CHECK(cudaMemsetAsync(aggregates, kEncodedBoundsIdentityByte,
                                       groups * kEncodedBoundsInts * sizeof(int), stream));
  block_bounds_kernel<<<grid_for(total, kBoundsThreads), kBoundsThreads, 0, stream>>>(
      mask, mask_batches(p), p.seqlen_q, p.seqlen_k, k_blocks,
      reinterpret_cast<BlockBounds*>(p.block_bounds), aggregates, mask_coarse_summaries(p));
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

void bwd_prepare(const BwdParams& p, cudaStream_t stream) {
  if (p.dtype == DType::kBFloat16) return bwd_pre_post<__nv_bfloat16>(p, stream, true);
  return bwd_pre_post<__half>(p, stream, true);
}

void bwd_finish(const BwdParams& p, cudaStream_t stream) {
  if (p.dtype == DType::kBFloat16) return bwd_pre_post<__nv_bfloat16>(p, stream, false);
  return bwd_pre_post<__half>(p, stream, false);
}

}  // namespace cuda

namespace cuda {

int64_t summary_elems(const FwdParams& p) {
  if (p.mask.startend_row_indices == nullptr) return 0;
  const int64_t rows = summary_table_rows(p);
  return rows * summary_blocks(p) * int64_t(sizeof(BlockBounds) / 4) +
         rows * (1 + coarse_summaries(p)) * kEncodedBoundsInts;
}

int32_t* tile_counters(const FwdParams& p) { return p.block_bounds + summary_elems(p); }

int64_t dkv_flag_elems(const FwdParams& p) {
  const int key_block = dkv_block(p.head_dim);
  return int64_t(p.batch) * p.num_heads_k * ((p.seqlen_k + key_block - 1) / key_block);
}

int32_t* dkv_written_flags(const BwdParams& p) {
  if (!p.fitted_head_groups() || p.deterministic) return nullptr;
  return tile_counters(p) + kTileCounterInts;
}

int64_t fitted_count_elems(const FwdParams& p) {
  const int key_block = dkv_block(p.head_dim);
  return int64_t(p.batch) * p.num_heads * ((p.seqlen_k + key_block - 1) / key_block);
}

int32_t* fitted_head_counts(const BwdParams& p) {
  if (!p.fitted_head_groups() || p.deterministic) return nullptr;
  return tile_counters(p) + kTileCounterInts + dkv_flag_elems(p);
}

int64_t cta_order_elems(const FwdParams& p) { return 2 * fitted_count_elems(p); }

int32_t* bwd_cta_order(const BwdParams& p) {
  int32_t* const counts = fitted_head_counts(p);
  return counts == nullptr ? nullptr : counts + fitted_count_elems(p);
}

int32_t* bwd_live_block_counts(const BwdParams& p) {
  int32_t* const order = bwd_cta_order(p);
  return order == nullptr ? nullptr : order + fitted_count_elems(p);
}

int64_t finish_counter_elems(const FwdParams& p) { return int64_t(p.batch) * p.num_heads_k + 1; }

int32_t* bwd_finish_counters(const BwdParams& p) {
  return tile_counters(p) + kTileCounterInts + dkv_flag_elems(p) + fitted_count_elems(p) + cta_order_elems(p);
}

int64_t fwd_tile_order_elems(const FwdParams& p) {
  if (p.mask.startend_row_indices == nullptr) return 0;
  const int64_t blocks = (std::max(p.seqlen_q, p.seqlen_k) + 63) / 64;  // fa2_cta_order's too
  const int64_t ranks = int64_t(p.batch) * p.num_heads * blocks;
  return kTileOrderHeaderInts + summary_table_rows(p) * blocks + ranks + (ranks + kFa2OrderChunk - 1) / kFa2OrderChunk;
}

int32_t* fwd_tile_order(const FwdParams& p) {
  if (p.mask.startend_row_indices == nullptr) return nullptr;
  return tile_counters(p) + kTileCounterInts + dkv_flag_elems(p) + fitted_count_elems(p) + cta_order_elems(p) +
         finish_counter_elems(p);
}

}  // namespace cuda

int64_t block_bounds_elems(const FwdParams& p) {
  return cuda::summary_elems(p) + cuda::kTileCounterInts + cuda::dkv_flag_elems(p) + cuda::fitted_count_elems(p) +
         cuda::cta_order_elems(p) + cuda::finish_counter_elems(p) + cuda::fwd_tile_order_elems(p);
}

void fill_window_indices_cuda(int32_t* dst, int seqlen_q, int seqlen_k, bool causal,
                              int window_left, int window_right, void* stream) {
  cuda::window_kernel<<<(seqlen_k + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, seqlen_q, seqlen_k, causal, window_left, window_right);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

void check_indices_cuda(const int32_t* indices, int64_t num_columns, int num_cols, bool causal,
                        int seqlen_q, int32_t* flags, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  FLASHMASK_CUDA_CHECK(cudaMemsetAsync(flags, 0, sizeof(int32_t), s));
  const int blocks = cuda::grid_for(num_columns, 256) < 1024 ? cuda::grid_for(num_columns, 256) : 1024;
  cuda::check_indices_kernel<<<blocks, 256, 0, s>>>(indices, num_columns, num_cols, causal,
                                                    seqlen_q, flags);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmask
