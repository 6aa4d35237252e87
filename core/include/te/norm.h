/* LayerNorm and RMSNorm, forward and backward (the reference library's
 * normalization.h).
 *
 * x of any rank >= 1 is viewed as a matrix [N, H]: H is its last dimension
 * (the normalized one) and N the product of the others. gamma and beta hold H
 * elements. All arithmetic is FP32; inputs widen to FP32 exactly.
 *
 * Forward, per row (sums over the H elements of the row, FP32 accumulation):
 *   LayerNorm:  mu = sum(x) / H
 *               rsigma = 1 / sqrt(sum((x - mu)^2) / H + eps)   (biased variance,
 *                                                   two passes over the row)
 *               y = ((x - mu) * rsigma) * g + beta
 *   RMSNorm:    rsigma = 1 / sqrt(sum(x^2) / H + eps)
 *               y = (x * rsigma) * g
 *   g = gamma, or 1 + gamma (rounded to FP32) with zero_centered_gamma.
 *   A sum that overflows to inf on a finite row (sum(x), or the sum of
 *   squares: |x| around 1e20 and up) is redone on the terms times 2^-100 and
 *   scaled back, exactly (docs/numerics.md), so such rows normalize too.
 *   y is that FP32 value rounded (nearest even) to y's type. With an FP8 y the
 *   quantization is fused: y_fp8 = saturate(RNE(y_fp32 * y_scale)) applied to
 *   the unrounded FP32 y, amax = max(amax, max|y_fp32|) (NaN ignored) and
 *   scale_inv = 1 / y_scale: byte for byte what te_cast_quantize_fp8 writes for the
 *   FP32 y that the same backend returns when y is FP32.
 *   With a high-precision y, y_amax (optional) is the amax of y AS STORED:
 *   amax = max(amax, max|y|) over the rounded values (NaN ignored), what a
 *   separate amax pass over y computes. Current scaling cannot quantize in
 *   the same pass (its scale needs the amax of the whole output first), but
 *   it can take the amax from here: normalize to BF16/FP32 with y_amax, derive
 *   the scale, then quantize y with that scale (te_cast_quantize_fp8).
 *
 * Backward, per row, with xhat = (x - mu) * rsigma (LayerNorm) or x * rsigma
 * (RMSNorm) and dy = dz * g:
 *   LayerNorm:  dx = rsigma * (dy - sum(dy) / H - xhat * sum(dy * xhat) / H)
 *   RMSNorm:    dx = rsigma * (dy - xhat * sum(dy * xhat) / H)
 * and over all rows:  dgamma = sum(dz * xhat),  dbeta = sum(dz).
 * (With zero_centered_gamma, d(1 + gamma)/dgamma = 1, so dgamma is the same.)
 * Every buffer must start at a multiple of its element size (4 bytes for
 * FP32, 2 for BF16/FP16); any other address is rejected with
 * TE_ERROR_INVALID_ARGUMENT. 16-byte aligned buffers with H a multiple of 8
 * take the vectorized CUDA path; others give the same bytes, more slowly.
 * The row reductions of dgamma/dbeta run in a fixed order on both backends:
 * results are deterministic run to run. Summation orders differ between the
 * backends, so CPU and CUDA agree within rounding, not bit for bit
 * (docs/numerics.md gives the bounds).
 */
#ifndef TE_NORM_H_
#define TE_NORM_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The arguments of te_layernorm_fwd and te_rmsnorm_fwd (fields that only
 * LayerNorm has must be NULL for RMSNorm).
 *   x           FP32, BF16 or FP16, shape [..., H], H >= 1.
 *   gamma       FP32, BF16 or FP16, H elements.
 *   beta        LayerNorm: H elements, gamma's type. RMSNorm: NULL.
 *   eps         added to the variance; finite and >= 0.
 *   zero_centered_gamma  nonzero: the weight is 1 + gamma.
 *   y           [out] x's shape: FP32, BF16, FP16, or FP8 (E4M3/E5M2, then
 *               y_scale is required).
 *   y_scale     FP32 scalar; only (and required) with an FP8 y.
 *   y_scale_inv [out] FP32 scalar, written with 1 / y_scale; FP8 y only; may be NULL.
 *   y_amax      [in,out] FP32 scalar, may be NULL: amax = max(amax, max|y_fp32|)
 *               with an FP8 y, max(amax, max|y|) of the stored y otherwise.
 *   mu          [out] LayerNorm: FP32, N elements (saved for backward), may be
 *               NULL. RMSNorm: NULL.
 *   rsigma      [out] FP32, N elements (saved for backward); may be NULL. */
typedef struct {
  const te_tensor* x;
  const te_tensor* gamma;
  const te_tensor* beta;
  float eps;
  int zero_centered_gamma;
  te_tensor* y;
  const te_tensor* y_scale;
  te_tensor* y_scale_inv;
  te_tensor* y_amax;
  te_tensor* mu;
  te_tensor* rsigma;
} te_norm_fwd_params;

/* LayerNorm forward (formula above). */
TE_API te_status te_layernorm_fwd(const te_norm_fwd_params* params, te_stream stream);

/* RMSNorm forward: te_layernorm_fwd without beta and mu. */
TE_API te_status te_rmsnorm_fwd(const te_norm_fwd_params* params, te_stream stream);

/* Bytes of workspace te_layernorm_bwd needs for an input shaped like x (its
 * data pointer is not read). 0 on the CPU backend: pass NULL then. */
TE_API te_status te_layernorm_bwd_workspace_size(const te_tensor* x, size_t* workspace_bytes);

/* The arguments of te_layernorm_bwd and te_rmsnorm_bwd (LayerNorm-only fields
 * must be NULL for RMSNorm).
 *   dz         the output gradient: x's shape and type.
 *   x          the forward input.
 *   mu         LayerNorm: FP32, N elements, as written by te_layernorm_fwd. RMSNorm: NULL.
 *   rsigma     FP32, N elements, as written by the forward.
 *   gamma      H elements (FP32, BF16 or FP16).
 *   zero_centered_gamma  as in the forward.
 *   dx         [out] x's shape and type.
 *   dgamma     [out] H elements, gamma's type.
 *   dbeta      [out] LayerNorm: H elements, gamma's type. RMSNorm: NULL.
 *   workspace  TE_DTYPE_BYTE, at least te_layernorm_bwd_workspace_size (or
 *              te_rmsnorm_bwd_workspace_size) bytes on x's device; may be NULL
 *              when that is 0. 16-byte aligned; its contents on entry do not matter. */
typedef struct {
  const te_tensor* dz;
  const te_tensor* x;
  const te_tensor* mu;
  const te_tensor* rsigma;
  const te_tensor* gamma;
  int zero_centered_gamma;
  te_tensor* dx;
  te_tensor* dgamma;
  te_tensor* dbeta;
  te_tensor* workspace;
} te_norm_bwd_params;

/* LayerNorm backward. */
TE_API te_status te_layernorm_bwd(const te_norm_bwd_params* params, te_stream stream);

/* Bytes of workspace te_rmsnorm_bwd needs (see te_layernorm_bwd_workspace_size). */
TE_API te_status te_rmsnorm_bwd_workspace_size(const te_tensor* x, size_t* workspace_bytes);

/* RMSNorm backward: te_layernorm_bwd without mu and dbeta. */
TE_API te_status te_rmsnorm_bwd(const te_norm_bwd_params* params, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_NORM_H_ */
