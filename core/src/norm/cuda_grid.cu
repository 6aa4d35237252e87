// Grid sizes of the norm kernels (see cuda_common.cuh).
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "norm/cuda_common.cuh"
#include "runtime/cuda_check.h"

namespace te::norm::cuda {

int64_t resident_grid(const void* kernel, int threads, size_t smem_bytes, int64_t useful) {
  // Occupancy depends on the kernel, its block size (fixed per kernel), its
  // dynamic shared memory and the device: cached per (kernel, bytes, device).
  static std::mutex mutex;
  static std::map<std::tuple<const void*, size_t, int>, int> cache;
  int device = 0;
  TE_CHECK_CUDA(cudaGetDevice(&device));
  // The opt-in is a property of the function: set it before every launch that
  // needs it (a cheap host call), since a smaller request may have lowered it.
  if (smem_bytes > 48 * 1024)
    TE_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem_bytes)));
  const auto key = std::make_tuple(kernel, smem_bytes, device);
  int per_sm = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) per_sm = it->second;
  }
  if (per_sm == 0) {
    TE_CHECK_CUDA(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
    if (per_sm < 1)
      fail(TE_ERROR_UNSUPPORTED, "a norm kernel with ", threads, " threads and ", smem_bytes,
           " bytes of shared memory does not fit on this device");
    std::lock_guard<std::mutex> lock(mutex);
    cache[key] = per_sm;
  }
  const int64_t wave = static_cast<int64_t>(per_sm) * cuda_sm_count();
  return std::max<int64_t>(1, std::min(wave, useful));
}

}  // namespace te::norm::cuda
