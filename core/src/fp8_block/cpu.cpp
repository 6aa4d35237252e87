// CPU backend of the FP8-block family: the executable spec of te/fp8_block.h.
//
// Quantization walks the input in bands of 128 rows. In a band, every block
// (1x128, 128x1 or 128x128, cut at the tensor's edge) first gets its amax,
// then its scale, then its elements are quantized. Each requested output
// (rowwise, columnwise) is one such pass with its own block shape.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fp8_block/backend.h"
#include "runtime/element.h"
#include "runtime/parallel.h"
#include "transpose/backend.h"

namespace te::fp8_block::cpu {
namespace {

// One output of the quantization. Blocks are block_rows x block_cols in the
// input's [M, K] coordinates; element (r, c) is stored at (r, c), or at (c, r)
// when `transposed` (GEMM-ready columnwise data).
struct Direction {
  int64_t block_rows, block_cols;
  uint8_t* out;
  float* scale_inv;
  ScaleMap map;
  bool transposed;
};

// Scale-array entries past the real block count are written as 0.
void zero_scale_padding(float* scales, const ScaleMap& map) {
  for (int64_t i = 0; i < map.shape0; ++i)
    for (int64_t j = map.valid1; j < map.shape1; ++j) scales[i * map.shape1 + j] = 0.0f;
}

template <class T>
void quantize_band(const T* in, int64_t rows, int64_t cols, int64_t r0, const Direction& d,
                   const QuantizeArgs& a) {
  const int64_t r1 = std::min(rows, r0 + kBlock);
  const int64_t blocks_per_row = cdiv(cols, d.block_cols);
  std::vector<float> block_amax(cdiv(r1 - r0, d.block_rows) * blocks_per_row, 0.0f);
  auto block_of = [&](int64_t r, int64_t c) {
    return ((r - r0) / d.block_rows) * blocks_per_row + c / d.block_cols;
  };
  // amax skips NaN (fmax returns the other operand), so a block of NaNs has amax 0.
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& m = block_amax[block_of(r, c)];
      m = std::fmax(m, std::fabs(to_float(in[r * cols + c])));
    }

  const Fp8Format& fmt = fp8_format(a.fp8_dtype);
  const float value_for_inf = max_finite_of(a.input_dtype);
  std::vector<float> block_scale(block_amax.size());
  for (size_t b = 0; b < block_amax.size(); ++b) {
    const float s =
        scale_from_amax(block_amax[b], fmt.max_finite, a.force_pow2, a.epsilon, value_for_inf);
    block_scale[b] = s;
    // The block's first element, in stored coordinates, locates its scale.
    const int64_t r = r0 + static_cast<int64_t>(b / blocks_per_row) * d.block_rows;
    const int64_t c = static_cast<int64_t>(b % blocks_per_row) * d.block_cols;
    d.scale_inv[d.transposed ? d.map.index(c, r) : d.map.index(r, c)] = 1.0f / s;
  }

  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t q = float_to_fp8(to_float(in[r * cols + c]) * block_scale[block_of(r, c)], fmt);
      d.out[d.transposed ? c * rows + r : r * cols + c] = q;
    }
}

template <class T>
void quantize_direction(const QuantizeArgs& a, const Direction& d) {
  zero_scale_padding(d.scale_inv, d.map);
  const T* in = static_cast<const T*>(a.input);
  parallel_for(cdiv(a.rows, kBlock), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t band = b0; band < b1; ++band)
      quantize_band(in, a.rows, a.cols, band * kBlock, d, a);
  });
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  const bool two_d = a.dim == TE_FP8_BLOCK_2D;
  std::vector<Direction> directions;
  if (a.rowwise)
    directions.push_back(
        {two_d ? kBlock : 1, kBlock, a.rowwise, a.rowwise_scale_inv, a.rowwise_map, false});
  if (a.columnwise)
    directions.push_back({kBlock, two_d ? kBlock : 1, a.columnwise, a.columnwise_scale_inv,
                          a.columnwise_map, a.layout == TE_FP8_BLOCK_GEMM_READY});
  dispatch_float_type(a.input_dtype, [&](auto tag) {
    for (const Direction& d : directions) quantize_direction<typename decltype(tag)::type>(a, d);
  });
}

void dequantize(const DequantizeArgs& a) {
  const Fp8Format& fmt = fp8_format(a.fp8_dtype);
  dispatch_float_type(a.output_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(a.output);
    parallel_for(a.rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < a.cols; ++c) {
          const float s = a.scale_inv[a.map.index(r, c)];
          out[r * a.cols + c] = from_float<T>(fp8_to_float(a.data[r * a.cols + c], fmt) * s);
        }
    });
  });
}

void transpose_2d(const Transpose2dArgs& a) {
  const bool gemm_ready = a.layout == TE_FP8_BLOCK_GEMM_READY;
  if (gemm_ready) {
    te::transpose::cpu::transpose(a.rowwise, a.columnwise, a.rows, a.cols, 1);
  } else if (a.rows * a.cols > 0) {
    std::memcpy(a.columnwise, a.rowwise, static_cast<size_t>(a.rows * a.cols));
  }
  const ScaleMap& map = a.columnwise_map;
  for (int64_t i = 0; i < map.shape0; ++i)
    for (int64_t j = 0; j < map.shape1; ++j)
      a.columnwise_scale_inv[i * map.shape1 + j] =
          columnwise_2d_scale(a.rowwise_scale_inv, a.rowwise_map, map, gemm_ready, i, j);
}

}  // namespace te::fp8_block::cpu
