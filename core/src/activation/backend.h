// Backends of the activation family. api.cpp validates every argument first,
// so the backends receive consistent pointers of the stated types.
#pragma once

#include <cstdint>

#include "activation/functions.h"
#include "te/types.h"

namespace te::activation {

// The order of the bias-gradient sums (te/activation.h), the same on both
// backends: rows in groups of 4 (each summed in row order), the 16 groups of
// a 64-row chunk added in order, then the chunk sums in chunk order.
constexpr int64_t kDbiasGroupRows = 4;
constexpr int64_t kDbiasChunkRows = 64;

// Where the FP32 values v of an output matrix [rows, cols] go.
struct OutputArgs {
  void* rowwise;           // [rows, cols] of rowwise_dtype, or null
  te_dtype rowwise_dtype;  // FP32, BF16, FP16, E4M3 or E5M2
  uint8_t* columnwise;     // FP8 [cols, rows], or null
  te_dtype fp8_dtype;      // of the FP8 outputs (rowwise and/or columnwise)
  const float* scale;      // FP8 outputs only
  float* scale_inv;        // may be null
  float* amax;             // may be null: amax = max(amax, max|v|)
};

// Forward: input [rows, in_cols] (in_cols = 2 * cols for gated kinds, else
// cols) -> output [rows, cols].
struct ForwardArgs {
  te_activation kind;
  Params params;
  const void* input;
  te_dtype input_dtype;
  int64_t rows;
  int64_t cols;  // output width H
  OutputArgs out;
};

// Backward: grad [rows, cols] and input [rows, in_cols] -> grad_input
// [rows, in_cols] (the output matrix), dbias [in_cols].
struct BackwardArgs {
  te_activation kind;
  Params params;
  const void* grad;  // same dtype as input
  const void* input;
  te_dtype input_dtype;
  int64_t rows;
  int64_t cols;  // grad width H
  OutputArgs out;
  void* dbias;  // may be null
  te_dtype dbias_dtype;
  float* workspace;  // CUDA: ceil(rows / 64) * in_cols partial sums when dbias is set
  // The forward output's FP8 columnwise copy [cols, rows] written in the same
  // pass (te_activation_bwd_with_fwd_columnwise): fwd.scale is null when not
  // asked (fwd.columnwise may be null also when asked, for an empty input);
  // fwd.rowwise and fwd.amax are always null. The values are
  // rounded to fwd_values_dtype (FP32: unchanged) before they are quantized.
  OutputArgs fwd;
  te_dtype fwd_values_dtype;
};

inline int64_t input_cols(te_activation kind, int64_t cols) {
  return is_gated(kind) ? 2 * cols : cols;
}

inline int64_t dbias_chunks(int64_t rows) { return (rows + kDbiasChunkRows - 1) / kDbiasChunkRows; }

namespace cpu {
void forward(const ForwardArgs& args);
void backward(const BackwardArgs& args);
}  // namespace cpu

#ifdef TE_WITH_CUDA
namespace cuda {
void forward(const ForwardArgs& args, te_stream stream);
void backward(const BackwardArgs& args, te_stream stream);
}  // namespace cuda
#endif

}  // namespace te::activation
