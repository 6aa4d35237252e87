// Backend selection. Each op family declares its CPU backend in te::<family>::cpu
// and its CUDA backend in te::<family>::cuda (only in CUDA builds). api.cpp
// validates once, then calls TE_DISPATCH(*input, cpu::f(...), cuda::f(...)):
// with a CUDA tensor it makes that tensor's device current and runs the CUDA
// call, else the CPU call. api.cpp files never select the device themselves,
// except before a device-dependent query ahead of the dispatch (a workspace
// size, a GEMM plan), through use_cuda_device.
#pragma once

#include "runtime/status.h"
#include "te/types.h"

namespace te {
void check_aliasing();  // runtime/tensor.h: written arguments overlap no other
[[noreturn]] void fail_no_cuda();
// Makes the device current (CUDA builds); checks it exists. Cheap when it
// already is current.
void use_cuda_device(int device_index);
}  // namespace te

// Runs cuda_call on device `device_index` when use_cuda, else cpu_call.
#ifdef TE_WITH_CUDA
#define TE_DISPATCH_DEVICE(use_cuda, device_index, cpu_call, cuda_call) \
  do {                                                                  \
    ::te::check_aliasing();                                             \
    if (use_cuda) {                                                     \
      ::te::use_cuda_device(device_index);                              \
      cuda_call;                                                        \
    } else {                                                            \
      cpu_call;                                                         \
    }                                                                   \
  } while (0)
#else
#define TE_DISPATCH_DEVICE(use_cuda, device_index, cpu_call, cuda_call) \
  do {                                                                  \
    ::te::check_aliasing();                                             \
    if (use_cuda) {                                                     \
      ::te::fail_no_cuda();                                             \
    } else {                                                            \
      cpu_call;                                                         \
    }                                                                   \
  } while (0)
#endif

// Dispatch on the device of the te_tensor `tensor` (an lvalue: *input).
#define TE_DISPATCH(tensor, cpu_call, cuda_call)                                              \
  TE_DISPATCH_DEVICE((tensor).device_type == TE_DEVICE_CUDA, (tensor).device_index, cpu_call, \
                     cuda_call)
