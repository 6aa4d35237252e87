/* Fused scaled (and masked) softmax, forward and backward: the reference
 * library's softmax.h (the unfused attention path's FusedScaleMaskSoftmax).
 *
 * Every variant takes a softmax along the last dimension (sk) of x. With
 * v_j = x_j * scale in FP32 over the visible elements j of a row:
 *   y_j = exp(v_j - m) / sum_k exp(v_k - m),  m = max_k v_k   (visible j, k)
 *   y_j = 0                                                   (masked j)
 * A row with no visible element, or whose visible logits are all -inf, gives
 * zeros; a NaN among the visible logits makes the row NaN (as +inf does).
 * Which elements are visible:
 *   scaled_softmax:                       all; x of any rank >= 1.
 *   scaled_masked_softmax:                x [b, h, sq, sk], mask BYTE (uint8)
 *                                         [b or 1, 1, sq, sk]: mask != 0 hides the element
 *                                         (the reference: 1 = masked).
 *   scaled_upper_triang_masked_softmax:   x [attn_batches, sq, sk] with sq == sk,
 *                                         causal: j <= i (top-left diagonal).
 *   scaled_aligned_causal_masked_softmax: x [b, h, sq, sk], causal aligned to the
 *                                         bottom-right corner: j <= i + sk - sq.
 * Masked elements are excluded exactly (weight 0). The reference instead fills them
 * with -10000 before the softmax, which is the same unless an unmasked logit is
 * itself near -10000; it also gives zeros for fully masked rows.
 * Backward (every variant, y the forward output):
 *   dx_j = scale * (y_j * (dy_j - sum_k dy_k y_k))
 * Masked elements have y = 0, hence dx = 0.
 * x, y, dy and dx are FP32, BF16 or FP16, one type per call; arithmetic is FP32
 * (expf; sums over a row in a fixed order per backend), the result rounded once.
 * CPU and CUDA agree within rounding (docs/numerics.md). y may be x itself and
 * dx may be dy itself (in place: a row is read whole before it is written);
 * any other overlap of an output with an argument is refused.
 */
#ifndef TE_SOFTMAX_H_
#define TE_SOFTMAX_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = softmax(x * scale) over the last dimension.
 * \param[in]  x      FP32, BF16 or FP16, rank >= 1, non-empty last dimension.
 * \param[in]  scale  finite.
 * \param[out] y      x's shape and type.
 */
TE_API te_status te_softmax_scaled_softmax_fwd(const te_tensor* x, float scale, te_tensor* y,
                                               te_stream stream);

/* dx = scale * y * (dy - sum(dy * y)) over the last dimension.
 * \param[in]  dy     the output gradient: y's shape and type.
 * \param[in]  y      the forward output.
 * \param[out] dx     y's shape and type (may be dy).
 */
TE_API te_status te_softmax_scaled_softmax_bwd(const te_tensor* dy, const te_tensor* y, float scale,
                                               te_tensor* dx, te_stream stream);

/* Softmax of x * scale with an explicit mask.
 * \param[in]  x     [b, h, sq, sk].
 * \param[in]  mask  TE_DTYPE_BYTE [b or 1, 1, sq, sk]; nonzero = masked out.
 * \param[out] y     x's shape and type.
 */
TE_API te_status te_softmax_scaled_masked_softmax_fwd(const te_tensor* x, const te_tensor* mask,
                                                      float scale, te_tensor* y, te_stream stream);

/* Backward of te_softmax_scaled_masked_softmax_fwd (the formula of te_softmax_scaled_softmax_bwd);
 * y, dy, dx [b, h, sq, sk]. */
TE_API te_status te_softmax_scaled_masked_softmax_bwd(const te_tensor* dy, const te_tensor* y,
                                                      float scale, te_tensor* dx, te_stream stream);

/* Causal softmax (j <= i) of x * scale; x [attn_batches, sq, sk] with sq == sk. */
TE_API te_status te_softmax_scaled_upper_triang_masked_softmax_fwd(const te_tensor* x, float scale,
                                                                   te_tensor* y, te_stream stream);

/* Backward of te_softmax_scaled_upper_triang_masked_softmax_fwd; y, dy, dx [attn_batches, s, s]. */
TE_API te_status te_softmax_scaled_upper_triang_masked_softmax_bwd(const te_tensor* dy,
                                                                   const te_tensor* y, float scale,
                                                                   te_tensor* dx, te_stream stream);

/* Bottom-right aligned causal softmax (j <= i + sk - sq) of x * scale; x [b, h, sq, sk]. */
TE_API te_status te_softmax_scaled_aligned_causal_masked_softmax_fwd(const te_tensor* x,
                                                                     float scale, te_tensor* y,
                                                                     te_stream stream);

/* Backward of te_softmax_scaled_aligned_causal_masked_softmax_fwd; y, dy, dx [b, h, sq, sk]. */
TE_API te_status te_softmax_scaled_aligned_causal_masked_softmax_bwd(const te_tensor* dy,
                                                                     const te_tensor* y,
                                                                     float scale, te_tensor* dx,
                                                                     te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_SOFTMAX_H_ */
