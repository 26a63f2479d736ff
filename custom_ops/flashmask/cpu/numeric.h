// Scalar conversions for the storage types and a vectorised exp, kept free of
// any framework header (fp16/bf16 travel as raw 16-bit words).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashmask {
namespace cpu {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float to_float(float x) { return x; }
inline float to_float(BFloat16 x) { return bits_to_float(uint32_t(x.bits) << 16); }
inline float to_float(Half x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
  uint32_t exp = (x.bits >> 10) & 0x1fu;
  uint32_t mant = x.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // Subnormal half: value = mant * 2^-24, exact in fp32.
    const float mag = float(mant) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

template <typename T>
inline T from_float(float x);

template <>
inline float from_float<float>(float x) {
  return x;
}

// Round to nearest even, NaN stays NaN.
template <>
inline BFloat16 from_float<BFloat16>(float x) {
  uint32_t u = float_to_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{uint16_t(u >> 16)};
}

// Round to nearest even, with overflow to inf and gradual underflow.
template <>
inline Half from_float<Half>(float x) {
  const uint32_t u = float_to_bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{uint16_t(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return Half{uint16_t(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {
    // Below the smallest normal half (2^-14): round to a multiple of 2^-24.
    const float mag = bits_to_float(abs) * 16777216.f;  // in units of 2^-24
    const uint16_t m = uint16_t(std::nearbyint(mag));
    return Half{uint16_t(sign | m)};
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return Half{uint16_t(sign | (((rounded >> 13) - (112u << 10)) & 0x7fffu))};
}

// Eight-lane float vector (GCC/Clang vector extension; lowers to AVX/AVX-512/
// SSE or scalar code depending on the target flags).
typedef float vfloat __attribute__((vector_size(32), aligned(4)));
typedef int32_t vint __attribute__((vector_size(32), aligned(4)));
constexpr int kLanes = 8;

inline vfloat vload(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void vstore(float* p, vfloat v) { std::memcpy(p, &v, sizeof(v)); }
inline vfloat vbroadcast(float x) { return vfloat{x, x, x, x, x, x, x, x}; }

// exp(x) for eight lanes, relative error ~2e-7; exp(-inf) and any x below
// the fp32 range give exactly 0, which masked scores rely on.
inline vfloat vexp(vfloat x) {
  const vfloat t = x * 1.4426950408889634f;  // x * log2(e)
  const vfloat tc = t < -126.f ? vbroadcast(-126.f) : (t > 127.f ? vbroadcast(127.f) : t);
  // n = round(tc), f = tc - n in [-0.5, 0.5]
  const vfloat shifted = tc + 12582912.f;  // 1.5 * 2^23 rounds to an integer
  const vint n = (vint)shifted - (vint)vbroadcast(12582912.f);
  const vfloat f = tc - (shifted - 12582912.f);
  // 2^f on [-0.5, 0.5]: minimax-like Taylor of degree 6 in f*ln2.
  const vfloat y = f * 0.6931471805599453f;
  vfloat p = vbroadcast(1.f / 720.f);
  p = p * y + 1.f / 120.f;
  p = p * y + 1.f / 24.f;
  p = p * y + 1.f / 6.f;
  p = p * y + 0.5f;
  p = p * y + 1.f;
  p = p * y + 1.f;
  const vint scale = (n + 127) << 23;
  vfloat r = p * (vfloat)scale;
  return t < -126.f ? vbroadcast(0.f) : r;
}

}  // namespace cpu
}  // namespace flashmask
