// cuda/head_dim_dispatch.h: for every tile head dim and dtype, the dispatch runs the
// launcher's instantiation of exactly that (head dim, dtype) once where the family
// instantiates it, and nothing (returning false) where it does not.
#include <cstdio>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "head_dim_dispatch.h"

namespace {

struct RecordingLauncher {
  std::vector<std::pair<int, bool>>* runs;  // (D, T is bf16)
  template <int D, typename T>
  void run() const {
    static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
    runs->push_back({D, std::is_same_v<T, __nv_bfloat16>});
  }
};

template <int... kDims>
void check_family(int& mismatches, int& checks) {
  const std::set<int> dims{kDims...};
  for (int d = 0; d <= 320; ++d) {
    for (bool bf16 : {false, true}) {
      std::vector<std::pair<int, bool>> runs;
      const bool ran = flashmask::cuda::dispatch_head_dim<kDims...>(d, bf16, RecordingLauncher{&runs});
      const bool expected = dims.count(d) > 0;
      const std::vector<std::pair<int, bool>> want =
          expected ? std::vector<std::pair<int, bool>>{{d, bf16}} : std::vector<std::pair<int, bool>>{};
      mismatches += ran != expected || runs != want;
      ++checks;
    }
  }
}

}  // namespace

int main() {
  int mismatches = 0, checks = 0;
  check_family<32, 64, 96, 128, 256>(mismatches, checks);  // the FA2-class kernels
  check_family<64, 96, 128, 192, 256>(mismatches, checks);  // the Hopper kernels
  check_family<128>(mismatches, checks);
  std::printf("%d %d\n", mismatches, checks);
  return 0;
}
