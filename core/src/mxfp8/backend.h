// Backends of the MXFP8 family. api.cpp validates every argument first, so the
// backends receive consistent pointers and padded scale shapes.
#pragma once

#include <cstdint>

#include "te/types.h"

namespace te::mxfp8 {

// Input viewed as [rows, cols]; each direction writes data (input's shape) and
// its padded E8M0 scale buffer, or neither (both pointers null).
struct QuantizeArgs {
  const void* input;
  te_dtype input_dtype;
  int64_t rows, cols;
  te_dtype fp8_dtype;
  uint8_t* rowwise;
  uint8_t* rowwise_scales;  // [row_scale_rows, row_scale_cols]
  int64_t row_scale_rows, row_scale_cols;
  uint8_t* columnwise;
  uint8_t* columnwise_scales;  // [col_scale_rows, col_scale_cols]
  int64_t col_scale_rows, col_scale_cols;
  bool use_2d_blocks;
  bool swizzled;
};

struct DequantizeArgs {
  const uint8_t* input;  // FP8 [rows, cols]
  te_dtype fp8_dtype;
  const uint8_t* scales;  // [scale_rows, scale_cols]
  int64_t rows, cols, scale_rows, scale_cols;
  bool columnwise;
  bool swizzled;
  void* output;
  te_dtype output_dtype;
};

namespace cpu {
void quantize(const QuantizeArgs& args);
void dequantize(const DequantizeArgs& args);
}  // namespace cpu

#ifdef TE_WITH_CUDA
namespace cuda {
void quantize(const QuantizeArgs& args, te_stream stream);
void dequantize(const DequantizeArgs& args, te_stream stream);
}  // namespace cuda
#endif

}  // namespace te::mxfp8
