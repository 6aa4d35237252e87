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

// The shared-memory tiles of the quantize kernels (cuda_quantize.cu,
// cuda_quantize_fast.cuh) have 256-byte rows; row r holds its 16-byte chunk c
// at chunk c ^ (r % 8) (an XOR swizzle within each 8-chunk half row), so that
// 16-byte reads of 8 rows and 4-byte reads along one row are both free of
// bank conflicts. Byte offset of chunk c of row r:
constexpr int kTileRowBytes = 256;
__device__ __forceinline__ int tile_chunk_offset(int r, int c) {
  return r * kTileRowBytes + ((c ^ (r & 7)) << 4);
}

// 16 bytes global -> shared (a shared-window address), bypassing L1.
__device__ __forceinline__ void copy16_async(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem) : "memory");
}

// The elements of one 32-bit word of a tile as floats (2 or 1).
__device__ __forceinline__ void word_to_floats(uint32_t w, float* out, __nv_bfloat16) {
  out[0] = __uint_as_float(w << 16);
  out[1] = __uint_as_float(w & 0xFFFF0000u);
}
__device__ __forceinline__ void word_to_floats(uint32_t w, float* out, __half) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
  out[0] = f.x;
  out[1] = f.y;
}
__device__ __forceinline__ void word_to_floats(uint32_t w, float* out, float) {
  out[0] = __uint_as_float(w);
}

// Zeroes the padding of a [rows_padded, cols_padded] scale buffer whose
// [rows, cols] corner holds scales (two memset nodes at most; graph safe).
void clear_scale_padding(uint8_t* scale, int64_t rows, int64_t cols, int64_t rows_padded,
                         int64_t cols_padded, te_stream stream);

}  // namespace te::nvfp4::cuda
