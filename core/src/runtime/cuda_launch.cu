#include "runtime/cuda_launch.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "runtime/cuda_check.h"

namespace te {

int cuda_sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  TE_CHECK_CUDA(cudaGetDevice(&device));
  if (device >= 0 && device < kMaxDevices) {
    const int n = cached[device].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int n = 0;
  TE_CHECK_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (device >= 0 && device < kMaxDevices) cached[device].store(n, std::memory_order_relaxed);
  return n;
}

int64_t persistent_blocks(const void* kernel, int threads, int64_t useful) {
  // Occupancy depends on the kernel, its block size and the architecture; each
  // kernel is launched with one block size and a process drives one GPU model,
  // so the cache is keyed by the kernel alone.
  static std::mutex mutex;
  static std::unordered_map<const void*, int> per_sm_cache;
  int per_sm = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = per_sm_cache.find(kernel);
    if (it != per_sm_cache.end()) per_sm = it->second;
  }
  if (per_sm == 0) {
    TE_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    per_sm = std::max(per_sm, 1);
    std::lock_guard<std::mutex> lock(mutex);
    per_sm_cache[kernel] = per_sm;
  }
  const int64_t wave = static_cast<int64_t>(per_sm) * cuda_sm_count();
  return std::max<int64_t>(1, std::min(wave, useful));
}

}  // namespace te
