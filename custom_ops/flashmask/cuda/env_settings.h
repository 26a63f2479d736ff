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

}  // namespace cuda
}  // namespace flashmask
