// The FP8-block family's backends. api.cpp validates every argument first, so
// the backends receive consistent, non-null pointers of the stated types and
// scale arrays of exactly the shapes their ScaleMap gives.
#pragma once

#include <cstdint>

#include "fp8_block/layout.h"
#include "te/types.h"

namespace te::fp8_block {

// Input viewed as [rows, cols] = [M, K] (cols % 16 == 0). Rowwise output is
// [M, K]; columnwise output is [K, M] (GEMM-ready) or [M, K] (compact).
struct QuantizeArgs {
  const void* input;
  te_dtype input_dtype;
  int64_t rows, cols;
  te_fp8_block_dim dim;
  te_fp8_block_layout layout;
  te_dtype fp8_dtype;
  uint8_t* rowwise;             // may be null
  float* rowwise_scale_inv;     // non-null with rowwise
  uint8_t* columnwise;          // may be null
  float* columnwise_scale_inv;  // non-null with columnwise
  ScaleMap rowwise_map, columnwise_map;
  bool force_pow2;
  float epsilon;
};

// One stored matrix [rows, cols] and its scales.
struct DequantizeArgs {
  const uint8_t* data;
  te_dtype fp8_dtype;
  int64_t rows, cols;
  const float* scale_inv;
  ScaleMap map;
  void* output;
  te_dtype output_dtype;
};

// 2-D: rowwise [rows, cols] and its scales -> columnwise ones.
struct Transpose2dArgs {
  const uint8_t* rowwise;
  const float* rowwise_scale_inv;
  uint8_t* columnwise;
  float* columnwise_scale_inv;
  int64_t rows, cols;
  te_fp8_block_layout layout;
  ScaleMap rowwise_map, columnwise_map;
};

namespace cpu {
void quantize(const QuantizeArgs& args);
void dequantize(const DequantizeArgs& args);
void transpose_2d(const Transpose2dArgs& args);
}  // namespace cpu

#ifdef TE_WITH_CUDA
namespace cuda {
void quantize(const QuantizeArgs& args, te_stream stream);
void dequantize(const DequantizeArgs& args, te_stream stream);
void transpose_2d(const Transpose2dArgs& args, te_stream stream);
}  // namespace cuda
#endif

}  // namespace te::fp8_block
