// The CPU kernels' parallel_for (custom_ops/flashmask/cpu/parallel.h) when the system refuses
// threads: with the address space capped a few thread stacks above what the process holds, a
// call for 1024 workers starts only some of them. It must still run every item exactly once (on
// the workers that did start) instead of ending the process in std::terminate, as a failed
// std::thread construction had. Also checks that the cap did refuse threads (else this tests
// nothing) and that an exception thrown by the body still reaches the caller.
// Prints the number of mismatches (0 expected) and the number of checks.
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "../../custom_ops/flashmask/cpu/parallel.h"

namespace fcpu = flashmask::cpu;

static long mapped_bytes() {
  long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return pages * sysconf(_SC_PAGESIZE);
}

int main() {
  const int64_t kItems = 20000;
  const int kThreads = 1024;
  std::vector<std::atomic<int>> visits(kItems);
  std::vector<std::atomic<int>> workers_seen(kThreads);
  int64_t mismatches = 0, checks = 0;

  rlimit cap{};
  getrlimit(RLIMIT_AS, &cap);
  cap.rlim_cur = rlim_t(mapped_bytes()) + (rlim_t(96) << 20);  // room for a few 8 MB stacks
  if (setrlimit(RLIMIT_AS, &cap) != 0) {
    std::printf("1 1\n");
    return 0;
  }
  fcpu::parallel_for(kItems, kThreads, [&](int64_t item, int worker) {
    visits[item].fetch_add(1);
    workers_seen[worker].store(1);
  });
  for (auto& v : visits) mismatches += v.load() != 1, ++checks;
  int started = 0;
  for (auto& w : workers_seen) started += w.load();
  mismatches += started >= kThreads, ++checks;  // the cap refused some threads
  mismatches += started < 1, ++checks;

  bool rethrown = false;  // the body's own exception, with threads refused as above
  try {
    fcpu::parallel_for(kItems, kThreads, [&](int64_t item, int) {
      if (item == kItems / 2) throw std::runtime_error("body");
    });
  } catch (const std::runtime_error&) {
    rethrown = true;
  }
  mismatches += !rethrown, ++checks;
  std::printf("%lld %lld\n", (long long)mismatches, (long long)checks);
  return 0;
}
