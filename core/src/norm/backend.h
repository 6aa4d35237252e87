// The norm family's backends (formulas in te/norm.h). api.cpp validates every
// argument first, so the backends receive consistent pointers of the stated
// types; optional outputs are null when not requested.
#pragma once

#include <cstddef>
#include <cstdint>

#include "te/types.h"

namespace te::norm {

// Overflow-free statistics (te/norm.h, docs/numerics.md): when a row's FP32
// sum of squares overflows to inf, or LayerNorm's S(x) is not finite (partial
// sums of both signs can overflow to inf and -inf, whose sum is NaN), both backends
// redo it, in the same order, on the terms scaled by kStatScale = 2^-100 and
// scale the result back. A power of two scales exactly, so this is the sum an
// FP32 of unbounded range would give (terms below 2^-26 of x, which cannot
// matter next to an overflowing sum, underflow); any finite row (|x| <= FLT_MAX,
// H < 2^31) then fits: |x| * 2^-100 <= 2^28, squares <= 2^56. Rows holding inf
// give inf again, hence the results they gave before. Ordinary rows never take it.
constexpr float kStatScale = 0x1p-100f;
constexpr float kStatUnscale = 0x1p100f;

// x viewed as [rows, cols]; cols = H is the normalized dimension.
struct FwdArgs {
  bool layernorm;  // false: RMSNorm (no mean, no beta, no mu)
  const void* x;
  te_dtype x_dtype;
  int64_t rows, cols;
  const void* gamma;
  const void* beta;  // LayerNorm only
  te_dtype w_dtype;  // gamma's and beta's type
  float eps;
  bool zero_centered_gamma;
  void* y;
  te_dtype y_dtype;      // FP32, BF16, FP16, E4M3 or E5M2
  const float* y_scale;  // FP8 y only
  float* y_scale_inv;    // FP8 y only, may be null
  float* y_amax;         // may be null (max-accumulated; high-precision y: of the stored y)
  float* mu;             // LayerNorm only, may be null
  float* rsigma;         // may be null
};

struct BwdArgs {
  bool layernorm;
  const void* dz;  // x's type
  const void* x;
  te_dtype x_dtype;
  int64_t rows, cols;
  const float* mu;  // LayerNorm only
  const float* rsigma;
  const void* gamma;
  te_dtype w_dtype;
  bool zero_centered_gamma;
  void* dx;         // x's type
  void* dgamma;     // w_dtype
  void* dbeta;      // w_dtype, LayerNorm only
  void* workspace;  // at least backward_workspace_bytes (CUDA); unused on CPU
};

namespace cpu {
void forward(const FwdArgs& args);
void backward(const BwdArgs& args);
}  // namespace cpu

#ifdef TE_WITH_CUDA
namespace cuda {
void forward(const FwdArgs& args, te_stream stream);
void backward(const BwdArgs& args, te_stream stream);
// FP32 partial sums of dgamma (and dbeta) per block of the backward kernel.
// Depends on the grid of the backward kernel, so on x's type and the device.
size_t backward_workspace_bytes(te_dtype x_dtype, int64_t rows, int64_t cols, bool layernorm);
}  // namespace cuda
#endif

}  // namespace te::norm
