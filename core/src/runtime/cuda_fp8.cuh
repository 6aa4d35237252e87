// Device-side element conversions shared by the CUDA backends, byte-identical
// to the host conversions of runtime/numerics.h:
//   to_float(x)           FP32/BF16/FP16 -> float (exact)
//   fp8x2<kE5M2>(lo, hi)  two floats -> two FP8 bytes (lo in the low byte):
//                         cvt.rn.satfinite (RNE, denormals kept, +-inf and
//                         out-of-range saturated), NaN patched to 0x7F
//   fp8x2_to_float2       two FP8 bytes -> two floats (exact, via FP16)
//   from_float<Out>(v)    float -> FP32/BF16/FP16, RNE; a NaN keeps its sign
//                         and becomes 0x7FFF in BF16/FP16
// and the host-side dispatch from te_dtype to those element types:
//   dispatch_input(dtype, f)   f(float{}), f(__nv_bfloat16{}) or f(__half{})
//   dispatch_fp8(dtype, f)     f(std::bool_constant<dtype == E5M2>{})
// They live in te::device so that they do not collide with the host helpers
// of runtime/element.h; a backend pulls them in with using-declarations.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "runtime/numerics.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace te::device {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <bool kE5M2>
__device__ __forceinline__ uint32_t fp8x2(float lo, float hi) {
  uint32_t bytes = __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE,
                                            kE5M2 ? __NV_E5M2 : __NV_E4M3);
  // The spec's NaN is 0x7F whatever the sign and payload (numerics.h).
  if (lo != lo) bytes = (bytes & 0xFF00u) | kFp8CanonicalNaN;
  if (hi != hi) bytes = (bytes & 0x00FFu) | (uint32_t{kFp8CanonicalNaN} << 8);
  return bytes;
}

template <bool kE5M2>
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes),
                                                    kE5M2 ? __NV_E5M2 : __NV_E4M3);
  return __half22float2(__half2(h));
}

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

template <class F>
void dispatch_input(te_dtype dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: f(float{}); return;
    case TE_DTYPE_BFLOAT16: f(__nv_bfloat16{}); return;
    case TE_DTYPE_FLOAT16: f(__half{}); return;
    default: fail(TE_ERROR_INTERNAL, "unexpected dtype ", dtype_name(dtype));
  }
}

template <class F>
void dispatch_fp8(te_dtype fp8_dtype, F&& f) {
  if (fp8_dtype == TE_DTYPE_FLOAT8E5M2) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace te::device
