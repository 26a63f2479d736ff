// 2^x as one MUFU.EX2 (ex2.approx.ftz.f32), the softmax exponent of every
// kernel. FlashAttention-2 and -3 get it from --use_fast_math; without that
// nvcc's exp2f wraps each MUFU.EX2 in a range test and two predicated
// multiplies (FSETP, FMUL before, FMUL after) so that results below 2^-126
// come out as denormals. The kernels' probabilities there are 0 to every use
// (a row sum of at least 1, 16-bit P and dS), and the softmax is issue-bound:
// three instructions an element of the score tile. -inf gives +0 (masked
// scores, rows that see no key), as exp2f does; the error is exp2f's (2 ulp).
#pragma once

namespace flashmask {
namespace cuda {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace cuda
}  // namespace flashmask
