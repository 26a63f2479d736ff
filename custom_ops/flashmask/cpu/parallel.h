// A minimal dynamic parallel-for on std::thread: no OpenMP runtime to clash
// with the one the framework links, and work items of very different cost
// (causal and masked tiles) balance through a shared atomic counter.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace flashmask {
namespace cpu {

// Cores this process may run on (honours taskset/cgroup cpusets), overridden
// by PADDLE_FLASHMASK_NUM_THREADS.
inline int default_num_threads() {
  if (const char* env = std::getenv("PADDLE_FLASHMASK_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? int(n) : 1;
}

// Threads parallel_for uses for num_items items (sizes per-worker scratch).
inline int num_workers(int64_t num_items, int num_threads) {
  return int(std::max<int64_t>(
      1, std::min<int64_t>(num_items, num_threads > 0 ? num_threads : default_num_threads())));
}

// Calls body(item, worker) for item in [0, num_items); worker in
// [0, num_workers) identifies per-thread scratch. Exceptions are rethrown.
template <typename Body>
void parallel_for(int64_t num_items, int num_threads, Body&& body) {
  if (num_items <= 0) return;
  const int workers = num_workers(num_items, num_threads);
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int worker) {
    try {
      for (int64_t item = next.fetch_add(1); item < num_items; item = next.fetch_add(1)) {
        body(item, worker);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(num_items);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  // A thread the system refuses (thread or memory limits) is no error: the shared counter hands
  // its items to the workers that did start, the calling thread at least.
  try {
    for (int w = 1; w < workers; ++w) threads.emplace_back(run, w);
  } catch (const std::system_error&) {
  }
  run(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}


}  // namespace cpu
}  // namespace flashmask
