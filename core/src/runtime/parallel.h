// A minimal parallel-for for the CPU backend: splits [0, n) into contiguous
// chunks run by the calling thread and a pool of worker threads started once
// (parallel.cpp). Small ranges run on the calling thread alone.
#pragma once

#include <cstdint>
#include <functional>

namespace te {

// Number of worker threads (TE_NUM_THREADS, else the hardware concurrency).
int cpu_num_threads();

// Calls body(begin, end) on disjoint chunks covering [0, n). Chunks hold at
// least min_chunk items. Exceptions thrown by body are rethrown here.
void parallel_for(int64_t n, int64_t min_chunk,
                  const std::function<void(int64_t begin, int64_t end)>& body);

}  // namespace te
