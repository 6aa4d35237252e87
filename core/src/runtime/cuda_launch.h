// Launch helpers shared by the CUDA backends: the stream of a te_stream and
// grid sizes for persistent (grid-stride) kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "te/types.h"

namespace te {

inline cudaStream_t cuda_stream(te_stream stream) { return static_cast<cudaStream_t>(stream); }

// Number of SMs of the current device (cached per device).
int cuda_sm_count();

// Blocks for a grid-stride kernel: as many as are resident on the current
// device at once (one full wave, so no block waits for a second wave), but
// never more than `useful` and at least 1. The occupancy is cached per kernel.
int64_t persistent_blocks(const void* kernel, int threads, int64_t useful);

// ceil(a / b) for positive b.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace te
