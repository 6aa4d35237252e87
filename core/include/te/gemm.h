/* Dense GEMM with fused epilogues, in row-major terms:
 *
 *     v = alpha * op(A) @ op(B) + beta * C  (+ bias[n] broadcast over rows)
 *     D = gelu(v) with the GELU epilogue, else v
 *
 * op(A) is [M, K]: A is stored [M, K], or [K, M] when transa.
 * op(B) is [K, N]: B is stored [K, N], or [N, K] when transb.
 * A Linear layer's forward Y = X W^T is (A = X, B = W, transb = 1).
 * A and B have at least 2 dims; leading dims are folded into rows ([..., c]
 * is a [prod(...), c] matrix). D, C and pre_gelu_out are [M, N] matrices in the
 * same sense (D may keep A's leading dims when A is not transposed).
 *
 * Operands are FP32, BF16, FP16 or per-tensor FP8 (E4M3/E5M2, mixed allowed,
 * not both E5M2); an FP8 operand is dequantized as float(q) * its scale_inv.
 * A and B must have the same type unless both are FP8. Every element is
 * turned into FP32 exactly as stated and the products are accumulated in FP32
 * (the summation order is the backend's: the only difference from exact
 * arithmetic on the dequantized operands, besides the output rounding).
 * D may be FP32, BF16, FP16 or FP8 whatever the inputs (values are rounded to
 * nearest even; an FP8 D needs d_scale).
 *
 * Two exceptions on the CUDA backend (docs/numerics.md gives the error bounds):
 *   - FP8 x FP8 runs on Hopper's FP8 tensor cores, which sum each k-step of 32
 *     products into an accumulator of 14 significant bits (truncated).
 *     cuBLASLt moves those partial sums to FP32 at intervals when
 *     use_split_accumulator = 1, never when 0. Error: about 2^-13 of
 *     sum |a||b| per 32 products (split accumulator), not FP32's 2^-24.
 *   - With a bias and a BF16/FP16 D, cuBLASLt's fused BIAS epilogue may round
 *     the product to D's type before adding the bias (two roundings of D's
 *     type instead of one).
 * Otherwise both backends follow the statement above, GELU and bias_grad
 * included (on CUDA, GELU with a 16-bit output and every bias_grad come from
 * our FP32 kernels, not from cuBLASLt's fused epilogues).
 *
 * Epilogues (each optional):
 *   C          beta * C, C [M, N]: D's type when D is high precision,
 *              FP32/BF16/FP16 when D is FP8. beta == 0: C is not read. C may be
 *              D itself (same pointer and type): accumulation in place.
 *   bias       v += bias[n] (after beta * C, before GELU); [N], FP32/BF16/FP16.
 *   gelu       with pre_gelu_out ([M, N], FP32/BF16/FP16): pre_gelu_out = v and
 *              D = gelu_tanh(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))).
 *   bias_grad  bias_grad[m] = sum_k op(A)[m, k] ([M], FP32/BF16/FP16; FP32
 *              sums of the dequantized elements): the bias gradient when op(A)
 *              is the transposed output gradient of a layer (the wgrad GEMM).
 *   FP8 D      D = saturate(RNE(gelu-or-v * d_scale)) (+-448 / +-57344, NaN ->
 *              0x7F); d_amax (optional) = max(d_amax, max |gelu-or-v|), NaN
 *              ignored: max-accumulated like the cast family's amax.
 *
 * FP8 on Hopper: cuBLASLt only takes the "TN" form for FP8; the core picks the
 * operand order and transposes an FP8 operand into the workspace when needed,
 * so every transa/transb combination works for every type (the "TN" layout,
 * transa = 0 and transb = 1, needs no copy). Combinations cuBLASLt cannot fuse
 * run as one extra kernel pass (see core/src/gemm/cuda_plan.h).
 *
 * Workspace: query te_gemm_workspace_size with the same parameters. The CPU
 * backend needs none (it allocates host scratch); the CUDA backend needs the
 * cuBLASLt workspace (32 MiB) plus room for FP8 transposes, for unfused
 * epilogues with a non-FP32 D an [M, N] FP32 buffer, and for bias_grad with
 * a long K up to 8 MiB of FP32 partial sums. The size depends on types,
 * shapes and flags only, never on data pointers.
 *
 * FP8 GEMM dimensions must be multiples of 16 (pad the tensors when not).
 * alpha and beta must be finite. No call allocates device memory or
 * synchronizes; the CUDA backend is safe to capture in a CUDA graph once a
 * first call on the device has created its cuBLASLt handle.
 */
#ifndef TE_GEMM_H_
#define TE_GEMM_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const te_tensor* a;           /* required */
  const te_tensor* a_scale_inv; /* FP32 scalar, required iff A is FP8 */
  int transa;
  const te_tensor* b;           /* required */
  const te_tensor* b_scale_inv; /* FP32 scalar, required iff B is FP8 */
  int transb;
  const te_tensor* c;       /* [M, N] (type: see above), or NULL (then beta must be 0) */
  te_tensor* d;             /* [M, N]: FP32, BF16, FP16, or FP8 with d_scale */
  const te_tensor* d_scale; /* FP32 scalar, required iff D is FP8 */
  te_tensor* d_amax;        /* FP32 scalar or NULL; only with FP8 D; max-accumulated */
  const te_tensor* bias;    /* [N] or NULL */
  te_tensor* pre_gelu_out;  /* [M, N] or NULL: enables the GELU epilogue */
  te_tensor* bias_grad;     /* [M] or NULL */
  te_tensor*
      workspace; /* bytes (TE_DTYPE_BYTE), >= te_gemm_workspace_size; may be NULL when that is 0 */
  float alpha;
  float beta;
  int use_split_accumulator; /* FP8 on CUDA: 1 = full FP32 accumulation, 0 = cuBLASLt's fast
                                accumulation (fewer accumulator bits); the CPU ignores it */
} te_gemm_params;

/* Bytes of workspace te_gemm needs for these parameters (their data pointers
 * are not read). */
TE_API te_status te_gemm_workspace_size(const te_gemm_params* params, size_t* workspace_bytes);

TE_API te_status te_gemm(const te_gemm_params* params, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_GEMM_H_ */
