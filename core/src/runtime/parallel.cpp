#include "runtime/parallel.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace te {

int cpu_num_threads() {
  static const int threads = [] {
    if (const char* env = std::getenv("TE_NUM_THREADS")) {
      const int n = std::atoi(env);
      if (n > 0) return n;
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
  }();
  return threads;
}

void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  const int64_t max_workers = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int workers = static_cast<int>(std::min<int64_t>(cpu_num_threads(), max_workers));
  if (workers <= 1) {
    body(0, n);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int64_t begin, int64_t end) {
    try {
      body(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  const int64_t chunk = (n + workers - 1) / workers;
  for (int w = 1; w < workers; ++w) {
    const int64_t begin = w * chunk, end = std::min(n, begin + chunk);
    if (begin < end) threads.emplace_back(run, begin, end);
  }
  run(0, std::min(n, chunk));
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace te
