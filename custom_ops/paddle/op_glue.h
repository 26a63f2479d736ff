// Helpers shared by the Paddle registrations (flashmask_op.cc, cp_ops.cc): the core's
// dtype from Paddle's, and the core's exceptions turned into Paddle errors.
#pragma once

#include <exception>
#include <string>

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
