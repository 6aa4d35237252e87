// CPU backend of the cast family: the executable spec of per-tensor FP8
// quantization. Plain loops over [rows, cols], tiled so that the transposed
// (columnwise) output is written in cache-friendly blocks.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "cast/backend.h"
#include "runtime/element.h"
#include "runtime/parallel.h"

namespace te::cast::cpu {
namespace {

constexpr int64_t kTile = 64;  // rows x cols tile: both outputs stay in L1/L2

// Quantizes one tile and returns the tile's amax (NaN ignored, like fmaxf).
template <class T>
float quantize_tile(const T* in, int64_t rows, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                    int64_t c1, float scale, const Fp8Format& fmt, uint8_t* rowwise,
                    uint8_t* columnwise) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const float x = to_float(in[r * cols + c]);
      amax = std::fmax(amax, std::fabs(x));
      const uint8_t q = float_to_fp8(x * scale, fmt);
      if (rowwise) rowwise[r * cols + c] = q;
      if (columnwise) columnwise[c * rows + r] = q;
    }
  }
  return amax;
}

template <class T>
float quantize_typed(const Fp8QuantizeArgs& a, float scale) {
  const T* in = static_cast<const T*>(a.input);
  const Fp8Format& fmt = fp8_format(a.fp8_dtype);
  const int64_t row_tiles = (a.rows + kTile - 1) / kTile;
  float amax = 0.0f;
  std::mutex amax_mutex;
  parallel_for(row_tiles, 4, [&](int64_t t0, int64_t t1) {
    float local = 0.0f;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * kTile, r1 = std::min(a.rows, r0 + kTile);
      for (int64_t c0 = 0; c0 < a.cols; c0 += kTile) {
        const int64_t c1 = std::min(a.cols, c0 + kTile);
        local = std::fmax(local, quantize_tile(in, a.rows, a.cols, r0, r1, c0, c1, scale, fmt,
                                               a.rowwise, a.columnwise));
      }
    }
    std::lock_guard<std::mutex> lock(amax_mutex);
    amax = std::fmax(amax, local);
  });
  return amax;
}

float quantize_any(const Fp8QuantizeArgs& a, float scale) {
  float amax = 0.0f;
  dispatch_float_type(a.input_dtype, [&](auto tag) {
    amax = quantize_typed<typename decltype(tag)::type>(a, scale);
  });
  return amax;
}

template <class T>
float amax_typed(const T* in, int64_t n) {
  float amax = 0.0f;
  std::mutex amax_mutex;
  parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
    float local = 0.0f;
    for (int64_t i = begin; i < end; ++i) local = std::fmax(local, std::fabs(to_float(in[i])));
    std::lock_guard<std::mutex> lock(amax_mutex);
    amax = std::fmax(amax, local);
  });
  return amax;
}

}  // namespace

void quantize_fp8(const Fp8QuantizeArgs& args, const float* scale) {
  const float s = *scale;
  const float amax = quantize_any(args, s);
  if (args.scale_inv) *args.scale_inv = 1.0f / s;
  if (args.amax) *args.amax = std::fmax(*args.amax, amax);
}

void compute_amax(const void* input, te_dtype dtype, int64_t n, float* amax) {
  dispatch_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    *amax = amax_typed(static_cast<const T*>(input), n);
  });
}

void scale_from_amax(const float* amax, float* scale, float* scale_inv, float fp8_max,
                     bool force_pow2, float epsilon) {
  const float s = te::scale_from_amax(*amax, fp8_max, force_pow2, epsilon, kFp32Max);
  *scale = s;
  if (scale_inv) *scale_inv = 1.0f / s;
}

void quantize_fp8_current_scaling(const Fp8QuantizeArgs& args, const CurrentScaling& cs) {
  float amax = 0.0f;
  compute_amax(args.input, args.input_dtype, args.rows * args.cols, &amax);
  const float s = te::scale_from_amax(amax, fp8_format(args.fp8_dtype).max_finite, cs.force_pow2,
                                      cs.epsilon, cs.value_for_inf);
  quantize_any(args, s);
  *cs.scale = s;
  if (args.scale_inv) *args.scale_inv = 1.0f / s;
  if (args.amax) *args.amax = amax;
}

void dequantize_fp8(const uint8_t* input, te_dtype fp8_dtype, const float* scale_inv, void* output,
                    te_dtype output_dtype, int64_t n) {
  const Fp8Format& fmt = fp8_format(fp8_dtype);
  const float s = *scale_inv;
  dispatch_float_type(output_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(output);
    parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = from_float<T>(fp8_to_float(input[i], fmt) * s);
    });
  });
}

}  // namespace te::cast::cpu
