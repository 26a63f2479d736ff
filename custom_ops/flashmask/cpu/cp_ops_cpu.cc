// Context-parallel helper ops on the CPU (cp_ops.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../cp_ops.h"
#include "numeric.h"
#include "parallel.h"

namespace flashmask {
namespace {

using cpu::BFloat16;
using cpu::Half;
using cpu::parallel_for;

// Elements per parallel_for item of the elementwise passes: large enough that
// scheduling costs nothing, small enough to spread a few MB over the cores.
constexpr int64_t kChunkElems = 1 << 16;

// Calls fn(static_cast<T*>(nullptr)) with T the storage type of dtype.
template <typename Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(static_cast<float*>(nullptr));
    case DType::kFloat16:
      return fn(static_cast<Half*>(nullptr));
    case DType::kBFloat16:
      return fn(static_cast<BFloat16*>(nullptr));
  }
  throw std::invalid_argument("cp ops: unsupported dtype");
}

}  // namespace

void cp_remap_indices_cpu(const CpRemapParams& p) {
  for (int64_t jj = 0; jj < p.num_keys; ++jj) {
    if ((p.key_rows[jj] < 0 && p.key_rows[jj] != kCpNoKey) || p.key_rows[jj] >= p.seqlen) {
      throw std::invalid_argument("cp_remap_indices: key_rows[" + std::to_string(jj) + "] = " +
                                  std::to_string(p.key_rows[jj]) + " is outside [0, " +
                                  std::to_string(p.seqlen) + ") and not -1 (a padding slot)");
    }
  }
  const int64_t columns = p.batch * p.heads * p.num_keys;
  const int64_t items = (columns + kChunkElems - 1) / kChunkElems;
  parallel_for(items, 0, [&](int64_t item, int) {
    const int64_t end = std::min(columns, (item + 1) * kChunkElems);
    for (int64_t c = item * kChunkElems; c < end; ++c) {
      const int64_t jj = c % p.num_keys, bh = c / p.num_keys;
      const int64_t g = p.key_rows[jj];
      const int32_t* col =
          p.indices == nullptr || g == kCpNoKey ? nullptr : p.indices + (bh * p.seqlen + g) * p.num_cols;
      cp_remap_column(p, col, g, p.out + c * p.out_cols);
    }
  });
}

void cp_merge_cpu(const CpMergeParams& p) {
  dispatch_float(p.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* oa = static_cast<const T*>(p.out_a);
    const T* ob = static_cast<const T*>(p.out_b);
    T* out = static_cast<T*>(p.out);
    // row = (batch, position): its heads' outputs lie next to each other.
    auto merge_row = [&](int64_t row) {
      const int64_t b = row / p.seqlen, i = row % p.seqlen;
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t l = (b * p.heads + h) * p.seqlen + i;
        const int64_t o = (row * p.heads + h) * p.head_dim;
        const float la = p.lse_a[l], lb = p.lse_b[l];
        // A NaN LSE (a part's row that met a NaN) stays NaN; std::max would drop it.
        const float m = std::isnan(la) || std::isnan(lb) ? la + lb : std::max(la, lb);
        if (m == -std::numeric_limits<float>::infinity()) {
          p.lse[l] = m;
          for (int64_t d = 0; d < p.head_dim; ++d) out[o + d] = cpu::from_float<T>(0.f);
          continue;
        }
        const float wa = std::exp(la - m), wb = std::exp(lb - m), s = wa + wb;
        p.lse[l] = m + std::log(s);
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const float v = (wa * cpu::to_float(oa[o + d]) + wb * cpu::to_float(ob[o + d])) / s;
          out[o + d] = cpu::from_float<T>(v);
        }
      }
    };
    const int64_t rows = p.batch * p.seqlen;
    const int64_t per_item =
        std::max<int64_t>(1, kChunkElems / std::max<int64_t>(1, p.heads * p.head_dim));
    parallel_for((rows + per_item - 1) / per_item, 0, [&](int64_t item, int) {
      const int64_t end = std::min(rows, (item + 1) * per_item);
      for (int64_t row = item * per_item; row < end; ++row) merge_row(row);
    });
  });
}

void cp_accumulate_cpu(DType dtype, const void* a, const void* b, void* out, int64_t n,
                       int64_t pieces) {
  dispatch_float(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    T* z = static_cast<T*>(out);
    parallel_for((n + kChunkElems - 1) / kChunkElems, 0, [&](int64_t item, int) {
      const int64_t end = std::min(n, (item + 1) * kChunkElems);
      for (int64_t e = item * kChunkElems; e < end; ++e) {
        float sum = cpu::to_float(x[e]);
        for (int64_t p = 0; p < pieces; ++p) sum += cpu::to_float(y[p * n + e]);
        z[e] = cpu::from_float<T>(sum);
      }
    });
  });
}

void cp_gather_units_cpu(const void* x, int64_t x_units, const int64_t* src, int64_t n,
                         int64_t unit_bytes, void* out) {
  for (int64_t u = 0; u < n; ++u) {
    if (src[u] < kCpZeroUnit || src[u] >= x_units) {
      throw std::invalid_argument("cp_gather_units: src[" + std::to_string(u) + "] = " +
                                  std::to_string(src[u]) + " is outside [0, " +
                                  std::to_string(x_units) + ") (and not " +
                                  std::to_string(kCpZeroUnit) + ", a zero unit)");
    }
  }
  const char* from = static_cast<const char*>(x);
  char* to = static_cast<char*>(out);
  // Items of about kChunkElems x 4 bytes, whole units each.
  const int64_t per_item = std::max<int64_t>(1, kChunkElems * 4 / std::max<int64_t>(unit_bytes, 1));
  parallel_for((n + per_item - 1) / per_item, 0, [&](int64_t item, int) {
    const int64_t end = std::min(n, (item + 1) * per_item);
    for (int64_t u = item * per_item; u < end; ++u) {
      if (src[u] == kCpZeroUnit) {
        std::memset(to + u * unit_bytes, 0, size_t(unit_bytes));
      } else {
        std::memcpy(to + u * unit_bytes, from + src[u] * unit_bytes, size_t(unit_bytes));
      }
    }
  });
}

void cp_concat_cpu(const CpConcatParams& p) {
  int64_t total = 0;
  for (int i = 0; i < p.pieces; ++i) total += p.lens[i];
  char* out = static_cast<char*>(p.out);
  int64_t offset = 0;
  for (int i = 0; i < p.pieces; ++i) {
    const int64_t bytes = p.lens[i] * p.inner_bytes;
    const char* x = static_cast<const char*>(p.xs[i]);
    const int64_t at = offset;
    parallel_for(p.outer, 0, [&](int64_t o, int) {
      if (bytes) std::memcpy(out + (o * total + at) * p.inner_bytes, x + o * bytes, size_t(bytes));
    });
    offset += p.lens[i];
  }
}

}  // namespace flashmask
