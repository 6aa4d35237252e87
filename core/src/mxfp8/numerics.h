// MXFP8 block-scale arithmetic shared by the CPU backend and the CUDA kernels
// (host and device). te/mxfp8.h states the formulas; this is their bit-level form.
#pragma once

#include <cstdint>

#include "runtime/numerics.h"
#include "swizzle/layout.h"

namespace te::mxfp8 {

constexpr int64_t kBlock = 32;

// fl32(1 / fp8_max), the constant the block amax is multiplied by.
constexpr float kE4M3MaxReciprocal = static_cast<float>(1.0 / 448.0);
constexpr float kE5M2MaxReciprocal = static_cast<float>(1.0 / 57344.0);

// The smallest E8M0 byte e with 2^(e-127) >= v, for v = amax * reciprocal >= 0:
// take the FP32 exponent field and add 1 when the mantissa is non-zero. Written
// with selects, not branches: the CUDA kernels evaluate it once per block.
TE_HD uint8_t e8m0_round_up(float v) {
  const uint32_t bits = bit_cast_value<uint32_t>(v) & 0x7FFFFFFFu;
  const uint32_t exponent = bits >> 23;
  const uint32_t mantissa = bits & 0x7FFFFFu;
  // Exponent 0xFE with a non-zero mantissa would round to 0xFF (NaN): saturate.
  uint32_t e = exponent + ((mantissa != 0 && exponent < 0xFE) ? 1u : 0u);
  // 0 or subnormal: 2^-127 (byte 0) is the subnormal with mantissa 0x400000.
  e = exponent == 0 ? (mantissa > 0x400000u ? 1u : 0u) : e;
  e = bits == 0x7F800000u ? 0xFEu : e;  // inf saturates to the largest finite scale
  e = bits > 0x7F800000u ? 0xFFu : e;   // NaN (never from a NaN-skipping amax)
  return static_cast<uint8_t>(e);
}

// 2^(127 - e), the factor applied before the FP8 cast; exact for every e <= 254
// (2^127 for e = 0, the subnormal 2^-127 for e = 254). NaN for e = 255.
TE_HD float quantize_factor(uint8_t e) {
  const uint32_t normal = static_cast<uint32_t>(254 - e) << 23;
  return bit_cast_value<float>(e == 0xFF ? 0x7FC00000u : e == 0xFE ? 0x00400000u : normal);
}

// 2^(e - 127), the decode factor (2^-127 for e = 0, NaN for e = 255).
TE_HD float dequantize_factor(uint8_t e) {
  if (e == 0xFF) return bit_cast_value<float>(0x7FC00000u);
  if (e == 0) return bit_cast_value<float>(0x00400000u);
  return bit_cast_value<float>(static_cast<uint32_t>(e) << 23);
}

// Where the scale of a block lives in a padded [scale_rows, scale_cols] buffer.
// Rowwise block (row r, K-block j); columnwise block (row-block i, column c).
TE_HD int64_t rowwise_scale_offset(int64_t r, int64_t j, int64_t scale_cols, bool swizzled) {
  return swizzled ? swizzle::swizzled_offset(r, j, scale_cols) : r * scale_cols + j;
}
TE_HD int64_t columnwise_scale_offset(int64_t i, int64_t c, int64_t scale_rows, int64_t scale_cols,
                                      bool swizzled) {
  return swizzled ? swizzle::swizzled_offset(c, i, scale_rows) : i * scale_cols + c;
}

// Padded scale shapes for an [m, k] matrix view (te/mxfp8.h).
inline int64_t round_up(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}
inline void rowwise_scale_shape(int64_t m, int64_t k, int64_t* rows, int64_t* cols) {
  *rows = round_up(m, 128);
  *cols = round_up(k / kBlock, 4);
}
inline void columnwise_scale_shape(int64_t m, int64_t k, int64_t* rows, int64_t* cols) {
  *rows = round_up(m / kBlock, 4);
  *cols = round_up(k, 128);
}

}  // namespace te::mxfp8
