// Context-parallel helper ops on the GPU (cp_ops.h): grid-stride kernels,
// 16-byte vectors where sizes and pointers allow.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "../cp_ops.h"
#include "cuda_check.h"
#include "mma_utils.cuh"

namespace flashmask {
namespace {

// kVec consecutive elements, loaded or stored as one access.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T x[kVec];
};

using cuda::from_float;
using cuda::to_float;

bool aligned_to(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Blocks for a grid-stride pass over `work_items`: a few waves at most.
int streaming_grid(int64_t work_items, int threads) {
  const int64_t wanted = (work_items + threads - 1) / threads;
  return int(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(sm_count()) * 2048 / threads * 2)));
}

constexpr int kThreads = 256;

template <typename Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(static_cast<float*>(nullptr));
    case DType::kFloat16:
      return fn(static_cast<__half*>(nullptr));
    case DType::kBFloat16:
      return fn(static_cast<__nv_bfloat16*>(nullptr));
  }
  throw std::invalid_argument("cp ops: unsupported dtype");
}

// One output column per thread and step.
__global__ void remap_indices_kernel(CpRemapParams p) {
  const int64_t columns = p.batch * p.heads * p.num_keys;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < columns;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t jj = c % p.num_keys, bh = c / p.num_keys;
    int64_t g = p.key_rows[jj];
    if (g != kCpNoKey) g = g < 0 ? 0 : (g >= p.seqlen ? p.seqlen - 1 : g);  // unchecked input: stay in bounds
    const int32_t* col =
        p.indices == nullptr || g == kCpNoKey ? nullptr : p.indices + (bh * p.seqlen + g) * p.num_cols;
    cp_remap_column(p, col, g, p.out + c * p.out_cols);
  }
}

// 2^lanes_log2 threads per (batch, position) row, kVec elements per access
// (kVec divides head_dim, so a vector lies in one head); a thread computes its
// head's weights from the two lse values itself. Only one 64-bit division per
// row and a 32-bit one per vector.
template <typename T, int kVec>
__global__ void merge_kernel(CpMergeParams p, int lanes_log2) {
  const int lanes = 1 << lanes_log2;
  const int sub = threadIdx.x & (lanes - 1);
  const int64_t rows_per_block = blockDim.x >> lanes_log2;
  const int64_t rows = p.batch * p.seqlen;
  const int vecs_per_head = int(p.head_dim / kVec);
  const int vecs_per_row = vecs_per_head * int(p.heads);
  const T* oa = static_cast<const T*>(p.out_a);
  const T* ob = static_cast<const T*>(p.out_b);
  T* out = static_cast<T*>(p.out);
  for (int64_t row = int64_t(blockIdx.x) * rows_per_block + (threadIdx.x >> lanes_log2); row < rows;
       row += int64_t(gridDim.x) * rows_per_block) {
    const int64_t b = row / p.seqlen, i = row - b * p.seqlen;
    for (int v = sub; v < vecs_per_row; v += lanes) {
      const int h = v / vecs_per_head;
      const int64_t l = (b * p.heads + h) * p.seqlen + i;
      const int64_t e = row * p.heads * p.head_dim + int64_t(v) * kVec;
      const float la = p.lse_a[l], lb = p.lse_b[l];
      // A NaN LSE (a part's row that met a NaN) stays NaN; fmaxf would drop it.
      const float m = isnan(la) || isnan(lb) ? la + lb : fmaxf(la, lb);
      const bool first = v == h * vecs_per_head;  // writes the head's lse
      Pack<T, kVec> r;
      if (m == -CUDART_INF_F) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) r.x[k] = from_float<T>(0.f);
        if (first) p.lse[l] = m;
      } else {
        const float wa = expf(la - m), wb = expf(lb - m), s = wa + wb;
        const Pack<T, kVec> va = *reinterpret_cast<const Pack<T, kVec>*>(oa + e);
        const Pack<T, kVec> vb = *reinterpret_cast<const Pack<T, kVec>*>(ob + e);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          r.x[k] = from_float<T>((wa * to_float(va.x[k]) + wb * to_float(vb.x[k])) / s);
        }
        if (first) p.lse[l] = m + logf(s);
      }
      *reinterpret_cast<Pack<T, kVec>*>(out + e) = r;
    }
  }
}

template <typename T, int kVec>
__global__ void accumulate_kernel(const T* a, const T* b, T* out, int64_t n, int64_t pieces) {
  for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; e < n;
       e += int64_t(gridDim.x) * blockDim.x * kVec) {
    const Pack<T, kVec> va = *reinterpret_cast<const Pack<T, kVec>*>(a + e);
    float sum[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum[k] = to_float(va.x[k]);
    for (int64_t p = 0; p < pieces; ++p) {
      const Pack<T, kVec> vb = *reinterpret_cast<const Pack<T, kVec>*>(b + p * n + e);
#pragma unroll
      for (int k = 0; k < kVec; ++k) sum[k] += to_float(vb.x[k]);
    }
    Pack<T, kVec> r;
#pragma unroll
    for (int k = 0; k < kVec; ++k) r.x[k] = from_float<T>(sum[k]);
    *reinterpret_cast<Pack<T, kVec>*>(out + e) = r;
  }
}

// Units of `words` W-sized words: 2^lanes_log2 threads copy one unit
// (strided by that many words), kThreads >> lanes_log2 units per block and
// step, so the index math has no 64-bit division.
template <typename W>
__global__ void gather_units_kernel(const W* x, int64_t x_units, const int64_t* src, int64_t n,
                                    int64_t words, int lanes_log2, W* out) {
  const int lanes = 1 << lanes_log2;
  const int sub = threadIdx.x & (lanes - 1);
  const int64_t units_per_block = blockDim.x >> lanes_log2;
  for (int64_t u = int64_t(blockIdx.x) * units_per_block + (threadIdx.x >> lanes_log2); u < n;
       u += int64_t(gridDim.x) * units_per_block) {
    const int64_t s = src[u];
    W* to = out + u * words;
    if (s < 0 || s >= x_units) {  // kCpZeroUnit, or out of range (cannot throw): a zero unit
      for (int64_t w = sub; w < words; w += lanes) to[w] = W{};
      continue;
    }
    const W* from = x + s * words;
    for (int64_t w = sub; w < words; w += lanes) to[w] = from[w];
  }
}

// The smallest power of two >= per_item (at most a block): the lanes that
// share one row or unit.
int lanes_log2_for(int64_t per_item) {
  int lanes_log2 = 0;
  while ((int64_t(1) << lanes_log2) < per_item && (1 << lanes_log2) < kThreads) ++lanes_log2;
  return lanes_log2;
}

// Blocks for `items` rows or units, kThreads >> lanes_log2 per block and step.
int items_grid(int64_t items, int lanes_log2) {
  const int64_t per_block = kThreads >> lanes_log2;
  return streaming_grid((items + per_block - 1) / per_block * kThreads, kThreads);
}

template <typename T, int kVec>
void launch_merge(const CpMergeParams& p, cudaStream_t stream) {
  const int lanes_log2 = lanes_log2_for(p.heads * p.head_dim / kVec);
  merge_kernel<T, kVec><<<items_grid(p.batch * p.seqlen, lanes_log2), kThreads, 0, stream>>>(
      p, lanes_log2);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

template <typename T, int kVec>
void launch_accumulate(const void* a, const void* b, void* out, int64_t n, int64_t pieces,
                       cudaStream_t stream) {
  accumulate_kernel<T, kVec><<<streaming_grid(n / kVec, kThreads), kThreads, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, pieces);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

template <typename W>
void launch_gather(const void* x, int64_t x_units, const int64_t* src, int64_t n, int64_t unit_bytes,
                   void* out, cudaStream_t stream) {
  const int64_t words = unit_bytes / int64_t(sizeof(W));
  const int lanes_log2 = lanes_log2_for(words);
  gather_units_kernel<W><<<items_grid(n, lanes_log2), kThreads, 0, stream>>>(
      static_cast<const W*>(x), x_units, src, n, words, lanes_log2, static_cast<W*>(out));
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void cp_remap_indices_cuda(const CpRemapParams& p, void* stream) {
  const int64_t columns = p.batch * p.heads * p.num_keys;
  if (columns == 0) return;
  remap_indices_kernel<<<streaming_grid(columns, kThreads), kThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(p);
  FLASHMASK_CUDA_CHECK(cudaGetLastError());
}

void cp_merge_cuda(const CpMergeParams& p, void* stream) {
  const int64_t n = p.batch * p.seqlen * p.heads * p.head_dim;
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_float(p.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);  // 16-byte vectors
    const bool wide = p.head_dim % kVec == 0 && aligned_to(p.out_a, 16) && aligned_to(p.out_b, 16) &&
                      aligned_to(p.out, 16);
    if (wide) {
      launch_merge<T, kVec>(p, s);
    } else {
      launch_merge<T, 1>(p, s);
    }
  });
}

void cp_accumulate_cuda(DType dtype, const void* a, const void* b, void* out, int64_t n,
                        int64_t pieces, void* stream) {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_float(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    if (n % kVec == 0 && aligned_to(a, 16) && aligned_to(b, 16) && aligned_to(out, 16)) {
      launch_accumulate<T, kVec>(a, b, out, n, pieces, s);
    } else {
      launch_accumulate<T, 1>(a, b, out, n, pieces, s);
    }
  });
}

void cp_gather_units_cuda(const void* x, int64_t x_units, const int64_t* src, int64_t n,
                          int64_t unit_bytes, void* out, void* stream) {
  if (n == 0 || unit_bytes == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  // The widest word that divides the unit and both base pointers' alignment.
  auto fits = [&](size_t w) {
    return unit_bytes % int64_t(w) == 0 && aligned_to(x, w) && aligned_to(out, w);
  };
  if (fits(16)) {
    launch_gather<uint4>(x, x_units, src, n, unit_bytes, out, s);
  } else if (fits(8)) {
    launch_gather<uint2>(x, x_units, src, n, unit_bytes, out, s);
  } else if (fits(4)) {
    launch_gather<uint32_t>(x, x_units, src, n, unit_bytes, out, s);
  } else if (fits(2)) {
    launch_gather<uint16_t>(x, x_units, src, n, unit_bytes, out, s);
  } else {
    launch_gather<uint8_t>(x, x_units, src, n, unit_bytes, out, s);
  }
}

void cp_concat_cuda(const CpConcatParams& p, void* stream) {
  int64_t total = 0;
  for (int i = 0; i < p.pieces; ++i) total += p.lens[i];
  auto s = static_cast<cudaStream_t>(stream);
  char* out = static_cast<char*>(p.out);
  int64_t offset = 0;
  // 2D copies take pitches up to cudaDevAttrMaxPitch (2^31 - 1 bytes): a piece of 512K
  // tokens x 32 heads x 128 dims is 4 GiB, so one outer row (or a wider pitch) copies
  // row by row in 1D.
  const int64_t pitch = total * p.inner_bytes;
  const bool two_d = p.outer > 1 && pitch <= int64_t(INT32_MAX);
  for (int i = 0; i < p.pieces; ++i) {
    const int64_t width = p.lens[i] * p.inner_bytes;
    char* dst = out + offset * p.inner_bytes;
    const char* src = static_cast<const char*>(p.xs[i]);
    if (width > 0 && two_d) {
      FLASHMASK_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(pitch), src, size_t(width), size_t(width),
                                             size_t(p.outer), cudaMemcpyDeviceToDevice, s));
    } else if (width > 0) {
      for (int64_t o = 0; o < p.outer; ++o) {
        FLASHMASK_CUDA_CHECK(cudaMemcpyAsync(dst + o * pitch, src + o * width, size_t(width),
                                             cudaMemcpyDeviceToDevice, s));
      }
    }
    offset += p.lens[i];
  }
}

}  // namespace flashmask
