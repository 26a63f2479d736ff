// Error checking for CUDA runtime calls: failures become C++ exceptions, which
// the Paddle glue turns into Python errors instead of crashing the process.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define FLASHMASK_CUDA_CHECK(expr)                                                     \
  do {                                                                                 \
    const cudaError_t flashmask_err_ = (expr);                                         \
    if (flashmask_err_ != cudaSuccess) {                                               \
      throw std::runtime_error(std::string("flashmask CUDA error: ") +                 \
                               cudaGetErrorString(flashmask_err_) + " at " __FILE__ ":" + \
                               std::to_string(__LINE__));                              \
    }                                                                                  \
  } while (0)
