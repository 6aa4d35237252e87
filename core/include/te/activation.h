/* Activations of the MLP block, forward and backward, with fused FP8 outputs.
 *
 * Plain kinds act elementwise: output = f(x), same shape as the input.
 * Gated kinds split the last dimension of the input [..., 2H] into two halves,
 * a = x[..., :H] (the FIRST half, the activated part) and b = x[..., H:] (the
 * second half, the linear part), and compute output[..., :H] = f(a) * lin(b).
 * (The reference library's convention; PyTorch's nn.GLU gates the other way.)
 *
 *   kind            f(x)                                    lin(b)
 *   gelu  / geglu   x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)   b
 *                   (= 0.5 x (1 + tanh(u)), the tanh approximation)
 *   relu  / reglu   max(x, 0)                               b
 *   silu  / swiglu  x * sigmoid(x)                          b
 *   qgelu / qgeglu  x * sigmoid(1.702 x)                    b
 *   srelu / sreglu  max(x, 0)^2                             b
 *           glu     sigmoid(x)                              b
 *   clamped_swiglu  c * sigmoid(alpha c), c = min(x, limit) clamp(b, -limit, limit) +
 * glu_linear_offset (GPT-OSS; defaults limit 7, alpha 1.702, offset 1)
 *
 * Backward, given grad = dL/d(output) and the forward input x:
 *   plain:  grad_input = grad * f'(x)
 *   gated:  grad_input[..., :H] = (grad * f'(a)) * lin(b)
 *           grad_input[..., H:] = (grad * f(a)) * lin'(b)
 *   so grad_input always has the input's shape. For clamped_swiglu
 *   f'(a) = 0 where a > limit, lin'(b) = 0 where |b| > limit, 1 otherwise
 *   (at a == limit and |b| == limit the derivative of the unclamped side is used).
 *
 * Arithmetic (docs/numerics.md has the details): inputs widen exactly to FP32,
 * every value is computed in FP32 in a fixed order, each +, -, *, / rounded
 * once and each explicit fused multiply-add rounded once (no other FMA
 * contraction), with exp evaluated by the core's own routine, so the CPU and
 * CUDA backends produce identical bits. Every NaN result is the canonical NaN
 * (0x7FC00000); NaN inputs propagate through every term that reads them.
 * sigmoid(+-inf) = 1 / 0, f(-inf) = -0 for the sigmoid-based kinds, f(+inf) = +inf.
 *
 * Outputs: the FP32 value v is written once, rounded to the output's type
 * (FP32, BF16, FP16; round to nearest even), or, for an FP8 output, quantized
 * exactly as te_cast_quantize_fp8 would quantize an FP32 tensor of the values v:
 * q = fp8(v * scale), scale_inv = 1 / scale, amax = max(amax, max|v|) (NaN
 * skipped). With a high-precision output the optional amax is that of the
 * values AS STORED: amax = max(amax, max|round(v)|), round to the output's type
 * (NaN skipped), which is what a separate amax pass over the output computes,
 * so current scaling can take its scale from it without re-reading the output.
 * (With an FP8 output amax is of the unrounded v, as delayed scaling's
 * reference does.) "columnwise" is the FP8 output viewed as [M, N] (N its last dim)
 * and transposed to [N, M], as Hopper FP8 GEMMs need; it has the same bytes.
 *
 * Bias gradient (backward): dbias[j] = sum over rows r of grad_input[r, j] in
 * FP32 (the values before rounding to grad_input's type), in a fixed order:
 * rows in groups of 4 (rows 4i .. 4i+3), each group summed in row order; the
 * 16 group sums of each 64-row chunk added in order; the chunk sums added in
 * chunk order (every sum starts from +0). The result is rounded once to
 * dbias's type. The CUDA backend needs a caller-allocated workspace for it
 * (te_activation_bwd_workspace_size); the order is the same on both backends,
 * so they give the same bits.
 */
#ifndef TE_ACTIVATION_H_
#define TE_ACTIVATION_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The activation kinds, one line each: the single source of truth. The
 * te_activation enum below, the core's name table, validation and dispatch,
 * the CUDA build's one translation unit per kind (CMake reads these lines) and
 * te-core's Python table (lib.activation_kinds(), which te-core, te-pytorch and
 * te-jax read) are all generated from it. Adding a kind is one line here plus
 * its functor (docs/architecture.md, "Adding an activation kind").
 *   X(ID, name, code, gated, functor, params)
 *   ID       the enum constant is TE_ACTIVATION_<ID>
 *   name     LayerNormMLP's `activation` value
 *   code     the enum value (part of the ABI: never renumber)
 *   gated    1: the input is [..., 2H], halves [activated | linear]
 *   functor  the core's f and f' (core/src/activation/functions.h)
 *   params   1: reads te_activation_params (defaults TE_ACTIVATION_DEFAULT_*)
 * core/CMakeLists.txt reads the lines "  X(ID, ...": keep one kind per line. */
/* clang-format off */
#define TE_ACTIVATION_KINDS(X)                          \
  X(GELU, gelu, 0, 0, Gelu, 0)                          \
  X(RELU, relu, 1, 0, Relu, 0)                          \
  X(SILU, silu, 2, 0, Silu, 0)                          \
  X(QGELU, qgelu, 3, 0, QGelu, 0)                       \
  X(SRELU, srelu, 4, 0, SRelu, 0)                       \
  X(GEGLU, geglu, 5, 1, Gelu, 0)                        \
  X(REGLU, reglu, 6, 1, Relu, 0)                        \
  X(SWIGLU, swiglu, 7, 1, Silu, 0)                      \
  X(QGEGLU, qgeglu, 8, 1, QGelu, 0)                     \
  X(SREGLU, sreglu, 9, 1, SRelu, 0)                     \
  X(GLU, glu, 10, 1, Sigmoid, 0)                        \
  X(CLAMPED_SWIGLU, clamped_swiglu, 11, 1, ClampedSwish, 1)
/* clang-format on */

/* Which activation (codes from the table above). */
#define TE_ACTIVATION_ENUM_ENTRY_(ID, name, code, gated, functor, params) TE_ACTIVATION_##ID = code,
typedef enum TE_ENUM_BASE { TE_ACTIVATION_KINDS(TE_ACTIVATION_ENUM_ENTRY_) } te_activation;
#undef TE_ACTIVATION_ENUM_ENTRY_

/* The defaults of te_activation_params (GPT-OSS's clamped_swiglu), written as
 * double constants so that bindings can show them as written; the struct
 * holds them rounded to float. */
#define TE_ACTIVATION_DEFAULT_LIMIT 7.0
#define TE_ACTIVATION_DEFAULT_ALPHA 1.702
#define TE_ACTIVATION_DEFAULT_GLU_LINEAR_OFFSET 1.0

/* Parameters of the kinds whose table line has params = 1 (clamped_swiglu;
 * the other kinds ignore them). Passing NULL means the defaults above.
 * limit must be > 0 (inf allowed: no clamping); alpha and the offset finite. */
typedef struct {
  float limit;
  float alpha;
  float glu_linear_offset;
} te_activation_params;

/* Forward: output = f(input) (plain) or f(a) * lin(b) (gated).
 * \param[in]     input       FP32, BF16 or FP16; gated kinds need an even last dim 2H.
 * \param[out]    output      input's shape (gated: last dim H); FP32, BF16, FP16,
 *                            E4M3 or E5M2. May be NULL when columnwise is given.
 * \param[out]    columnwise  FP8 [N, M] transposed copy (N = output's last dim,
 *                            M = the product of the others), or NULL. Same FP8
 *                            type as output when both are given.
 * \param[in]     scale       FP32 scalar; required with an FP8 output, else NULL.
 * \param[out]    scale_inv   FP32 scalar 1/scale, or NULL; only with an FP8 output.
 * \param[in,out] amax        FP32 scalar, or NULL (allowed with any output type):
 *                            amax = max(amax, max|v|) with an FP8 output,
 *                            max(amax, max|output|) (stored values) otherwise. */
TE_API te_status te_activation_fwd(te_activation kind, const te_activation_params* params,
                                   const te_tensor* input, te_tensor* output, te_tensor* columnwise,
                                   const te_tensor* scale, te_tensor* scale_inv, te_tensor* amax,
                                   te_stream stream);

/* The arguments of te_activation_bwd (and of its fused variant below).
 *   kind, params  as in te_activation_fwd.
 *   grad        the forward output's shape, same dtype as input.
 *   input       the forward input (FP32, BF16 or FP16).
 *   grad_input  [out] input's shape; FP32, BF16, FP16, E4M3 or E5M2.
 *               May be NULL when columnwise is given.
 *   columnwise  [out] FP8 [K, M] transposed copy of grad_input (K = input's
 *               last dim), or NULL; same FP8 type as grad_input.
 *   scale, scale_inv, amax   as in te_activation_fwd, for grad_input
 *               (a high-precision grad_input: amax of its stored values).
 *   dbias       [out] [K], FP32, BF16 or FP16, or NULL.
 *   workspace   TE_DTYPE_BYTE, at least te_activation_bwd_workspace_size
 *               bytes, 16-byte aligned; may be NULL when that size is 0. */
typedef struct {
  te_activation kind;
  const te_activation_params* params;
  const te_tensor* grad;
  const te_tensor* input;
  te_tensor* grad_input;
  te_tensor* columnwise;
  const te_tensor* scale;
  te_tensor* scale_inv;
  te_tensor* amax;
  te_tensor* dbias;
  te_tensor* workspace;
} te_activation_bwd_params;

/* Backward: grad_input = d(output)/d(input) applied to grad, plus an optional
 * bias gradient and FP8 outputs (the reference's dact + dbias + cast + transpose). */
TE_API te_status te_activation_bwd(const te_activation_bwd_params* params, te_stream stream);

/* te_activation_bwd fused with the forward's FP8 columnwise copy: the same pass
 * over (grad, input) also computes the forward values v = f(x) (plain) or
 * f(a) * lin(b) (gated) and writes fwd_columnwise[j, r] = fp8(s(v[r, j]) *
 * fwd_scale), fwd_scale_inv = 1 / fwd_scale, where s(v) is v as an output of
 * type fwd_values_dtype stores it (round to nearest even; FP32: v itself).
 * With FP32 these are the bytes of te_activation_fwd(kind, params, input,
 * output = NULL, fwd_columnwise, fwd_scale, fwd_scale_inv, amax = NULL); with
 * BF16/FP16 those of te_cast_quantize_fp8 (columnwise) of te_activation_fwd's
 * BF16/FP16 output (how current scaling quantizes it, after its amax pass).
 * That is the operand fc2's wgrad reads in LayerNormMLP's backward, which
 * would otherwise need a pass of its own over the input. Every other argument
 * and output is exactly te_activation_bwd's (grad_input of any allowed type,
 * with or without its columnwise copy and dbias).
 * \param[in]     params          te_activation_bwd's arguments.
 * \param[out]    fwd_columnwise  FP8 (E4M3 or E5M2) [H, M]: H the forward output's
 *                                last dim, M the product of the others. Required.
 * \param[in]     fwd_scale       FP32 scalar. Required.
 * \param[out]    fwd_scale_inv   FP32 scalar 1 / fwd_scale, or NULL.
 * \param[in]     fwd_values_dtype  TE_DTYPE_FLOAT32, _BFLOAT16 or _FLOAT16. */
TE_API te_status te_activation_bwd_with_fwd_columnwise(const te_activation_bwd_params* params,
                                                       te_tensor* fwd_columnwise,
                                                       const te_tensor* fwd_scale,
                                                       te_tensor* fwd_scale_inv,
                                                       te_dtype fwd_values_dtype, te_stream stream);

/* Bytes of workspace te_activation_bwd (and the fused variant above) needs: 4 * ceil(M / 64) * K
 * for a CUDA input with a bias gradient (one FP32 partial sum per 64-row chunk and column), else 0.
 * Only input's shape and device are read, not its data. */
TE_API te_status te_activation_bwd_workspace_size(const te_tensor* input, int with_dbias,
                                                  size_t* workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif /* TE_ACTIVATION_H_ */
