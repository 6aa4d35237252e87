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

// float -> FP8: round to nearest even, saturate to +-max_finite (inf too),
// NaN -> 0x7F. Denormals of the FP8 format are produced, never flushed.
TE_HD uint8_t float_to_fp8(float x, const Fp8Format& f) {
  if (x != x) return kFp8CanonicalNaN;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= f.max_finite) return sign | f.max_code;
  if (a == 0.0f) return sign;
  const int min_normal_exp = 1 - f.exponent_bias;  // exponent of the smallest normal
  int exp;
  std::frexp(a, &exp);  // a = m * 2^exp, m in [0.5, 1): floor(log2 a) = exp - 1
  int unit_exp = (exp - 1 < min_normal_exp ? min_normal_exp : exp - 1) - f.mantissa_bits;
  // a / 2^unit_exp is exact; rint rounds half to even.
  const float units = std::rint(std::ldexp(a, -unit_exp));
  const float v = std::ldexp(units, unit_exp);
  if (v >= f.max_finite) return sign | f.max_code;
  if (v == 0.0f) return sign;  // rounded down to (signed) zero
  std::frexp(v, &exp);
  if (exp - 1 < min_normal_exp) {  // denormal: code = v / 2^(min_normal_exp - mantissa_bits)
    return sign | static_cast<uint8_t>(std::ldexp(v, f.mantissa_bits - min_normal_exp));
  }
  const int biased = exp - 1 + f.exponent_bias;
  const int mantissa =
      static_cast<int>(std::ldexp(v, f.mantissa_bits - (exp - 1))) - (1 << f.mantissa_bits);
  return sign | static_cast<uint8_t>((biased << f.mantissa_bits) | mantissa);
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
