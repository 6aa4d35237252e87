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

constexpr int kBlock = 16;                         // elements per block (and tile side)
constexpr float kGlobalEncodeNumerator = 2688.0f;  // 448 (E4M3 max) * 6 (E2M1 max)
constexpr float kRcp6 = 1.0f / 6.0f;               // the FP32 constant the reference multiplies by

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

// The stored E4M3 block scale s_b. Block amaxes that skip NaN and a finite
// S_enc keep the product finite, so the hardware conversion (RNE, saturating)
// gives the bytes of the software one. (The fast kernel's packed route also
// passes a NaN block amax, before it sends that block to the general route:
// fmin_ignore_nan makes it FLT_MAX, byte 0x7E on both sides, and it is unused.)
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

// ---- E2M1 encoding -------------------------------------------------------
// The kernels' inner loop, so computed with few instructions. For y = x * enc_b:
//   a     = min(|y|, 6)                 NaN -> 6 (saturation)
//   e     = max(exponent field of a, 127)
//           |y| < 2 rounds in steps of 0.5, like [1, 2); the step of binade e
//           is 2^(e - 128): 0.5 below 2, 1 in [2, 4), 2 in [4, 6]
//   magic = 1.5 * 2^(e - 105)           bits (e << 23) + 0x0B400000; its ulp is the step
//   sum   = a + magic                   the FP32 addition rounds a to a multiple of
//                                       the step, nearest even (q steps: sum = magic + q ulps)
//   code  = q + 2 * (e - 127) = bits(sum) - e * (2^23 - 2) - kE2M1CodeBias
//           binade 127 gives codes 0..4, 128 gives 4..6, 129 gives 6..7
//   sign  = sign bit of min(y, 6)       the sign of y, NaN -> +
// Stochastic rounding: the same sum rounded toward zero is magic + lo (lo the
// lower neighbour, its code as above); the word r rounds up when
// r < ceil((a - lo) / step * 2^32), that is r < frac * 2^32 exactly.
// Both routines equal te/nvfp4.h's definitions on all 2^32 inputs (and, for
// stochastic rounding, every r): core/tests/nvfp4_e2m1_exhaustive.cpp.
constexpr uint32_t kE2M1MagicBase = 0x0B400000u;                  // magic bits = (e << 23) + this
constexpr uint32_t kE2M1CodeBias = kE2M1MagicBase + 2u * 127u;    // code = biased code - this
constexpr uint32_t kE2M1CodeBias8 = kE2M1CodeBias * 0x11111111u;  // the bias of 8 packed codes

TE_HD float e2m1_clamp_abs(float y) {
  const float a = std::fabs(y);
  return a < 6.0f ? a : 6.0f;  // NaN -> 6 (any NaN: no fminf quirks with signalling NaNs)
}

TE_HD uint32_t e2m1_binade(float a) {  // a >= 0
#ifdef __CUDA_ARCH__
  // bits >> 23 as a multiply-high: the integer multiply pipe is less busy than the shift one.
  const uint32_t e = __umulhi(bit_cast_value<uint32_t>(a), 512u);
#else
  const uint32_t e = bit_cast_value<uint32_t>(a) >> 23;
#endif
  return e < 127u ? 127u : e;
}

TE_HD float e2m1_magic(uint32_t e) { return bit_cast_value<float>((e << 23) + kE2M1MagicBase); }

// The code of a sum a + magic (a rounded to a multiple of the step), plus
// kE2M1CodeBias modulo 2^32.
TE_HD uint32_t e2m1_biased_code(float sum, uint32_t e) {
  return bit_cast_value<uint32_t>(sum) - e * 0x7FFFFEu;
}

// Bit 31: the sign of the code of y (NaN -> +).
TE_HD uint32_t e2m1_sign_word(float y) { return bit_cast_value<uint32_t>(y < 6.0f ? y : 6.0f); }

// The same for a product y = x * enc_b. On the GPU a NaN product is always
// the positive 0x7FFFFFFF (CUDA Programming Guide, "Floating-Point Standard":
// single-precision results involving NaN inputs are the quiet NaN 0x7fffffff),
// so y's own sign bit is the code's; the CPU keeps the NaN operand's sign.
TE_HD uint32_t e2m1_product_sign_word(float y) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(y);
#else
  return e2m1_sign_word(y);
#endif
}

// Magnitude code of y, round to nearest even, plus kE2M1CodeBias.
TE_HD uint32_t e2m1_nearest_biased(float y) {
  const float a = e2m1_clamp_abs(y);
  const uint32_t e = e2m1_binade(a);
  return e2m1_biased_code(a + e2m1_magic(e), e);
}

// a + magic rounded toward zero: magic + lo, lo = floor(a / step) * step.
TE_HD float e2m1_add_round_down(float a, float magic) {
#ifdef __CUDA_ARCH__
  return __fadd_rz(a, magic);
#else
  const float sum = a + magic;  // nearest: one ulp too high when it rounded up
  return sum - magic > a ? bit_cast_value<float>(bit_cast_value<uint32_t>(sum) - 1u) : sum;
#endif
}

// Magnitude code of y rounded stochastically with the word r, plus kE2M1CodeBias.
TE_HD uint32_t e2m1_stochastic_biased(float y, uint32_t r) {
  const float a = e2m1_clamp_abs(y);
  const uint32_t e = e2m1_binade(a);
  const float magic = e2m1_magic(e);
  const float down = e2m1_add_round_down(a, magic);
  const float lo = down - magic;  // exact: both are multiples of the step in one binade
  // (a - lo) * 2^32 / step, exact (a - lo is exact, 2^(160 - e) a power of two);
  // below 2^32. Its ceiling is the number of words that round up.
  const float scaled = (a - lo) * bit_cast_value<float>((287u - e) << 23);
#ifdef __CUDA_ARCH__
  const uint32_t up_words = __float2uint_ru(scaled);
#else
  const uint32_t up_words = static_cast<uint32_t>(std::ceil(scaled));
#endif
  return e2m1_biased_code(down, e) + (r < up_words ? 1u : 0u);
}

// The same magnitude code by another route, with fewer integer operations
// (the fast CUDA kernel's; cuda_quantize_fast.cuh). With a = |y| and the magic
// M = 1.5 * 2^22 (ulp 0.5), three sums in M's binade round a once each:
//   s_1 = a + M               bits(s_1) - bits(M) = RNE(2a)       (step 0.5)
//   s_2 = fma(a, 1/2, M + 1)  bits(s_2) - bits(M) = RNE(a) + 2    (step 1)
//   s_3 = fma(a, 1/4, M + 2)  bits(s_3) - bits(M) = RNE(a/2) + 4  (step 2)
// (M + 1, M + 2: even numbers of ulps, so ties still go to even.) Each is the
// code when a lies in its step's range and larger otherwise, so
//   code = min(bits(s_1), bits(s_2), bits(s_3), bits(M) + 7) - bits(M)
// (the 7 saturates; a larger a, infinity or NaN makes every sum larger).
constexpr float kE2M1Min3Magic = 6291456.0f;     // 1.5 * 2^22
constexpr uint32_t kE2M1Min3Bias = 0x4AC00000u;  // bits(kE2M1Min3Magic)

// bits(s_1), bits(s_2), bits(s_3) of |y|.
struct Min3Sums {
  uint32_t s1, s2, s3;
};
TE_HD Min3Sums e2m1_min3_sums(float y) {
  const float a = std::fabs(y);
#ifdef __CUDA_ARCH__
  return {__float_as_uint(a + kE2M1Min3Magic),
          __float_as_uint(__fmaf_rn(a, 0.5f, kE2M1Min3Magic + 1.0f)),
          __float_as_uint(__fmaf_rn(a, 0.25f, kE2M1Min3Magic + 2.0f))};
#else
  return {bit_cast_value<uint32_t>(a + kE2M1Min3Magic),
          bit_cast_value<uint32_t>(std::fma(a, 0.5f, kE2M1Min3Magic + 1.0f)),
          bit_cast_value<uint32_t>(std::fma(a, 0.25f, kE2M1Min3Magic + 2.0f))};
#endif
}

TE_HD uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

TE_HD uint32_t e2m1_nearest_min3_biased(float y) {
  const Min3Sums s = e2m1_min3_sums(y);
  return min_u32(min_u32(s.s1, s.s2), min_u32(s.s3, kE2M1Min3Bias + 7u));
}

// The minimum without the saturating 7: the code plus bits(M) where |y| < 7
// and y is not NaN (for a in [6, 7), s_3 already gives 7), so callers that
// know that (the fast kernel's small blocks, nvfp4/packed.h) skip it.
TE_HD uint32_t e2m1_min3_biased_unsaturated(float y) {
  const Min3Sums s = e2m1_min3_sums(y);
  return min_u32(min_u32(s.s1, s.s2), s.s3);
}

// (hi << 4) | (lo >> 28): one funnel shift on the GPU.
TE_HD uint32_t shift_in_top_nibble(uint32_t hi, uint32_t lo) {
#ifdef __CUDA_ARCH__
  return __funnelshift_l(lo, hi, 4);
#else
  return (hi << 4) | (lo >> 28);
#endif
}

// E2M1 code of v, round to nearest even, saturating; NaN -> +6. As
// thresholds: |v| <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, < 1.75 -> 1.5,
// <= 2.5 -> 2, < 3.5 -> 3, <= 5 -> 4, else 6 (ties go to the even code).
TE_HD uint8_t float_to_e2m1(float v) {
  return static_cast<uint8_t>(((e2m1_sign_word(v) >> 28) & 0x8u) |
                              (e2m1_nearest_biased(v) - kE2M1CodeBias));
}

// Stochastic rounding of v with the 32-bit random word r (see te/nvfp4.h).
TE_HD uint8_t float_to_e2m1_stochastic(float v, uint32_t r) {
  return static_cast<uint8_t>(((e2m1_sign_word(v) >> 28) & 0x8u) |
                              (e2m1_stochastic_biased(v, r) - kE2M1CodeBias));
}

// The codes of y_i = v_i * enc_b for 8 values, packed: element i in bits
// 4i..4i+3 (byte i/2 holds element i in its low nibble when i is even).
// Stochastic when kStochastic, with the words random[0..7]; kMin3: round to
// nearest by e2m1_nearest_min3_biased (same codes, other instruction mix).
template <bool kStochastic, bool kMin3 = false>
TE_HD uint32_t encode8(const float v[8], float enc_b, const uint32_t* random) {
  constexpr uint32_t kBias8 = kMin3 ? kE2M1Min3Bias * 0x11111111u : kE2M1CodeBias8;
  uint32_t word = 0;   // sum of biased codes << 4i: the codes are 0..7, so no carries
  uint32_t signs = 0;  // the top 4 bits of element i's sign word in nibble i
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 7; i >= 0; --i) {
    const float y = v[i] * enc_b;
    const uint32_t biased = kStochastic ? e2m1_stochastic_biased(y, random[i])
                            : kMin3     ? e2m1_nearest_min3_biased(y)
                                        : e2m1_nearest_biased(y);
    word += biased << (4 * i);
    signs = shift_in_top_nibble(signs, e2m1_product_sign_word(y));
  }
  return (word - kBias8) | (signs & 0x88888888u);
}

// Value of an E2M1 code (the low 4 bits of c).
TE_HD float e2m1_to_float(uint8_t c) {
  const int m = c & 0x7;
  // 0, 0.5, 1, 1.5 for codes 0-3 (m / 2); 2, 3, 4, 6 for codes 4-7.
  // codes 4-7: (2 or 3) * (1 or 2), i.e. 2, 3, 4, 6
  const float magnitude =
      m < 4 ? static_cast<float>(m) * 0.5f : static_cast<float>((2 + (m & 1)) << ((m >> 1) - 2));
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
  const uint32_t lo = random ? encode8<true>(v, enc_b, random) : encode8<false>(v, enc_b, nullptr);
  const uint32_t hi =
      random ? encode8<true>(v + 8, enc_b, random + 8) : encode8<false>(v + 8, enc_b, nullptr);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

constexpr int64_t round_up(int64_t v, int64_t multiple) {
  return (v + multiple - 1) / multiple * multiple;
}

// Padded scale-buffer shape for data [rows, cols] with blocks along cols.
struct ScaleShape {
  int64_t rows, cols;
};
constexpr ScaleShape scale_shape(int64_t rows, int64_t cols) {
  return ScaleShape{round_up(rows, 128), round_up(cols / kBlock, 4)};
}

}  // namespace te::nvfp4
