// The NVFP4 family's backends. api.cpp validates every argument first, so the
// backends receive consistent, non-null pointers of the stated types and shapes.
#pragma once

#include <cstdint>

#include "te/types.h"

namespace te::nvfp4 {

// Options after validation. rng_state points to (seed, offset) on the input's
// device; it is read by the backend (on the GPU, by the kernel).
struct Options {
  bool block_2d = false;
  bool stochastic_rounding = false;
  bool random_hadamard = false;
  uint32_t rht_sign_mask = 0;
  const int64_t* rng_state = nullptr;
};

// One output direction: data, its scale buffer (with its padded row length)
// and the global amax it is scaled with. data == nullptr: not requested.
struct Direction {
  uint8_t* data = nullptr;
  uint8_t* scale = nullptr;
  int64_t scale_rows = 0, scale_cols = 0;  // padded scale-buffer shape
  const float* amax = nullptr;
};

// Input viewed as [rows, cols]; rowwise data is [rows, cols], columnwise [cols, rows].
struct QuantizeArgs {
  const void* input;
  te_dtype input_dtype;
  int64_t rows, cols;
  Direction rowwise, columnwise;
  Options options;
};

// Data [rows, cols] FP4 with its scales -> output [rows, cols].
struct DequantizeArgs {
  const uint8_t* data;
  const uint8_t* scale;
  int64_t rows, cols, scale_cols;
  const float* amax;
  void* output;
  te_dtype output_dtype;
};

// 2-D-quantized rowwise [rows, cols] -> columnwise [cols, rows].
struct TransposeArgs {
  const uint8_t* rowwise;
  const uint8_t* rowwise_scale;
  int64_t rows, cols, rowwise_scale_cols;
  uint8_t* columnwise;
  uint8_t* columnwise_scale;
  int64_t columnwise_scale_rows, columnwise_scale_cols;
};

namespace cpu {
void compute_amax(const void* input, te_dtype dtype, int64_t rows, int64_t cols,
                  float* amax_rowwise, float* amax_columnwise, const Options& options);
void quantize(const QuantizeArgs& args);
void dequantize(const DequantizeArgs& args);
void transpose_2d(const TransposeArgs& args);
}  // namespace cpu

#ifdef TE_WITH_CUDA
namespace cuda {
void compute_amax(const void* input, te_dtype dtype, int64_t rows, int64_t cols,
                  float* amax_rowwise, float* amax_columnwise, const Options& options,
                  te_stream stream);
void quantize(const QuantizeArgs& args, te_stream stream);
void dequantize(const DequantizeArgs& args, te_stream stream);
void transpose_2d(const TransposeArgs& args, te_stream stream);
}  // namespace cuda
#endif

}  // namespace te::nvfp4
