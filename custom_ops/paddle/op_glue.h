// Helpers shared by the Paddle registrations (flashmask_op.cc, cp_ops.cc): the core's
// dtype from Paddle's, and the core's exceptions turned into Paddle errors.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "../flashmask/flashmask_params.h"
#include "paddle/extension.h"

namespace flashmask_glue {

// float32 / float16 / bfloat16 -> the core's DType; anything else is an error naming `op`.
inline flashmask::DType float_dtype(paddle::DataType dtype, const char* op) {
  switch (dtype) {
    case paddle::DataType::FLOAT32:
      return flashmask::DType::kFloat32;
    case paddle::DataType::FLOAT16:
      return flashmask::DType::kFloat16;
    case paddle::DataType::BFLOAT16:
      return flashmask::DType::kBFloat16;
    default:
      PD_THROW(std::string(op) + ": expected float32, float16 or bfloat16 tensors");
  }
}

// An output tensor. Paddle 2.6 allocates nothing for a zero-element shape and then
// refuses the op's output as "not initialized"; a context-parallel exchange or remap can be
// empty (a rank that needs no key of a peer), so such an output is one element resized.
inline paddle::Tensor output_tensor(const std::vector<int64_t>& shape, paddle::DataType dtype,
                                    const paddle::Place& place) {
  for (int64_t d : shape) {
    if (d == 0) {
      auto t = paddle::empty({1}, dtype, place);
      t.reshape(shape);  // keeps the one-element allocation, so Paddle 2.6 sees it initialized
      return t;
    }
  }
  return paddle::empty(shape, dtype, place);
}

// The kernel core reports bad calls with std::invalid_argument (and CUDA failures with
// std::runtime_error); Paddle 2.6 aborts the process on a foreign exception, so they
// become Paddle errors (Python exceptions).
template <typename Fn>
void rethrow_as_paddle_error(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    PD_THROW(e.what());
  }
}

}  // namespace flashmask_glue
