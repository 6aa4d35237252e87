// Device-side element conversions shared by the CUDA backends, byte-identical
// to the CPU backend's numerics.h: high-precision loads, the FP8 cast (with the
// spec's 0x7F NaN), FP8 -> float, float(q) * scale_inv with the CPU's NaN bits,
// float -> FP32/BF16/FP16, and host dispatch on the CUDA element types.
// (Moved here from cast/cuda.cu so that every FP8 family uses one copy.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "runtime/numerics.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "te/types.h"

namespace te::cuda_elem {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Two floats -> two FP8 bytes (lo in the low byte). The caller's values are
// already multiplied by the scale.
template <bool kE5M2>
__device__ __forceinline__ uint32_t fp8x2(float lo, float hi) {
  uint32_t bytes =
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, kE5M2 ? __NV_E5M2 : __NV_E4M3);
  // The spec's NaN is 0x7F whatever the sign and payload (numerics.h).
  if (lo != lo) bytes = (bytes & 0xFF00u) | kFp8CanonicalNaN;
  if (hi != hi) bytes = (bytes & 0x00FFu) | (uint32_t{kFp8CanonicalNaN} << 8);
  return bytes;
}

// Four floats -> four FP8 bytes (a in byte 0), the same bytes as two fp8x2
// calls, with the NaN patch done on the packed word (3 to 6 integer operations
// instead of a compare and a select per element): with __NV_SATFINITE only a
// NaN input gives a code whose low 7 bits are 0x7F (E4M3) or 0x7D..0x7F (E5M2),
// so exactly those bytes become kFp8CanonicalNaN (0x7F).
template <bool kE5M2>
__device__ __forceinline__ uint32_t fp8x4(float a, float b, float c, float d) {
  uint32_t w;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // Two cvt.satfinite.f8x2 (the second packs into the upper half): 2 instructions.
  if constexpr (kE5M2) {
    asm("{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\nmov.b32 %0, {lo, hi};\n}"
        : "=r"(w)
        : "f"(a), "f"(b), "f"(c), "f"(d));
  } else {
    asm("{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\nmov.b32 %0, {lo, hi};\n}"
        : "=r"(w)
        : "f"(a), "f"(b), "f"(c), "f"(d));
  }
#else
  constexpr __nv_fp8_interpretation_t kFormat = kE5M2 ? __NV_E5M2 : __NV_E4M3;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFormat);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kFormat);
  w = __byte_perm(lo, hi, 0x5410);
#endif
  const uint32_t low7 = w & 0x7F7F7F7Fu;
  static_assert(kFp8CanonicalNaN == 0x7F, "the patch below writes 0x7F");
  if constexpr (!kE5M2) {
    // low7 + 1 carries into bit 7 only from 0x7F (never into the next byte);
    // w & ~(that & 0x80808080) clears the sign of those bytes: 0xFF -> 0x7F.
    const uint32_t carry = low7 + 0x01010101u;
#if defined(__CUDA_ARCH__)
    uint32_t out;  // one LOP3 (the compiler's own form takes two)
    asm("lop3.b32 %0, %1, %2, 0x80808080, 0x70;" : "=r"(out) : "r"(w), "r"(carry));
    return out;
#else
    return w & ~(carry & 0x80808080u);
#endif
  } else {
    const uint32_t nan = (low7 + 0x03030303u) & 0x80808080u;  // low 7 bits >= 0x7D
    const uint32_t fill = nan - (nan >> 7);                   // 0x7F in those bytes
    return (w & ~(nan | fill)) | fill;
  }
}

// float(q) * scale_inv as the CPU computes it, NaN bits included: x86 returns
// the NaN operand (quieted) and, for 0 * inf, the default NaN 0xFFC00000; the
// GPU would give 0x7FFFFFFF. The CPU's float(q) of a NaN code is +-0x7FC00000.
__device__ __forceinline__ float dequant(float qf, bool q_negative, float s) {
  const float v = __fmul_rn(qf, s);
  if (v == v) return v;
  if (qf != qf) return __uint_as_float(q_negative ? 0xFFC00000u : 0x7FC00000u);
  if (s != s) return __uint_as_float(__float_as_uint(s) | 0x00400000u);
  return __uint_as_float(0xFFC00000u);
}

// float -> output element bits, as numerics.h rounds (RNE; NaN keeps its sign
// and becomes 0x7FFF in BF16/FP16).
template <class Out>
__device__ __forceinline__ Out from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
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

// v rounded to Out and widened back: the device twin of te::stored_amax
// (runtime/element.h) for an output element type Out.
template <class Out>
__device__ __forceinline__ float round_through(float v) {
  return to_float(from_float<Out>(v));
}

// te::stored_amax on the device, for a run-time output dtype.
__device__ __forceinline__ float stored_amax(float amax, te_dtype dtype) {
  if (dtype == TE_DTYPE_BFLOAT16) return round_through<__nv_bfloat16>(amax);
  if (dtype == TE_DTYPE_FLOAT16) return round_through<__half>(amax);
  return amax;
}

template <bool kE5M2>
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes),
                                                   kE5M2 ? __NV_E5M2 : __NV_E4M3);
  return __half22float2(__half2(h));
}

// Host dispatch: f(In{}) for the CUDA type of a FP32/BF16/FP16 dtype, and
// f(std::bool_constant<kE5M2>{}) for an FP8 dtype.
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

}  // namespace te::cuda_elem
