#include "runtime/device.h"

#include "te/types.h"

#ifdef TE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace te {

void fail_no_cuda() {
  fail(TE_ERROR_UNSUPPORTED,
       "this build of the core has no CUDA backend; rebuild te-core with CUDA (TE_WITH_CUDA=ON) "
       "or pass CPU tensors");
}

void use_cuda_device(int device_index) {
#ifdef TE_WITH_CUDA
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device_index) return;
  const cudaError_t err = cudaSetDevice(device_index);
  if (err != cudaSuccess)
    fail(TE_ERROR_CUDA, "cannot use CUDA device ", device_index, ": ", cudaGetErrorString(err));
#else
  (void)device_index;
  fail_no_cuda();
#endif
}

}  // namespace te

extern "C" {

int te_built_with_cuda(void) {
#ifdef TE_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

int te_cuda_device_count(void) {
#ifdef TE_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

}  // extern "C"
