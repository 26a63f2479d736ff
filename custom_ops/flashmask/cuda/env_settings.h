// The GPU kernels' tuning switches, read from the environment at each launch
// (paddle_flashmask/validation.py checks the same names and ranges in Python
// first, since Paddle 2.6 cannot carry the op's own error back).
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace flashmask {
namespace cuda {

// A 0/1 switch (unset or empty: `fallback`).
inline bool env_switch(const char* name, bool fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  if (std::string(env) == "0") return false;
  if (std::string(env) == "1") return true;
  throw std::invalid_argument(std::string(name) + " must be 0 or 1, got '" + env + "'");
}

// An integer in [lo, hi] (unset or empty: `fallback`).
inline int env_int(const char* name, int fallback, int lo, int hi) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(env, &end, 10);
  if (*end != '\0' || value < lo || value > hi) {
    throw std::invalid_argument(std::string(name) + " must be an integer in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "], got '" + env + "'");
  }
  return int(value);
}

// Which FA2-class main backward runs: "staged" (FlashAttention-2's layout,
// flashmask_bwd_staged_kernel.cuh) or "split" (one warp split for every GEMM,
// flashmask_bwd_kernel.cuh); PADDLE_FLASHMASK_FA2_BWD, read at each launch so
// that one build can time both. Both add into the same accumulators (dK/dV
// slots, dQ tiles) over the same 128-key grid. "split" stops at head dim
// kSplitBwdMaxHeadDim (its 8 warps x 16 keys would hold dK and dV, 256
// registers, at 256); the launch refuses more.
#ifndef FLASHMASK_FA2_BWD_DEFAULT
#define FLASHMASK_FA2_BWD_DEFAULT "staged"
#endif
constexpr int kSplitBwdMaxHeadDim = 128;
inline bool use_staged_bwd() {
  const char* env = std::getenv("PADDLE_FLASHMASK_FA2_BWD");
  const std::string choice = env != nullptr && *env != '\0' ? env : FLASHMASK_FA2_BWD_DEFAULT;
  if (choice != "staged" && choice != "split") {
    throw std::invalid_argument("PADDLE_FLASHMASK_FA2_BWD: expected 'staged' or 'split', got '" + choice + "'");
  }
  return choice == "staged";
}

}  // namespace cuda
}  // namespace flashmask
