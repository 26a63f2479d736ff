// Thin PTX wrappers for the FA2-class kernels: cp.async (with zero fill),
// ldmatrix, mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate), and the
// element-type helpers. Runs on sm_80 and newer (sm_90 included).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace flashmask {
namespace cuda {

template <typename T>
struct MmaType;
template <>
struct MmaType<__half> {
  static constexpr bool kIsBF16 = false;
};
template <>
struct MmaType<__nv_bfloat16> {
  static constexpr bool kIsBF16 = true;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; bytes beyond src_bytes (0 or 16) are zero.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ldmatrix on a raw shared-memory byte address.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A copy of a shared-memory address the compiler cannot see through: fragment
// addresses derived from it are recomputed where used (a few integer ops)
// instead of being hoisted out of the main loop into dozens of live registers.
__device__ __forceinline__ uint32_t opaque(uint32_t addr) {
  asm volatile("" : "+r"(addr));
  return addr;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

// D = A * B + D for a 16x8x16 tile. a: 4 regs, b: 2 regs, d: 4 floats.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (MmaType<T>::kIsBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one register of two 16-bit values (low half = x).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float x, float y) {
  __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Rows of kDim 16-bit elements in shared memory, 16-byte chunks XOR-swizzled
// so that ldmatrix's 8 row addresses (one chunk of 8 consecutive rows) hit 8
// different bank groups (16 bytes each, 8 per 128 bytes). Rows of 8 or 16
// chunks (head dims 64, 128, 256): chunk ^ (row % 8) within groups of 8. Rows
// of 4 or 12 chunks (head dims 32 and 96) swizzle within groups of 4: there
// rows r and r + 1 start 4 bank groups apart (64 or 192 bytes), so chunk ^
// ((row / 2) % 4) gives the even rows 4 different groups and the odd rows the
// other 4 (with chunk ^ (row % 4), rows r and r + 4 met: 2-way conflicts).
template <int kDim>
struct SwizzledTile {
  static constexpr int kChunks = kDim / 8;
  static_assert(kDim % 32 == 0, "rows of whole 4-chunk groups");
  static constexpr bool kGroupsOf8 = kChunks % 8 == 0;
  __host__ __device__ __forceinline__ static constexpr int offset(int row, int col) {
    const int chunk = col >> 3;
    if constexpr (kGroupsOf8) {
      // 8 or 16 chunks, in the form the head dims 64/128/256 kernels were tuned with.
      return row * kDim + (((chunk ^ (row & 7)) & (kChunks - 1)) << 3) + (col & 7);
    } else {
      const int swizzled = (chunk & ~3) | ((chunk ^ (row >> 1)) & 3);  // 4 or 12 chunks: groups of 4
      return row * kDim + (swizzled << 3) + (col & 7);
    }
  }

  // ldmatrix (and ldmatrix.trans) reads one 16-byte chunk of 8 consecutive
  // rows from an 8-row boundary: a different bank group for each row.
  static constexpr bool ldmatrix_conflict_free() {
    for (int r0 = 0; r0 < 16; r0 += 8)
      for (int chunk = 0; chunk < kChunks; ++chunk) {
        int groups_seen = 0;
        for (int r = r0; r < r0 + 8; ++r) groups_seen |= 1 << ((offset(r, chunk * 8) / 8) % 8);
        if (groups_seen != 0xff) return false;
      }
    return true;
  }

  // Fragment addressing for ldmatrix, whose lane-dependent row is a multiple
  // of 8 plus (lane % 8): along the columns, 16-column step k is step
  // k % kPhases moved right by whole swizzle groups, and along the rows,
  // 8 rows down is 8 x kDim elements on. So a warp keeps kPhases base
  // addresses per operand and reaches every fragment with an immediate offset
  // (the swizzle is not recomputed per load, and no address lives per step).
  static constexpr int kPhases = kGroupsOf8 ? 4 : 2;
  static constexpr int kSteps = kDim / 16;  // 16-column steps of a row
  __host__ __device__ __forceinline__ static constexpr int step_shift(int k) {
    return (k / kPhases) * kPhases * 16;
  }

  // Compile-time proof of the two identities above, over every row residue,
  // 16-column origin (a warp's slice of the row), step and 8-column half.
  static constexpr bool phases_hold() {
    for (int r = 0; r < 8; ++r)
      for (int origin = 0; origin < kSteps; ++origin)
        for (int k = 0; origin + k < kSteps; ++k)
          for (int half = 0; half < 2; ++half) {
            const int col = (origin + k) * 16 + half * 8, base = (origin + k % kPhases) * 16 + half * 8;
            if (offset(r, col) != offset(r, base) + step_shift(k)) return false;
            for (int down = 8; down < 128; down += 8)
              if (offset(r + down, col) != offset(r, col) + down * kDim) return false;
          }
    return true;
  }
};

// A warp's ldmatrix base addresses into one SwizzledTile operand: one per
// swizzle phase, for the lane's row `row` (a multiple of 8 plus lane % 8),
// columns from `col0` (a multiple of 16: the warp's slice) and 8-column half
// `half` of each 16-column step. Phases past the slice are never used (and
// compiled away).
template <typename Tile>
struct FragmentBases {
  uint32_t addr[Tile::kPhases];
  __device__ __forceinline__ FragmentBases(uint32_t smem, int row, int col0, int half) {
#pragma unroll
    for (int ph = 0; ph < Tile::kPhases; ++ph) addr[ph] = smem + 2 * Tile::offset(row, col0 + ph * 16 + half * 8);
  }
  // 16-column step k of the slice, `rows` (a multiple of 8) rows further down.
  __device__ __forceinline__ uint32_t at(int k, int rows) const {
    return addr[k % Tile::kPhases] + 2 * (Tile::step_shift(k) + rows * Tile::kChunks * 8);
  }
};
static_assert(SwizzledTile<32>::phases_hold() && SwizzledTile<64>::phases_hold() &&
                  SwizzledTile<96>::phases_hold() && SwizzledTile<128>::phases_hold() &&
                  SwizzledTile<256>::phases_hold(),
              "ldmatrix fragment addresses are phase bases plus immediates");
static_assert(SwizzledTile<32>::ldmatrix_conflict_free() && SwizzledTile<64>::ldmatrix_conflict_free() &&
                  SwizzledTile<96>::ldmatrix_conflict_free() && SwizzledTile<128>::ldmatrix_conflict_free() &&
                  SwizzledTile<256>::ldmatrix_conflict_free(),
              "ldmatrix's 8 rows in 8 bank groups");

// Warp-wide reductions over the 4 lanes that share an accumulator row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace cuda
}  // namespace flashmask
