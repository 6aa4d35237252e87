// Loading and storing high-precision elements as float, by te_dtype, for the
// CPU backend. dispatch_float_type(dtype, f) calls f with a tag whose ::type is
// float, Bf16 or Fp16 (raw 16-bit storage).
#pragma once

#include <cstdint>

#include "runtime/numerics.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "te/types.h"

namespace te {

struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};

inline float to_float(float v) { return v; }
inline float to_float(Bf16 v) { return bf16_to_float(v.bits); }
inline float to_float(Fp16 v) { return fp16_to_float(v.bits); }

template <class T>
T from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline Bf16 from_float<Bf16>(float v) {
  return Bf16{float_to_bf16(v)};
}
template <>
inline Fp16 from_float<Fp16>(float v) {
  return Fp16{float_to_fp16(v)};
}

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for the FP32/BF16/FP16 storage type of dtype.
template <class F>
void dispatch_float_type(te_dtype dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: f(TypeTag<float>{}); return;
    case TE_DTYPE_BFLOAT16: f(TypeTag<Bf16>{}); return;
    case TE_DTYPE_FLOAT16: f(TypeTag<Fp16>{}); return;
    default: fail(TE_ERROR_INTERNAL, "unexpected dtype ", dtype_name(dtype));
  }
}

// The amax of a high-precision output as stored: max|round(v_i)| over the
// rounded values. RNE rounding is monotone and odd, so that equals
// round(max|v_i|): an amax of the unrounded FP32 values becomes the stored
// tensor's amax by rounding it once. FP32 (and any non-float dtype) is the
// identity; amax is never NaN here (the maxima skip NaN).
inline float stored_amax(float amax, te_dtype dtype) {
  if (dtype == TE_DTYPE_BFLOAT16) return bf16_to_float(float_to_bf16(amax));
  if (dtype == TE_DTYPE_FLOAT16) return fp16_to_float(float_to_fp16(amax));
  return amax;
}

inline const Fp8Format& fp8_format(te_dtype dtype) {
  return dtype == TE_DTYPE_FLOAT8E5M2 ? kE5M2 : kE4M3;
}

// Largest finite value of a high-precision type (for an infinite scale).
inline float max_finite_of(te_dtype dtype) {
  switch (dtype) {
    case TE_DTYPE_BFLOAT16: return kBf16Max;
    case TE_DTYPE_FLOAT16: return kFp16Max;
    default: return kFp32Max;
  }
}

}  // namespace te
