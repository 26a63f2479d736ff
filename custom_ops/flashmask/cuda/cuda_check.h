// Error checking for CUDA runtime calls: failures become C++ exceptions, which
// the Paddle glue turns into Python errors instead of crashing the process.
// Also the device queries the launches size their grids and tiles by.
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

namespace flashmask {

// An attribute of the current device (the launches size their grids and tiles by these).
inline int current_device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  FLASHMASK_CUDA_CHECK(cudaGetDevice(&device));
  FLASHMASK_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

// Streaming multiprocessors of the current device (persistent and
// grid-stride launches size their grids by it).
inline int sm_count() { return current_device_attribute(cudaDevAttrMultiProcessorCount); }

// The shared memory a block of the current device may opt into (tile choices
// that depend on it: the FA2-class SmemClass, the Hopper forward's 176-key tiles).
inline int device_smem_optin() { return current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin); }

}  // namespace flashmask
