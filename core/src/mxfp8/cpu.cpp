// CPU backend of the MXFP8 family: the executable spec of te/mxfp8.h. The input
// is walked in strips of 32 rows; each strip holds whole columnwise and 2-D
// blocks, so every block's amax is complete before its elements are cast.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "mxfp8/backend.h"
#include "mxfp8/numerics.h"
#include "runtime/element.h"
#include "runtime/parallel.h"

namespace te::mxfp8::cpu {
namespace {

constexpr float kQuietNaN = std::numeric_limits<float>::quiet_NaN();  // 0x7FC00000

float max_reciprocal(te_dtype fp8_dtype) {
  return fp8_dtype == TE_DTYPE_FLOAT8E5M2 ? kE5M2MaxReciprocal : kE4M3MaxReciprocal;
}

// The block scale byte of a block amax (NaN-free, >= 0).
inline uint8_t block_scale(float amax, float reciprocal) {
  return e8m0_round_up(amax * reciprocal);
}

template <class T>
class StripQuantizer {
 public:
  StripQuantizer(const QuantizeArgs& a)
      : a_(a),
        in_(static_cast<const T*>(a.input)),
        fmt_(fp8_format(a.fp8_dtype)),
        reciprocal_(max_reciprocal(a.fp8_dtype)),
        blocks_(a.cols / kBlock) {}

  // Quantizes rows [32 * strip, 32 * strip + 32) (fewer at the end).
  void run(int64_t strip) {
    const int64_t r0 = strip * kBlock, r1 = std::min(a_.rows, r0 + kBlock);
    if (a_.use_2d_blocks) {
      tiles(strip, r0, r1);
      return;
    }
    if (a_.rowwise) rowwise(r0, r1);
    if (a_.columnwise) columnwise(strip, r0, r1);
  }

 private:
  float x(int64_t r, int64_t c) const { return to_float(in_[r * a_.cols + c]); }
  uint8_t cast(float v, uint8_t e) const { return float_to_fp8(v * quantize_factor(e), fmt_); }

  void rowwise(int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < blocks_; ++j) {
        float amax = 0.0f;
        const int64_t c0 = j * kBlock, c1 = c0 + kBlock;
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(x(r, c)));
        const uint8_t e = block_scale(amax, reciprocal_);
        a_.rowwise_scales[rowwise_scale_offset(r, j, a_.row_scale_cols, a_.swizzled)] = e;
        for (int64_t c = c0; c < c1; ++c) a_.rowwise[r * a_.cols + c] = cast(x(r, c), e);
      }
    }
  }

  void columnwise(int64_t strip, int64_t r0, int64_t r1) {
    std::vector<float> amax(a_.cols, 0.0f);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < a_.cols; ++c) amax[c] = std::fmax(amax[c], std::fabs(x(r, c)));
    std::vector<uint8_t> e(a_.cols);
    for (int64_t c = 0; c < a_.cols; ++c) {
      e[c] = block_scale(amax[c], reciprocal_);
      a_.columnwise_scales[columnwise_scale_offset(strip, c, a_.col_scale_rows, a_.col_scale_cols,
                                                   a_.swizzled)] = e[c];
    }
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < a_.cols; ++c) a_.columnwise[r * a_.cols + c] = cast(x(r, c), e[c]);
  }

  // 32x32 tiles: one scale per tile, repeated in both scale layouts; the data
  // of both directions is the same.
  void tiles(int64_t strip, int64_t r0, int64_t r1) {
    std::vector<float> amax(blocks_, 0.0f);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < a_.cols; ++c)
        amax[c / kBlock] = std::fmax(amax[c / kBlock], std::fabs(x(r, c)));
    std::vector<uint8_t> e(blocks_);
    for (int64_t j = 0; j < blocks_; ++j) {
      e[j] = block_scale(amax[j], reciprocal_);
      if (a_.rowwise)
        for (int64_t r = r0; r < r1; ++r)
          a_.rowwise_scales[rowwise_scale_offset(r, j, a_.row_scale_cols, a_.swizzled)] = e[j];
      if (a_.columnwise)
        for (int64_t c = j * kBlock; c < (j + 1) * kBlock; ++c)
          a_.columnwise_scales[columnwise_scale_offset(strip, c, a_.col_scale_rows,
                                                       a_.col_scale_cols, a_.swizzled)] = e[j];
    }
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < a_.cols; ++c) {
        const uint8_t q = cast(x(r, c), e[c / kBlock]);
        if (a_.rowwise) a_.rowwise[r * a_.cols + c] = q;
        if (a_.columnwise) a_.columnwise[r * a_.cols + c] = q;
      }
    }
  }

  const QuantizeArgs& a_;
  const T* in_;
  const Fp8Format& fmt_;
  float reciprocal_;
  int64_t blocks_;
};

}  // namespace

void quantize(const QuantizeArgs& a) {
  // Padding bytes (and, when swizzled, the tiles' unused slots) are 0.
  if (a.rowwise_scales) std::memset(a.rowwise_scales, 0, a.row_scale_rows * a.row_scale_cols);
  if (a.columnwise_scales) std::memset(a.columnwise_scales, 0, a.col_scale_rows * a.col_scale_cols);
  if (a.rows == 0 || a.cols == 0) return;
  const int64_t strips = (a.rows + kBlock - 1) / kBlock;
  const int64_t min_strips = std::max<int64_t>(1, (1 << 16) / (kBlock * a.cols));
  dispatch_float_type(a.input_dtype, [&](auto tag) {
    StripQuantizer<typename decltype(tag)::type> quantizer(a);
    parallel_for(strips, min_strips, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) quantizer.run(s);
    });
  });
}

void dequantize(const DequantizeArgs& a) {
  const Fp8Format& fmt = fp8_format(a.fp8_dtype);
  dispatch_float_type(a.output_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(a.output);
    parallel_for(a.rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, a.cols)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) {
                     for (int64_t c = 0; c < a.cols; ++c) {
                       const int64_t s =
                           a.columnwise
                               ? columnwise_scale_offset(r / kBlock, c, a.scale_rows, a.scale_cols,
                                                         a.swizzled)
                               : rowwise_scale_offset(r, c / kBlock, a.scale_cols, a.swizzled);
                       const uint8_t code = a.input[r * a.cols + c];
                       float y = fp8_to_float(code, fmt) * dequantize_factor(a.scales[s]);
                       if (y != y) y = code & 0x80 ? -kQuietNaN : kQuietNaN;  // one NaN per sign
                       out[r * a.cols + c] = from_float<T>(y);
                     }
                   }
                 });
  });
}

}  // namespace te::mxfp8::cpu
