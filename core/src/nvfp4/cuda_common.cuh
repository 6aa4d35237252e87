// Device helpers shared by the NVFP4 CUDA kernels (cuda.cu, cuda_quantize.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "nvfp4/formulas.h"
#include "runtime/cuda_utils.cuh"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace te::nvfp4::cuda {

constexpr int kThreads = 256;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Host dispatch: f(T{}) for the CUDA element type of a high-precision dtype.
template <class F>
void dispatch_float(te_dtype dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: f(float{}); return;
    case TE_DTYPE_BFLOAT16: f(__nv_bfloat16{}); return;
    case TE_DTYPE_FLOAT16: f(__half{}); return;
    default: fail(TE_ERROR_INTERNAL, "unexpected dtype ", dtype_name(dtype));
  }
}

// Zeroes the padding of a [rows_padded, cols_padded] scale buffer whose
// [rows, cols] corner holds scales (two memset nodes at most; graph safe).
void clear_scale_padding(uint8_t* scale, int64_t rows, int64_t cols, int64_t rows_padded,
                         int64_t cols_padded, te_stream stream);

}  // namespace te::nvfp4::cuda
