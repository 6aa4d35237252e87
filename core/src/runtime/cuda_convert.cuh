// Device-side element conversions shared by the CUDA backends, bit-identical
// to the CPU's (numerics.h):
//   to_float      BF16/FP16/FP32 -> FP32 (exact widening)
//   from_float    FP32 -> FP32/BF16/FP16, round to nearest even; NaN keeps its
//                 sign and becomes 0x7FFF in BF16/FP16
//   fp8x2         two FP32 values (already multiplied by the scale) -> two FP8
//                 bytes with the hardware conversion (cvt.rn.satfinite.*x2.f32:
//                 RNE, denormals kept, +-inf and out-of-range values saturated
//                 to +-max); NaN lanes are patched to 0x7F, so the bytes do not
//                 depend on which NaN the instruction produces.
//   dispatch_float_type  (host) the CUDA element type of an FP32/BF16/FP16 dtype
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "runtime/numerics.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace te::dev {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <class Out>
__device__ __forceinline__ Out from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  __nv_bfloat16_raw r;
  r.x = te::float_to_bf16(v);
  return r;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  if (v != v) {
    __half_raw r;
    r.x = static_cast<unsigned short>(((__float_as_uint(v) >> 16) & 0x8000u) | 0x7FFFu);
    return r;
  }
  return __float2half_rn(v);
}

// Two floats -> two FP8 bytes (lo in the low byte).
template <bool kE5M2>
__device__ __forceinline__ uint32_t fp8x2(float lo, float hi) {
  uint32_t bytes = __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE,
                                            kE5M2 ? __NV_E5M2 : __NV_E4M3);
  // The spec's NaN is 0x7F whatever the sign and payload (numerics.h).
  if (lo != lo) bytes = (bytes & 0xFF00u) | kFp8CanonicalNaN;
  if (hi != hi) bytes = (bytes & 0x00FFu) | (uint32_t{kFp8CanonicalNaN} << 8);
  return bytes;
}

// Host: calls f(T{}) with the CUDA element type (float, __nv_bfloat16, __half)
// of an FP32/BF16/FP16 dtype.
template <class F>
void dispatch_float_type(te_dtype dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: f(float{}); return;
    case TE_DTYPE_BFLOAT16: f(__nv_bfloat16{}); return;
    case TE_DTYPE_FLOAT16: f(__half{}); return;
    default: fail(TE_ERROR_INTERNAL, "unexpected dtype ", dtype_name(dtype));
  }
}

}  // namespace te::dev
