// The GEMM family's own CUDA kernels, used around cublasLtMatmul where
// cuBLASLt cannot do the work (see cuda_plan.h): FP8 operand transposes for
// the "TN" layout, the unfused epilogue, the bias-gradient row sums
// (bias_grad.cu) and the amax max-accumulation. All launch on the given
// stream; none synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "te/types.h"

namespace te::gemm::kernels {

// out[c * rows + r] = in[r * cols + c] for 1-byte elements (FP8 data).
void transpose_bytes(const uint8_t* in, uint8_t* out, int64_t rows, int64_t cols,
                     cudaStream_t stream);

// For every (i, j) of the [m, n] output, with x = acc[i, j] (0 when acc is null):
//   v = x + beta * C[i, j] (when c) + bias[j] (when bias)
//   pre_gelu_out[i, j] = v, v = gelu_tanh(v)          (when pre_gelu_out)
//   D[i, j] = v rounded to D's type; FP8 D: saturate(RNE(v * d_scale)) and
//   d_amax = max(d_amax, max |v|) (NaN ignored)       (when d_amax)
// acc may be D itself (FP32 D, updated in place).
struct EpilogueArgs {
  int64_t m = 0, n = 0;
  const float* acc = nullptr;
  const void* c = nullptr;
  te_dtype c_dtype = TE_DTYPE_FLOAT32;
  float beta = 0.0f;
  const void* bias = nullptr;
  te_dtype bias_dtype = TE_DTYPE_FLOAT32;
  void* pre_gelu_out = nullptr;
  te_dtype pre_gelu_dtype = TE_DTYPE_FLOAT32;
  void* d = nullptr;
  te_dtype d_dtype = TE_DTYPE_FLOAT32;
  const float* d_scale = nullptr;
  float* d_amax = nullptr;
};
void epilogue(const EpilogueArgs& args, cudaStream_t stream);

// out[i] = sum_k op(A)[i, k] over the dequantized elements (FP32 sums),
// op(A) [m, k] stored as [m, k], or [k, m] when trans. K is cut into `splits`
// parts (cuda_plan.h: bias_grad_splits); with more than one, each part's sums
// go to partials[part * m + i] (FP32, workspace) and a second kernel adds the
// parts in order: deterministic, and every sum is FP32.
struct BiasGradArgs {
  int64_t m = 0, k = 0;
  const void* a = nullptr;
  te_dtype a_dtype = TE_DTYPE_FLOAT32;
  const float* scale_inv = nullptr;  // FP8 A only
  bool trans = false;
  int64_t splits = 1;
  float* partials = nullptr;  // [splits, m] when splits > 1
  void* out = nullptr;
  te_dtype out_dtype = TE_DTYPE_FLOAT32;
};
void bias_grad(const BiasGradArgs& args, cudaStream_t stream);

// *d_amax = max(*d_amax, *partial) (cuBLASLt overwrites its amax output).
void amax_combine(float* d_amax, const float* partial, cudaStream_t stream);

}  // namespace te::gemm::kernels
