/* Dense GEMM with fused epilogues, in row-major terms:
 *
 *     D = alpha * op(A) @ op(B) + beta * C  (+ bias[n] broadcast over rows)
 *
 * op(A) is [M, K]: A is stored [M, K], or [K, M] when transa.
 * op(B) is [K, N]: B is stored [K, N], or [N, K] when transb.
 * A Linear layer's forward Y = X W^T is (A = X, B = W, transb = 1).
 * Tensors of rank > 2 are viewed as matrices by folding their leading dims.
 *
 * Operands are FP32, BF16, FP16 or per-tensor FP8 (E4M3/E5M2, mixed allowed,
 * not both E5M2); an FP8 operand is dequantized as float(q) * its scale_inv.
 * A and B must have the same type unless both are FP8. Accumulation is FP32.
 *
 * Epilogues (each optional):
 *   bias       D += bias[n] (before GELU); bias is BF16/FP16/FP32.
 *   gelu       with pre_gelu_out: pre_gelu_out = the value before GELU and
 *              D = gelu_tanh(that value).
 *   bias_grad  bias_grad[m] = sum_k op(A)[m, k]: the bias gradient when op(A)
 *              is the transposed output gradient of a layer (the wgrad GEMM).
 *   FP8 D      d_scale given: D = saturate(RNE(result * d_scale)); d_amax
 *              (optional) receives max|result| (max-accumulated).
 *
 * FP8 on Hopper: cuBLASLt only takes the "TN" form for FP8; the core picks the
 * operand order and transposes an FP8 operand into the workspace when needed,
 * so every transa/transb combination works for every type. Query the
 * workspace size with te_gemm_workspace_size first.
 *
 * FP8 GEMM dimensions must be multiples of 16 (pad the tensors when not).
 */
#ifndef TE_GEMM_H_
#define TE_GEMM_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const te_tensor* a;            /* required */
  const te_tensor* a_scale_inv;  /* FP32 scalar, required iff A is FP8 */
  int transa;
  const te_tensor* b;            /* required */
  const te_tensor* b_scale_inv;  /* FP32 scalar, required iff B is FP8 */
  int transb;
  const te_tensor* c;            /* [M, N] like D's type (not FP8), or NULL (then beta must be 0) */
  te_tensor* d;                  /* [M, N]: FP32, BF16, FP16, or FP8 with d_scale */
  const te_tensor* d_scale;      /* FP32 scalar, required iff D is FP8 */
  te_tensor* d_amax;             /* FP32 scalar or NULL; only with FP8 D */
  const te_tensor* bias;         /* [N] or NULL */
  te_tensor* pre_gelu_out;       /* [M, N] or NULL: enables the GELU epilogue */
  te_tensor* bias_grad;          /* [M] or NULL */
  te_tensor* workspace;          /* bytes (TE_DTYPE_BYTE), >= te_gemm_workspace_size; may be NULL when that is 0 */
  float alpha;
  float beta;
  int use_split_accumulator;     /* FP8 only: 1 = exact FP32 accumulation, 0 = cuBLASLt fast accumulation */
} te_gemm_params;

/* Bytes of workspace te_gemm needs for these parameters (their data pointers
 * are not read). */
TE_API te_status te_gemm_workspace_size(const te_gemm_params* params, size_t* workspace_bytes);

TE_API te_status te_gemm(const te_gemm_params* params, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_GEMM_H_ */
