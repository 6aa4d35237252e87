// NVFP4 element and scale arithmetic shared by the CPU and CUDA backends (host
// and device code). The formulas and their order are specified once, in
// te/nvfp4.h; these functions are that text in code.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/numerics.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace te::nvfp4 {

constexpr int kBlock = 16;                     // elements per block (and tile side)
constexpr float kGlobalEncodeNumerator = 2688.0f;  // 448 (E4M3 max) * 6 (E2M1 max)
constexpr float kRcp6 = 1.0f / 6.0f;           // the FP32 constant the reference multiplies by

TE_HD float fp32_div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);  // IEEE division whatever the compiler flags
#else
  return a / b;
#endif
}

// min that ignores NaN, as fminf.
TE_HD float fmin_ignore_nan(float a, float b) {
#ifdef __CUDA_ARCH__
  return fminf(a, b);
#else
  return std::fmin(a, b);
#endif
}

// S_enc from the direction's global amax.
TE_HD float global_encode_scale(float amax) {
  const float s = fmin_ignore_nan(fp32_div(kGlobalEncodeNumerator, amax), kFp32Max);
  return (amax == 0.0f || s == 0.0f) ? 1.0f : s;
}

// S_dec = 1 / S_enc.
TE_HD float global_decode_scale(float s_enc) { return fp32_div(1.0f, s_enc); }

// The stored E4M3 block scale s_b. The argument is never NaN (block amaxes
// skip NaN, S_enc is finite), so the hardware conversion (RNE, saturating)
// gives the bytes of the software one.
TE_HD uint8_t block_scale(float block_amax, float s_enc) {
  const float v = fmin_ignore_nan(block_amax * (s_enc * kRcp6), kFp32Max);
#ifdef __CUDA_ARCH__
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
#else
  return float_to_fp8(v, kE4M3);
#endif
}

// float(s_b) * S_dec: the factor dequantization multiplies by. A NaN byte
// (0x7F, 0xFF; never written by the quantizer, possible in a caller's buffer)
// gives the NaN 0x7FC00000 with the byte's sign, the same bits everywhere.
TE_HD float block_decode_factor(uint8_t s_b, float s_dec) {
  if ((s_b & 0x7F) == 0x7F) return bit_cast_value<float>((s_b & 0x80) ? 0xFFC00000u : 0x7FC00000u);
#ifdef __CUDA_ARCH__
  const float scale = __half2float(__half(__nv_cvt_fp8_to_halfraw(s_b, __NV_E4M3)));  // exact
#else
  const float scale = fp8_to_float(s_b, kE4M3);
#endif
  return scale * s_dec;
}

// enc_b = min(1 / (float(s_b) * S_dec), FLT_MAX); 1/0 = inf -> FLT_MAX.
TE_HD float block_encode_factor(uint8_t s_b, float s_dec) {
  return fmin_ignore_nan(fp32_div(1.0f, block_decode_factor(s_b, s_dec)), kFp32Max);
}

constexpr uint8_t kE2M1NaNCode = 0x7;  // NaN -> +6, as cvt.rn.satfinite.e2m1x2.f32

// E2M1 code of v, round to nearest even, saturating; NaN -> +6. As
// thresholds: |v| <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, < 1.75 -> 1.5,
// <= 2.5 -> 2, < 3.5 -> 3, <= 5 -> 4, else 6 (ties go to the even code).
// Computed with few instructions (this is the kernels' inner loop): clamp to
// [-6, 6] (NaN -> 6), then round |y| to the E2M1 step of its binade (0.5
// below 2, 1 in [2, 4), 2 in [4, 6]) by adding 1.5 * 2^23 * step, whose ulp
// is the step: the FP32 addition rounds to nearest even. The number of steps
// q and the binade give the code. Checked against the thresholds for all
// 2^32 inputs.
TE_HD uint8_t float_to_e2m1(float v) {
  float y = v < 6.0f ? v : 6.0f;  // NaN -> 6 (any NaN: no fminf quirks with signalling NaNs)
  y = y > -6.0f ? y : -6.0f;
  const uint32_t bits = bit_cast_value<uint32_t>(y);
  uint32_t exponent = (bits >> 23) & 0xFFu;  // biased exponent of |y|
  exponent = exponent < 127u ? 127u : exponent;  // |y| < 2 rounds in steps of 0.5 like [1, 2)
  const uint32_t magic = (exponent << 23) + 0x0B400000u;  // 1.5 * 2^22 * 2^(exponent - 127)
  const uint32_t sum = bit_cast_value<uint32_t>(std::fabs(y) + bit_cast_value<float>(magic));
  // steps = sum - magic (|y| / step, rounded); code = steps + 2 * (exponent - 127),
  // folded into one multiply-add: binade 127 gives codes 0..4, 128 4..6, 129 6..7.
  const uint32_t code = sum - exponent * 0x7FFFFEu - (0x0B400000u + 254u);
  return static_cast<uint8_t>(((bits >> 28) & 0x8u) | code);
}

// Stochastic rounding of v with the 32-bit random word r (see te/nvfp4.h).
TE_HD uint8_t float_to_e2m1_stochastic(float v, uint32_t r) {
  if (v != v) return kE2M1NaNCode;
  const uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
  const float a = std::fabs(v);
  if (a >= 6.0f) return static_cast<uint8_t>(sign | 0x7);
  // The lower neighbour lo (code lo_code) and 1 / (hi - lo); all exact.
  int lo_code;
  float lo, inv_step;
  if (a < 2.0f) {  // 0, 0.5, 1, 1.5: spacing 0.5
    lo_code = static_cast<int>(a * 2.0f);
    lo = static_cast<float>(lo_code) * 0.5f;
    inv_step = 2.0f;
  } else if (a < 4.0f) {  // 2, 3: spacing 1
    lo = a < 3.0f ? 2.0f : 3.0f;
    lo_code = a < 3.0f ? 4 : 5;
    inv_step = 1.0f;
  } else {  // 4: spacing 2 up to 6
    lo = 4.0f;
    lo_code = 6;
    inv_step = 0.5f;
  }
  const float frac = (a - lo) * inv_step;  // exact: a - lo by Sterbenz, inv_step a power of 2
  const bool up = static_cast<double>(r) < static_cast<double>(frac) * 4294967296.0;
  return static_cast<uint8_t>(sign | (lo_code + (up ? 1 : 0)));
}

// Value of an E2M1 code (the low 4 bits of c).
TE_HD float e2m1_to_float(uint8_t c) {
  const int m = c & 0x7;
  // 0, 0.5, 1, 1.5 for codes 0-3 (m / 2); 2, 3, 4, 6 for codes 4-7.
  // codes 4-7: (2 or 3) * (1 or 2), i.e. 2, 3, 4, 6
  const float magnitude = m < 4 ? static_cast<float>(m) * 0.5f
                                : static_cast<float>((2 + (m & 1)) << ((m >> 1) - 2));
  return (c & 0x8) ? -magnitude : magnitude;
}

// One dequantized element, float(q) * factor. A NaN factor is returned as it
// is (GPUs would replace it by their canonical NaN).
TE_HD float dequantize_element(uint8_t code, float factor) {
  return factor != factor ? factor : e2m1_to_float(code) * factor;
}

// Block amax: max |x| with NaN skipped (fmax keeps the non-NaN operand).
TE_HD float abs_max(float running, float x) {
#ifdef __CUDA_ARCH__
  return fmaxf(running, fabsf(x));
#else
  return std::fmax(running, std::fabs(x));
#endif
}

// max |v_i| of a block, NaN skipped.
TE_HD float block_abs_max(const float v[kBlock]) {
  float m = 0.0f;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 0; i < kBlock; ++i) m = abs_max(m, v[i]);
  return m;
}

// The 16 codes of a block, q_i = e2m1(v_i * enc_b) (stochastic when random,
// 16 words, is given), packed: element i in bits 4i..4i+3, so byte i/2 holds
// element i in its low nibble when i is even.
TE_HD uint64_t encode_block(const float v[kBlock], float enc_b, const uint32_t* random) {
  uint32_t word[2] = {0, 0};  // elements 0-7 and 8-15
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 0; i < kBlock; ++i) {
    const float x = v[i] * enc_b;
    const uint32_t code = random ? float_to_e2m1_stochastic(x, random[i]) : float_to_e2m1(x);
    word[i / 8] += code << (4 * (i % 8));  // disjoint nibbles: + is |, and one shift-add
  }
  return (static_cast<uint64_t>(word[1]) << 32) | word[0];
}

constexpr int64_t round_up(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

// Padded scale-buffer shape for data [rows, cols] with blocks along cols.
struct ScaleShape {
  int64_t rows, cols;
};
constexpr ScaleShape scale_shape(int64_t rows, int64_t cols) {
  return ScaleShape{round_up(rows, 128), round_up(cols / kBlock, 4)};
}

}  // namespace te::nvfp4
