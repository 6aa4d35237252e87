// Error checks for the CUDA backends. A failing CUDA runtime call becomes
// te::fail(TE_ERROR_CUDA, "<what>: <cudaGetErrorString>"), so the C entry point
// returns TE_ERROR_CUDA with a message that names the call:
//
//     TE_CHECK_CUDA(cudaMemsetAsync(amax, 0, sizeof(float), stream));
//     kernel<<<grid, block, 0, stream>>>(...);
//     TE_CHECK_LAUNCH();
//
// A bad launch configuration (grid too large, too much shared memory) is only
// reported by cudaGetLastError(), hence the check after every launch. It never
// synchronizes: errors of the kernel's execution surface in a later call.
#pragma once

#include <cuda_runtime.h>

#include <cstring>

#include "runtime/status.h"

namespace te {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail(TE_ERROR_CUDA, what, ": ", cudaGetErrorString(err));
}

inline void check_launch(const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return;
  const char* src = std::strstr(file, "src/");  // "cast/cuda.cu", not the build machine's path
  fail(TE_ERROR_CUDA, "kernel launch at ", src ? src + 4 : file, ":", line, ": ",
       cudaGetErrorString(err));
}

}  // namespace te

#define TE_CHECK_CUDA(expr) ::te::check_cuda((expr), #expr)
#define TE_CHECK_LAUNCH() ::te::check_launch(__FILE__, __LINE__)
