// Host check of core/src/nvfp4/packed.h (the fast NVFP4 quantize kernel's
// common route) against formulas.h, the executable spec. No GPU:
//
//   g++ -O2 -std=c++17 -I core/src -I core/include core/tests/nvfp4_packed_check.cpp \
//       -o /tmp/nvfp4_packed_check && /tmp/nvfp4_packed_check
//
//  1. Exhaustive over elements: every 16-bit input (BF16 and FP16) times
//     every enc_b the quantizer can use for a set of global scales (all block
//     scales s_b) plus random FP32 factors: wherever |x * enc_b| < 7 and x is
//     not NaN (the small-block condition), the unsaturated min-of-three code
//     and the input's sign bit give float_to_e2m1(x * enc_b).
//  2. Whole blocks, random and hostile (NaN of both signs, infinities, zeros
//     of both signs, denormals, E2M1 ties, scales from 2^-130 to 2^120),
//     rowwise (8 words) and columnwise (16 words of two columns), composed as
//     the kernel composes them: wherever the packed route says "small", its
//     scale byte and codes equal formulas.h's (block_abs_max, block_scale,
//     block_encode_factor, encode_block); NaN and saturating blocks must not
//     be small. The device's PTX versions of the two packed primitives are
//     checked on the GPU (bench/kernels/run_nvfp4_variants.sh).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "nvfp4/packed.h"

namespace {

using namespace te::nvfp4;
using namespace te::nvfp4::packed;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

float to_float(uint16_t h, Bf16Bits) { return te::bf16_to_float(h); }
float to_float(uint16_t h, Fp16Bits) { return te::fp16_to_float(h); }
uint16_t from_float(float f, Bf16Bits) { return te::float_to_bf16(f); }
uint16_t from_float(float f, Fp16Bits) { return te::float_to_fp16(f); }
bool is_nan16(uint16_t h, Bf16Bits) { return (h & 0x7FFF) > 0x7F80; }
bool is_nan16(uint16_t h, Fp16Bits) { return (h & 0x7FFF) > 0x7C00; }

long failures = 0;
void fail(const char* what, double a, double b, uint32_t x, uint32_t y) {
  if (++failures <= 20) std::printf("FAIL %s: %g %g (%#x, %#x)\n", what, a, b, x, y);
}

// The enc_b values of all block scales for a few global amaxes, and random factors.
std::vector<float> encode_factors(std::mt19937& g) {
  std::vector<float> encs;
  for (float global_amax : {1.0f, 3.0e-5f, 448.0f * 6.0f, 1.7e3f, 0.0f, 1e-38f, 3e38f, 7.77f}) {
    const float s_dec = global_decode_scale(global_encode_scale(global_amax));
    for (int s_b = 0; s_b < 127; ++s_b) encs.push_back(block_encode_factor(uint8_t(s_b), s_dec));
  }
  std::uniform_int_distribution<uint32_t> bits(0x00800000u, 0x7F7FFFFFu);
  for (int i = 0; i < 200; ++i) encs.push_back(from_bits(bits(g)));
  return encs;
}

template <class Fmt>
void check_elements(const std::vector<float>& encs) {
  long small = 0;
  for (float enc : encs) {
    for (uint32_t h = 0; h < 65536; ++h) {
      if (is_nan16(uint16_t(h), Fmt{})) continue;
      const float x = to_float(uint16_t(h), Fmt{});
      const float y = x * enc;
      if (!(std::fabs(y) < 7.0f)) continue;
      ++small;
      const uint32_t magnitude = e2m1_min3_biased_unsaturated(y) - kE2M1Min3Bias;
      const uint32_t code = magnitude | ((h >> 12) & 0x8u);
      if (magnitude > 7 || code != float_to_e2m1(y)) fail("element", x, enc, h, code);
    }
  }
  std::printf("elements (%s): %ld small products checked\n",
              std::is_same<Fmt, Bf16Bits>::value ? "bf16" : "fp16", small);
}

// One hostile element for a block with scale 2^e.
template <class Fmt>
uint16_t hostile(int e, std::mt19937& g) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  static const float special[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f,
                                  0.5f,  1.0f,  1.5f,  2.0f,  3.0f, 4.0f, 0.0f, 6.5f, 5.5f};
  const float scale = std::ldexp(1.0f, e);
  const float p = uni(g);
  const float sign = uni(g) < 0.5f ? -1.0f : 1.0f;
  if (p < 0.70f) return from_float(normal(g) * scale, Fmt{});
  if (p < 0.90f) return from_float(special[g() % 18] * scale * sign, Fmt{});
  if (p < 0.93f) return from_float(0.0f * sign, Fmt{});
  if (p < 0.95f) return from_float(INFINITY * sign, Fmt{});
  if (p < 0.97f)
    return uint16_t((is_nan16(0x7FC1, Fmt{}) ? 0x7FC1 : 0x7E01) | (sign < 0 ? 0x8000 : 0));
  return uint16_t((g() & 0x3F) | (sign < 0 ? 0x8000 : 0));  // denormal
}

struct Reference {
  uint8_t scale;
  uint64_t codes;
  bool nan_or_saturating;
};

Reference reference(const float v[kBlock], float s_enc, float s_dec) {
  const float amax = block_abs_max(v);
  const uint8_t s_b = block_scale(amax, s_enc);
  const float enc = block_encode_factor(s_b, s_dec);
  bool special = false;
  for (int i = 0; i < kBlock; ++i) special = special || !(std::fabs(v[i] * enc) < 7.0f);
  return Reference{s_b, encode_block(v, enc, nullptr), special};
}

template <class Fmt>
void check_blocks(std::mt19937& g, int count) {
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp_dist(-130, 120);
  long small_blocks = 0, special_small = 0;
  float enc_table[128];
  for (int n = 0; n < count; ++n) {
    // A global amax near the data's, or off by far (saturation), or 0.
    const int e = uni(g) < 0.5f ? 0 : exp_dist(g);
    const float global_amax = uni(g) < 0.8f
                                  ? std::ldexp(4.0f, e) * (0.5f + uni(g))
                                  : std::ldexp(1.0f, exp_dist(g)) * (uni(g) < 0.1f ? 0.0f : 1.0f);
    const float s_enc = global_encode_scale(global_amax), s_dec = global_decode_scale(s_enc);
    for (int s_b = 0; s_b < 128; ++s_b) enc_table[s_b] = block_encode_factor(uint8_t(s_b), s_dec);
    const float clean = uni(g);  // a share of blocks without NaN or infinities
    uint16_t h[2][kBlock];
    for (int c = 0; c < 2; ++c) {
      for (int i = 0; i < kBlock; ++i) {
        uint16_t x = hostile<Fmt>(e, g);
        while (clean < 0.5f &&
               (is_nan16(x, Fmt{}) || (x & 0x7FFF) == (is_nan16(0x7FC1, Fmt{}) ? 0x7F80 : 0x7C00)))
          x = hostile<Fmt>(e, g);
        h[c][i] = x;
      }
    }
    float v[2][kBlock];
    Reference ref[2];
    for (int c = 0; c < 2; ++c) {
      for (int i = 0; i < kBlock; ++i) v[c][i] = to_float(h[c][i], Fmt{});
      ref[c] = reference(v[c], s_enc, s_dec);
    }
    // Rowwise: block c as 8 words of consecutive elements.
    for (int c = 0; c < 2; ++c) {
      uint32_t w[8];
      for (int j = 0; j < 8; ++j) w[j] = h[c][2 * j] | (uint32_t(h[c][2 * j + 1]) << 16);
      const float amax = row_block_abs_max_nan(w, Fmt{});
      const uint8_t s_b = block_scale(amax, s_enc);
      if (!small_block(amax, enc_table[s_b])) continue;
      ++small_blocks;
      special_small += ref[c].nan_or_saturating;
      const uint64_t codes = small_row_block(w, enc_table[s_b], Fmt{});
      if (s_b != ref[c].scale || codes != ref[c].codes)
        fail("row block", double(codes), double(ref[c].codes), s_b, ref[c].scale);
    }
    // Columnwise: row i = word i, block 0 in the low halves.
    uint32_t w[16];
    for (int i = 0; i < 16; ++i) w[i] = h[0][i] | (uint32_t(h[1][i]) << 16);
    const uint32_t m = words_abs_max_nan<16>(w, Fmt{});
    const float amax[2] = {std::fabs(low_float(m, Fmt{})), std::fabs(high_float(m, Fmt{}))};
    const uint8_t s_b[2] = {block_scale(amax[0], s_enc), block_scale(amax[1], s_enc)};
    if (small_block(amax[0], enc_table[s_b[0]]) && small_block(amax[1], enc_table[s_b[1]])) {
      uint64_t codes[2];
      small_column_blocks(w, enc_table[s_b[0]], enc_table[s_b[1]], Fmt{}, codes[0], codes[1]);
      for (int c = 0; c < 2; ++c) {
        if (s_b[c] != ref[c].scale || codes[c] != ref[c].codes)
          fail("column block", double(codes[c]), double(ref[c].codes), s_b[c], ref[c].scale);
        special_small += ref[c].nan_or_saturating;
      }
    }
  }
  if (special_small)
    fail("a NaN or saturating block took the small route", double(special_small), 0, 0, 0);
  std::printf("blocks (%s): %d random pairs, %ld small rowwise blocks checked\n",
              std::is_same<Fmt, Bf16Bits>::value ? "bf16" : "fp16", count, small_blocks);
}

}  // namespace

int main() {
  std::mt19937 g(2024);
  const std::vector<float> encs = encode_factors(g);
  check_elements<Bf16Bits>(encs);
  check_elements<Fp16Bits>(encs);
  check_blocks<Bf16Bits>(g, 300000);
  check_blocks<Fp16Bits>(g, 300000);
  std::printf("%s (%ld failures)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
