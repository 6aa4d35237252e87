/* Per-tensor FP8 quantization: delayed scaling, current scaling, amax, dequantize.
 *
 * A tensor of any rank is viewed as a matrix [M, K]: K is its last dimension and
 * M the product of the others. "Columnwise" output is that matrix transposed,
 * [K, M], which is what Hopper FP8 GEMMs need for the second operand (the
 * reference library's cast-transpose).
 *
 * Quantization, for every element x:
 *     q = saturate(round_to_nearest_even(float32(x) * scale))
 * where saturate clamps to +-fp8_max (448 for E4M3, 57344 for E5M2), +-inf
 * saturate to +-fp8_max, and NaN gives the canonical NaN byte 0x7F.
 * Dequantization: x' = float32(q) * scale_inv, rounded to the output type.
 * amax ignores NaN (it is max(|x|) over the non-NaN elements, 0 when none).
 */
#ifndef TE_CAST_H_
#define TE_CAST_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Delayed-scaling quantize with a given scale (one FP32 element, on the
 * input's device).
 * \param[in]     input      FP32, BF16 or FP16, any shape (last dim K).
 * \param[in]     scale      FP32 scalar: the factor applied before the cast.
 * \param[out]    rowwise    FP8 (E4M3 or E5M2), same shape as input; may be NULL.
 * \param[out]    columnwise FP8, shape [K, M]; may be NULL. Same FP8 type as rowwise.
 *                           At least one of rowwise/columnwise must be given.
 * \param[out]    scale_inv  FP32 scalar, written with 1/scale; may be NULL.
 * \param[in,out] amax       FP32 scalar, amax = max(amax, max|x|); may be NULL.
 */
TE_API te_status te_cast_quantize_fp8(const te_tensor* input, const te_tensor* scale,
                                      te_tensor* rowwise, te_tensor* columnwise,
                                      te_tensor* scale_inv, te_tensor* amax, te_stream stream);

/* amax = max|x| over the non-NaN elements of input (0 for an empty or all-NaN
 * tensor). Overwrites amax (FP32 scalar). */
TE_API te_status te_cast_compute_amax(const te_tensor* input, te_tensor* amax, te_stream stream);

/* Scale from amax, the reference library's compute_scale_from_amax:
 *     a = max(amax, amax_epsilon)
 *     scale = fp8_max / a        (IEEE division, round to nearest)
 *     scale = 1                  when a is 0, inf or NaN
 *     scale = FLT_MAX            when the division overflows to inf
 *     scale = 2^floor(log2(scale)) when force_pow2_scales (mantissa cleared)
 * fp8_max comes from fp8_dtype (E4M3: 448, E5M2: 57344).
 * \param[in]  amax       FP32 scalar.
 * \param[out] scale      FP32 scalar.
 * \param[out] scale_inv  FP32 scalar 1/scale; may be NULL. */
TE_API te_status te_cast_compute_scale_from_amax(const te_tensor* amax, te_tensor* scale,
                                                 te_tensor* scale_inv, te_dtype fp8_dtype,
                                                 int force_pow2_scales, float amax_epsilon,
                                                 te_stream stream);

/* Current-scaling quantize: amax of input, scale from amax (as above, except
 * that an infinite scale becomes the largest finite value of the input's type,
 * as the reference library's fused kernels do), then quantize with it.
 * The FP8 type is the one of rowwise (or columnwise when rowwise is NULL).
 * \param[out] scale, scale_inv, amax  FP32 scalars, all written. */
TE_API te_status te_cast_quantize_fp8_current_scaling(const te_tensor* input, te_tensor* rowwise,
                                                      te_tensor* columnwise, te_tensor* scale,
                                                      te_tensor* scale_inv, te_tensor* amax,
                                                      int force_pow2_scales, float amax_epsilon,
                                                      te_stream stream);

/* Dequantize per-tensor FP8: output = float32(input) * scale_inv, rounded
 * (nearest even) to output's type (FP32, BF16 or FP16). Same shape. */
TE_API te_status te_cast_dequantize_fp8(const te_tensor* input, const te_tensor* scale_inv,
                                        te_tensor* output, te_stream stream);

/* Deprecated aliases: the names before the te_<family>_<verb> rule
 * (docs/c_api.md). They forward to the new names and go in the next release. */
TE_DEPRECATED("renamed te_cast_quantize_fp8_current_scaling")
TE_API te_status te_quantize_fp8_current_scaling(const te_tensor* input, te_tensor* rowwise,
                                                 te_tensor* columnwise, te_tensor* scale,
                                                 te_tensor* scale_inv, te_tensor* amax,
                                                 int force_pow2_scales, float amax_epsilon,
                                                 te_stream stream);
TE_DEPRECATED("renamed te_cast_quantize_fp8")
TE_API te_status te_quantize_fp8(const te_tensor* input, const te_tensor* scale, te_tensor* rowwise,
                                 te_tensor* columnwise, te_tensor* scale_inv, te_tensor* amax,
                                 te_stream stream);
TE_DEPRECATED("renamed te_cast_compute_scale_from_amax")
TE_API te_status te_compute_scale_from_amax(const te_tensor* amax, te_tensor* scale,
                                            te_tensor* scale_inv, te_dtype fp8_dtype,
                                            int force_pow2_scales, float amax_epsilon,
                                            te_stream stream);
TE_DEPRECATED("renamed te_cast_compute_amax")
TE_API te_status te_compute_amax(const te_tensor* input, te_tensor* amax, te_stream stream);
TE_DEPRECATED("renamed te_cast_dequantize_fp8")
TE_API te_status te_dequantize_fp8(const te_tensor* input, const te_tensor* scale_inv,
                                   te_tensor* output, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_CAST_H_ */
