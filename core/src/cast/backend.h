// The cast family's backends. api.cpp validates every argument first, so the
// backends receive consistent, non-null pointers of the stated types.
#pragma once

#include <cstdint>

#include "te/types.h"

namespace te::cast {

// Input viewed as a [rows, cols] matrix; outputs are rowwise [rows, cols]
// and/or columnwise [cols, rows] FP8 bytes.
struct Fp8QuantizeArgs {
  const void* input;
  te_dtype input_dtype;
  int64_t rows, cols;
  uint8_t* rowwise;     // may be null
  uint8_t* columnwise;  // may be null
  te_dtype fp8_dtype;
  float* scale_inv;  // may be null
  float* amax;       // delayed: max-accumulated, may be null; current: written
};

// Current-scaling options: scale written, computed from amax.
struct CurrentScaling {
  float* scale;
  bool force_pow2;
  float epsilon;
  float value_for_inf;
};

namespace cpu {
void quantize_fp8(const Fp8QuantizeArgs& args, const float* scale);
void quantize_fp8_current_scaling(const Fp8QuantizeArgs& args, const CurrentScaling& cs);
void compute_amax(const void* input, te_dtype dtype, int64_t n, float* amax);
void scale_from_amax(const float* amax, float* scale, float* scale_inv, float fp8_max,
                     bool force_pow2, float epsilon);
void dequantize_fp8(const uint8_t* input, te_dtype fp8_dtype, const float* scale_inv, void* output,
                    te_dtype output_dtype, int64_t n);
}  // namespace cpu

#ifdef TE_WITH_CUDA
namespace cuda {
void quantize_fp8(const Fp8QuantizeArgs& args, const float* scale, te_stream stream);
void quantize_fp8_current_scaling(const Fp8QuantizeArgs& args, const CurrentScaling& cs,
                                  te_stream stream);
void compute_amax(const void* input, te_dtype dtype, int64_t n, float* amax, te_stream stream);
void scale_from_amax(const float* amax, float* scale, float* scale_inv, float fp8_max,
                     bool force_pow2, float epsilon, te_stream stream);
void dequantize_fp8(const uint8_t* input, te_dtype fp8_dtype, const float* scale_inv, void* output,
                    te_dtype output_dtype, int64_t n, te_stream stream);
}  // namespace cuda
#endif

}  // namespace te::cast
