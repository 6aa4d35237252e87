// CPU backend of the NVFP4 family: the executable spec of te/nvfp4.h.
//
// The input is processed in stripes of 16 rows (one row of 16x16 tiles, and
// the height of a columnwise block). Each stripe is widened to FP32 once; the
// rowwise blocks are its 16-element row pieces, the columnwise blocks its
// 16-element columns.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "nvfp4/backend.h"
#include "nvfp4/formulas.h"
#include "nvfp4/hadamard.h"
#include "nvfp4/philox.h"
#include "runtime/element.h"
#include "runtime/parallel.h"

namespace te::nvfp4::cpu {
namespace {

// Rows [r0, r1) of the [rows, cols] input as FP32, row-major.
void widen_rows(const void* input, te_dtype dtype, int64_t cols, int64_t r0, int64_t r1,
                float* out) {
  dispatch_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(input) + r0 * cols;
    for (int64_t i = 0; i < (r1 - r0) * cols; ++i) out[i] = to_float(in[i]);
  });
}

// Runs body(stripe, r0, r1, values) over the 16-row stripes in parallel;
// values holds rows [r0, r1) as FP32 (the last stripe may be shorter).
template <class Body>
void for_each_stripe(const void* input, te_dtype dtype, int64_t rows, int64_t cols, Body&& body) {
  const int64_t stripes = (rows + kBlock - 1) / kBlock;
  const int64_t min_chunk = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, kBlock * cols));
  parallel_for(stripes, min_chunk, [&](int64_t s0, int64_t s1) {
    std::vector<float> values(static_cast<size_t>(kBlock * cols));
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t r0 = s * kBlock, r1 = std::min(rows, r0 + kBlock);
      widen_rows(input, dtype, cols, r0, r1, values.data());
      body(s, r0, r1, values.data());
    }
  });
}

// Column k of a full stripe (16 rows of length cols), RHT applied when asked.
void column_block(const float* stripe, int64_t cols, int64_t k, const Options& o, float v[kBlock]) {
  for (int i = 0; i < kBlock; ++i) v[i] = stripe[i * cols + k];
  if (o.random_hadamard) random_hadamard_16(v, o.rht_sign_mask);
}

// Max of a running amax shared between workers.
struct SharedMax {
  float value = 0.0f;
  std::mutex mutex;
  void merge(float v) {
    std::lock_guard<std::mutex> lock(mutex);
    value = std::fmax(value, v);
  }
};

// The encoding constants of one direction.
struct DirectionScales {
  float s_enc, s_dec;
  explicit DirectionScales(const float* amax)
      : s_enc(amax ? global_encode_scale(*amax) : 1.0f), s_dec(global_decode_scale(s_enc)) {}
};

void store_packed(uint64_t packed, uint8_t* out) {
  for (int b = 0; b < kBlock / 2; ++b) out[b] = static_cast<uint8_t>(packed >> (8 * b));
}

// Quantizes one block and stores its 8 data bytes and its scale byte. The
// random words (stochastic rounding) are those of first + i * stride.
void quantize_block(float v[kBlock], float block_amax, const DirectionScales& ds, const Options& o,
                    const RandomStream& rs, uint64_t first, uint64_t stride, uint8_t* data,
                    uint8_t* scale) {
  const uint8_t s_b = block_scale(block_amax, ds.s_enc);
  uint32_t random[kBlock];
  if (o.stochastic_rounding) rs.block_words(first, stride, random);
  store_packed(
      encode_block(v, block_encode_factor(s_b, ds.s_dec), o.stochastic_rounding ? random : nullptr),
      data);
  *scale = s_b;
}

}  // namespace

void compute_amax(const void* input, te_dtype dtype, int64_t rows, int64_t cols,
                  float* amax_rowwise, float* amax_columnwise, const Options& options) {
  SharedMax row, col;
  const bool rht_col = amax_columnwise != nullptr && options.random_hadamard;
  for_each_stripe(input, dtype, rows, cols, [&](int64_t, int64_t r0, int64_t r1, const float* v) {
    float m = 0.0f;
    for (int64_t i = 0; i < (r1 - r0) * cols; ++i) m = abs_max(m, v[i]);
    row.merge(m);
    if (!rht_col) return;
    float mc = 0.0f, block[kBlock];
    for (int64_t k = 0; k < cols; ++k) {
      column_block(v, cols, k, options, block);
      mc = std::fmax(mc, block_abs_max(block));
    }
    col.merge(mc);
  });
  if (amax_rowwise) *amax_rowwise = row.value;
  if (amax_columnwise) *amax_columnwise = rht_col ? col.value : row.value;
}

void quantize(const QuantizeArgs& a) {
  const Options& o = a.options;
  const Direction& rw = a.rowwise;
  const Direction& cw = a.columnwise;
  // Padding bytes of the scale buffers are 0: clear everything, then fill.
  if (rw.data) std::memset(rw.scale, 0, static_cast<size_t>(rw.scale_rows * rw.scale_cols));
  if (cw.data) std::memset(cw.scale, 0, static_cast<size_t>(cw.scale_rows * cw.scale_cols));
  const DirectionScales row_scales(rw.amax), col_scales(cw.amax);
  RandomStream rs{0, 0};
  if (o.stochastic_rounding)
    rs = RandomStream{static_cast<uint64_t>(o.rng_state[0]), static_cast<uint64_t>(o.rng_state[1])};
  const int64_t M = a.rows, K = a.cols, blocks_per_row = K / kBlock;
  const uint64_t numel = static_cast<uint64_t>(M) * static_cast<uint64_t>(K);

  for_each_stripe(
      a.input, a.input_dtype, M, K, [&](int64_t s, int64_t r0, int64_t r1, const float* values) {
        // 2-D: the amax of each 16x16 tile of this stripe.
        std::vector<float> tile_amax;
        if (o.block_2d) {
          tile_amax.assign(static_cast<size_t>(blocks_per_row), 0.0f);
          for (int64_t r = 0; r < kBlock; ++r)
            for (int64_t c = 0; c < blocks_per_row; ++c)
              tile_amax[c] = std::fmax(tile_amax[c], block_abs_max(values + r * K + c * kBlock));
        }
        float v[kBlock];
        if (rw.data) {
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t c = 0; c < blocks_per_row; ++c) {
              std::memcpy(v, values + (r - r0) * K + c * kBlock, sizeof(v));
              const float amax = o.block_2d ? tile_amax[c] : block_abs_max(v);
              const uint64_t first = static_cast<uint64_t>(r * K + c * kBlock);
              quantize_block(v, amax, row_scales, o, rs, first, 1,
                             rw.data + (r * K + c * kBlock) / 2, rw.scale + r * rw.scale_cols + c);
            }
          }
        }
        if (cw.data) {  // a full stripe: M % 16 == 0 was checked
          for (int64_t k = 0; k < K; ++k) {
            column_block(values, K, k, o, v);
            const float amax = o.block_2d ? tile_amax[k / kBlock] : block_abs_max(v);
            // 1-D: the columnwise stream continues after the rowwise one; 2-D:
            // the input element's own word, so both outputs round alike.
            const uint64_t first = o.block_2d ? static_cast<uint64_t>(r0 * K + k)
                                              : numel + static_cast<uint64_t>(k * M + r0);
            const uint64_t stride = o.block_2d ? static_cast<uint64_t>(K) : 1;
            quantize_block(v, amax, col_scales, o, rs, first, stride, cw.data + (k * M + r0) / 2,
                           cw.scale + k * cw.scale_cols + s);
          }
        }
      });
}

void dequantize(const DequantizeArgs& a) {
  const float s_dec = global_decode_scale(global_encode_scale(*a.amax));
  const int64_t blocks_per_row = a.cols / kBlock;
  dispatch_float_type(a.output_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(a.output);
    parallel_for(a.rows * blocks_per_row, 4096, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r = b / blocks_per_row, c = b % blocks_per_row;
        const float factor = block_decode_factor(a.scale[r * a.scale_cols + c], s_dec);
        const uint8_t* q = a.data + (r * a.cols + c * kBlock) / 2;
        T* y = out + r * a.cols + c * kBlock;
        for (int i = 0; i < kBlock; ++i) {
          const uint8_t code = (q[i / 2] >> (4 * (i % 2))) & 0xF;
          y[i] = from_float<T>(dequantize_element(code, factor));
        }
      }
    });
  });
}

void transpose_2d(const TransposeArgs& a) {
  const int64_t M = a.rows, K = a.cols;
  std::memset(a.columnwise_scale, 0,
              static_cast<size_t>(a.columnwise_scale_rows * a.columnwise_scale_cols));
  parallel_for(K, 64, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t m = 0; m < M; m += 2) {  // two nibbles of one output byte
        const uint8_t lo = (a.rowwise[(m * K + k) / 2] >> (4 * (k % 2))) & 0xF;
        const uint8_t hi = (a.rowwise[((m + 1) * K + k) / 2] >> (4 * (k % 2))) & 0xF;
        a.columnwise[(k * M + m) / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
      for (int64_t t = 0; t < M / kBlock; ++t)
        a.columnwise_scale[k * a.columnwise_scale_cols + t] =
            a.rowwise_scale[t * kBlock * a.rowwise_scale_cols + k / kBlock];
    }
  });
}

}  // namespace te::nvfp4::cpu
