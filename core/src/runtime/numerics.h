// Exact element conversions shared by the CPU backend (and usable in CUDA
// device code): FP8 E4M3/E5M2, BF16 and FP16 <-> FP32, and the scale-from-amax
// formula. The CPU backend is the executable spec: CUDA kernels may use
// hardware conversions, but the tests require identical bytes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#ifdef __CUDACC__
#define TE_HD __host__ __device__ __forceinline__
#else
#define TE_HD inline
#endif

namespace te {

template <class To, class From>
TE_HD To bit_cast_value(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

// The two FP8 formats of the reference library.
struct Fp8Format {
  int mantissa_bits;
  int exponent_bias;
  float max_finite;  // 448 (E4M3), 57344 (E5M2)
  uint8_t max_code;  // byte of +max_finite
};
constexpr Fp8Format kE4M3{3, 7, 448.0f, 0x7E};
constexpr Fp8Format kE5M2{2, 15, 57344.0f, 0x7B};
constexpr uint8_t kFp8CanonicalNaN = 0x7F;

// v / 2^shift rounded to nearest, ties to even (shift >= 0).
TE_HD uint32_t shift_right_rne(uint32_t v, int shift) {
  if (shift == 0) return v;
  if (shift > 31) return 0;  // v < 2^32 <= half of 2^shift
  const uint32_t quotient = v >> shift;
  const uint32_t remainder = v & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return quotient + (remainder > half || (remainder == half && (quotient & 1u)) ? 1u : 0u);
}

// float -> FP8: round to nearest even, saturate to +-max_finite (inf too),
// NaN -> 0x7F. Denormals of the FP8 format are produced, never flushed.
// Works on the bits: with e the unbiased exponent of |x| and M its 24-bit
// significand (hidden bit included),
//   FP8 normal   (e >= 1 - bias): the float's [exponent|mantissa] bits shifted
//                right by 23 - m with RNE; a carry out of the mantissa bumps the
//                exponent, as it should; then rebias from 127 to `bias`;
//   FP8 denormal (e <  1 - bias): code = RNE(M / 2^(23 - m + (1 - bias) - e)),
//                the count of 2^(1 - bias - m) units (2^m units is the
//                smallest normal, whose code is also 2^m);
// and any code above max_code (E4M3's NaN byte, E5M2's inf/NaN) saturates.
TE_HD uint8_t float_to_fp8(float x, const Fp8Format& f) {
  const uint32_t bits = bit_cast_value<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return kFp8CanonicalNaN;
  if (bit_cast_value<float>(magnitude) >= f.max_finite) return sign | f.max_code;
  const int biased_exp = static_cast<int>(magnitude >> 23);
  if (biased_exp == 0) return sign;  // zero or float denormal (< 2^-126): rounds to 0
  const int exp = biased_exp - 127;
  const int min_normal_exp = 1 - f.exponent_bias;
  uint32_t code;
  if (exp >= min_normal_exp) {
    code = shift_right_rne(magnitude, 23 - f.mantissa_bits) -
           (static_cast<uint32_t>(127 - f.exponent_bias) << f.mantissa_bits);
  } else {
    const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    code = shift_right_rne(significand, 23 - f.mantissa_bits + min_normal_exp - exp);
  }
  return sign | static_cast<uint8_t>(code > f.max_code ? f.max_code : code);
}

TE_HD float fp8_to_float(uint8_t code, const Fp8Format& f) {
  const bool negative = code & 0x80;
  const int exp_bits = 7 - f.mantissa_bits;
  const int biased = (code >> f.mantissa_bits) & ((1 << exp_bits) - 1);
  const int mantissa = code & ((1 << f.mantissa_bits) - 1);
  float v;
  if (f.mantissa_bits == 3 && (code & 0x7F) == 0x7F) {
    v = std::numeric_limits<float>::quiet_NaN();  // E4M3: only S.1111.111 is NaN, no inf
  } else if (f.mantissa_bits == 2 && biased == 31) {
    v = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (biased == 0) {
    v = std::ldexp(static_cast<float>(mantissa), 1 - f.exponent_bias - f.mantissa_bits);
  } else {
    v = std::ldexp(static_cast<float>(mantissa + (1 << f.mantissa_bits)),
                   biased - f.exponent_bias - f.mantissa_bits);
  }
  return negative ? -v : v;
}

// BF16: round to nearest even; NaN -> 0x7FFF with the sign kept (as CUDA does).
TE_HD uint16_t float_to_bf16(float x) {
  const uint32_t u = bit_cast_value<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x7FFFu);
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

TE_HD float bf16_to_float(uint16_t h) {
  return bit_cast_value<float>(static_cast<uint32_t>(h) << 16);
}

// FP16: round to nearest even with denormals; overflow -> inf; NaN -> 0x7FFF
// with the sign kept.
TE_HD uint16_t float_to_fp16(float x) {
  const uint32_t u = bit_cast_value<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs_bits = u & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | 0x7FFFu;
  const float a = bit_cast_value<float>(abs_bits);
  if (a >= 65520.0f) return sign | 0x7C00u;  // rounds to inf
  if (a < 6.103515625e-05f) {                // below the smallest normal 2^-14
    return sign | static_cast<uint16_t>(std::rint(std::ldexp(a, 24)));  // units of 2^-24
  }
  int exp;
  std::frexp(a, &exp);
  const float units = std::rint(std::ldexp(a, 11 - exp));  // 11 significant bits
  uint32_t biased = static_cast<uint32_t>(exp - 1 + 15);
  uint32_t mantissa = static_cast<uint32_t>(units) - 1024u;
  if (mantissa == 1024u) {  // rounding carried into the next binade
    mantissa = 0;
    biased += 1;
  }
  return sign | static_cast<uint16_t>((biased << 10) | mantissa);
}

TE_HD float fp16_to_float(uint16_t h) {
  const bool negative = h & 0x8000u;
  const int biased = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  float v;
  if (biased == 31) {
    v = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (biased == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -24);
  } else {
    v = std::ldexp(static_cast<float>(mantissa + 1024), biased - 25);
  }
  return negative ? -v : v;
}

// Largest finite value of a high-precision input type, used for an infinite scale.
constexpr float kBf16Max = 3.38953139e38f;  // 0x7F7F
constexpr float kFp16Max = 65504.0f;
constexpr float kFp32Max = 3.40282347e38f;

// The reference library's compute_scale_from_amax (see te/cast.h).
TE_HD float scale_from_amax(float amax, float fp8_max, bool force_pow2, float epsilon,
                            float value_for_inf) {
  if (amax < epsilon) amax = epsilon;
  if (amax == 0.0f || !(std::fabs(amax) <= kFp32Max)) return 1.0f;  // 0, inf, NaN
#ifdef __CUDA_ARCH__
  float scale = __fdiv_rn(fp8_max, amax);
#else
  float scale = fp8_max / amax;
#endif
  if (std::isinf(scale)) scale = value_for_inf;
  if (force_pow2) scale = bit_cast_value<float>(bit_cast_value<uint32_t>(scale) & 0xFF800000u);
  return scale;
}

}  // namespace te
