// Packed-word helpers of the fast NVFP4 quantize kernel's common route
// (cuda_quantize_fast.cuh, the kPacked candidates): 16-bit input words of two
// elements each, round to nearest even. Host and device code, so that
// core/tests/nvfp4_packed_check.cpp can check them on the CPU against the
// formulas of formulas.h (the device versions of the two PTX helpers are
// checked on the GPU by bench/kernels/nvfp4_quantize_variants.cu).
//
// The common block, and why it needs fewer instructions than formulas.h's
// general route with the same bytes:
//  - block amax: max(|a|, |b|) of 16-bit pairs, two elements per instruction
//    (max.NaN.xorsign.abs.{bf16x2,f16x2}); the max of 16-bit values is exact,
//    only the block max is widened. It propagates NaN, so a NaN block is seen.
//  - a block is "small" when amax * enc_b < 7 (FP32 product, a NaN amax fails
//    the test). Then every y_i = x_i * enc_b has |y_i| <= RN(amax * enc_b) < 7
//    (rounding is monotone) and no y_i is NaN, so:
//      * the min-of-three magnitude code (formulas.h, e2m1_nearest_min3_biased)
//        needs no saturation: for a in [6, 7), s_3 = 4 + RNE(a / 2) = 7 is
//        already the smallest sum;
//      * the sign of each code is the sign bit of its input element (x_i * enc_b
//        keeps x_i's sign: enc_b is positive and finite; only a NaN x_i, whose
//        code is +6, breaks this, and it makes the block not small), gathered
//        by byte permutes for 8 elements at once.
//    Other blocks (saturation, infinities, NaN) take formulas.h's route.
#pragma once

#include <cstdint>
#include <type_traits>

#include "nvfp4/formulas.h"
#include "runtime/numerics.h"

namespace te::nvfp4::packed {

// The 16-bit input formats, as tags usable on the host.
struct Bf16Bits {};
struct Fp16Bits {};

// prmt.b32 in its default mode: byte k of the result is byte n_k (nibble k of
// sel, bits 0-2) of the 8 bytes {b, a} (a = bytes 0-3); bit 3 of the nibble
// replaces the byte by copies of its top bit.
TE_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t bytes = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t n = (sel >> (4 * k)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(bytes >> (8 * (n & 7u))) & 0xFFu;
    if (n & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    d |= byte << (8 * k);
  }
  return d;
#endif
}

// The two elements of a word (element 0 in the low half) as FP32, exactly.
TE_HD float low_float(uint32_t w, Bf16Bits) { return bit_cast_value<float>(w << 16); }
TE_HD float high_float(uint32_t w, Bf16Bits) { return bit_cast_value<float>(w & 0xFFFF0000u); }
TE_HD float low_float(uint32_t w, Fp16Bits) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
#else
  return fp16_to_float(static_cast<uint16_t>(w & 0xFFFFu));
#endif
}
TE_HD float high_float(uint32_t w, Fp16Bits) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
#else
  return fp16_to_float(static_cast<uint16_t>(w >> 16));
#endif
}

// The bits of +infinity: a 16-bit magnitude above them is a NaN.
constexpr uint32_t infinity_bits(Bf16Bits) { return 0x7F80u; }
constexpr uint32_t infinity_bits(Fp16Bits) { return 0x7C00u; }

// Per half: max(|a|, |b|), or a NaN when either is NaN. The sign bits of the
// result are not meaningful (the hardware writes the XOR of the operands').
template <class Fmt>
TE_HD uint32_t abs_max_nan2(uint32_t a, uint32_t b, Fmt fmt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
  uint32_t d;
  if constexpr (std::is_same_v<Fmt, Bf16Bits>)
    asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  else
    asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  (void)fmt;
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t x = (a >> (16 * h)) & 0x7FFFu, y = (b >> (16 * h)) & 0x7FFFu;
    // Non-negative 16-bit floats order as their bits; NaNs are above infinity.
    const uint32_t inf = infinity_bits(fmt);
    const uint32_t m = (x > inf || y > inf) ? 0x7FFFu : (x > y ? x : y);
    d |= m << (16 * h);
  }
  return d;
#endif
}

// max(a, b), NaN when either is NaN.
TE_HD float max_nan(float a, float b) {
#ifdef __CUDA_ARCH__
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return (a != a || b != b) ? a + b : (a > b ? a : b);
#endif
}

// Halfwise abs max of n words (a tree: independent instructions).
template <int kWords, class Fmt>
TE_HD uint32_t words_abs_max_nan(const uint32_t* w, Fmt fmt) {
  static_assert(kWords == 8 || kWords == 16, "a tree over 8 or 16 words");
  uint32_t m[kWords / 2];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 0; i < kWords / 2; ++i) m[i] = abs_max_nan2(w[2 * i], w[2 * i + 1], fmt);
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int n = kWords / 4; n >= 1; n /= 2) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int i = 0; i < n; ++i) m[i] = abs_max_nan2(m[i], m[i + n], fmt);
  }
  return m[0];
}

// Amax of a rowwise block (8 words, 16 consecutive elements); NaN when the
// block holds a NaN.
template <class Fmt>
TE_HD float row_block_abs_max_nan(const uint32_t w[8], Fmt fmt) {
  const uint32_t m = words_abs_max_nan<8>(w, fmt);
  return max_nan(std::fabs(low_float(m, fmt)), std::fabs(high_float(m, fmt)));
}

// Whether the block with this amax and enc_b takes the small-block route.
TE_HD bool small_block(float block_amax, float enc_b) { return block_amax * enc_b < 7.0f; }

constexpr uint32_t kMin3Bias8 = kE2M1Min3Bias * 0x11111111u;  // the bias of 8 packed codes

// The magnitude codes of x_i * enc_b for 8 elements of a small block, element
// i in bits 4i..4i+3, plus kMin3Bias8 (mod 2^32; codes 0..7: no carries).
TE_HD uint32_t small_magnitudes8(const float x[8], float enc_b) {
  uint32_t word = 0;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 7; i >= 0; --i) word = (word << 4) + e2m1_min3_biased_unsaturated(x[i] * enc_b);
  return word;
}

// Sign bytes: byte_perm(a, b, kSignPairs) = [a.lo, b.lo, a.hi, b.hi], each
// byte 0xFF when that 16-bit element is negative, else 0.
constexpr uint32_t kSignPairs = 0xFBD9u;
// Bytes 0, 1 of each of two words, and bytes 2, 3.
constexpr uint32_t kLowPairs = 0x5410u;
constexpr uint32_t kHighPairs = 0x7632u;

// The sign bits of 8 codes (bit 4i + 3 for element i) from sign bytes of the
// even elements (byte b: element 2b) and of the odd ones (byte b: 2b + 1).
TE_HD uint32_t sign_nibbles(uint32_t even, uint32_t odd) {
  return (even & 0x08080808u) | (odd & 0x80808080u);
}

// The packed codes (element i in bits 4i..4i+3) from biased magnitudes and signs.
TE_HD uint32_t with_signs(uint32_t biased_magnitudes, uint32_t signs) {
  return biased_magnitudes + signs - kMin3Bias8;  // one three-input add
}

// A small rowwise block: 8 words of 16 consecutive elements -> 16 codes.
template <class Fmt>
TE_HD uint64_t small_row_block(const uint32_t w[8], float enc_b, Fmt fmt) {
  uint32_t half[2];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int h = 0; h < 2; ++h) {
    const uint32_t* v = w + 4 * h;
    float x[8];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int j = 0; j < 4; ++j) {
      x[2 * j] = low_float(v[j], fmt);
      x[2 * j + 1] = high_float(v[j], fmt);
    }
    // a = [e0, e2, e1, e3], b = [e4, e6, e5, e7] (sign bytes).
    const uint32_t a = byte_perm(v[0], v[1], kSignPairs), b = byte_perm(v[2], v[3], kSignPairs);
    half[h] = with_signs(small_magnitudes8(x, enc_b),
                         sign_nibbles(byte_perm(a, b, kLowPairs), byte_perm(a, b, kHighPairs)));
  }
  return (static_cast<uint64_t>(half[1]) << 32) | half[0];
}

// The signs of 8 rows of two columns: words w[i] = row i (column 0 in the low
// half) -> the sign bits of column 0's 8 codes and of column 1's.
TE_HD void column_signs8(const uint32_t w[8], uint32_t& signs0, uint32_t& signs1) {
  const uint32_t a = byte_perm(w[0], w[2], kSignPairs);  // [c0 r0, c0 r2, c1 r0, c1 r2]
  const uint32_t b = byte_perm(w[4], w[6], kSignPairs);  // rows 4, 6
  const uint32_t c = byte_perm(w[1], w[3], kSignPairs);  // rows 1, 3
  const uint32_t d = byte_perm(w[5], w[7], kSignPairs);  // rows 5, 7
  signs0 = sign_nibbles(byte_perm(a, b, kLowPairs), byte_perm(c, d, kLowPairs));
  signs1 = sign_nibbles(byte_perm(a, b, kHighPairs), byte_perm(c, d, kHighPairs));
}

// Small columnwise blocks of two columns: 16 words (row i: column 0 in the
// low half) -> the 16 codes of each column.
template <class Fmt>
TE_HD void small_column_blocks(const uint32_t w[16], float enc0, float enc1, Fmt fmt,
                               uint64_t& codes0, uint64_t& codes1) {
  uint32_t out0[2], out1[2];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int h = 0; h < 2; ++h) {
    const uint32_t* v = w + 8 * h;
    float x0[8], x1[8];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int i = 0; i < 8; ++i) {
      x0[i] = low_float(v[i], fmt);
      x1[i] = high_float(v[i], fmt);
    }
    uint32_t s0, s1;
    column_signs8(v, s0, s1);
    out0[h] = with_signs(small_magnitudes8(x0, enc0), s0);
    out1[h] = with_signs(small_magnitudes8(x1, enc1), s1);
  }
  codes0 = (static_cast<uint64_t>(out0[1]) << 32) | out0[0];
  codes1 = (static_cast<uint64_t>(out1[1]) << 32) | out1[0];
}

}  // namespace te::nvfp4::packed
