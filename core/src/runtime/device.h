// Backend selection. Each op family declares its CPU backend in te::<family>::cpu
// and its CUDA backend in te::<family>::cuda (only in CUDA builds). api.cpp
// validates once, then calls TE_DISPATCH(on_cuda(t), cpu::f(...), cuda::f(...)).
#pragma once

#include "runtime/status.h"

namespace te {
[[noreturn]] void fail_no_cuda();
// Makes the tensor's device current (CUDA builds); checks it exists.
void use_cuda_device(int device_index);
}  // namespace te

#ifdef TE_WITH_CUDA
#define TE_DISPATCH(use_cuda, cpu_call, cuda_call) \
  do {                                             \
    if (use_cuda) {                                \
      cuda_call;                                   \
    } else {                                       \
      cpu_call;                                    \
    }                                              \
  } while (0)
#else
#define TE_DISPATCH(use_cuda, cpu_call, cuda_call) \
  do {                                             \
    if (use_cuda) {                                \
      ::te::fail_no_cuda();                        \
    } else {                                       \
      cpu_call;                                    \
    }                                              \
  } while (0)
#endif
