/* Delayed-scaling recipe: amax-history roll and scale update, many tensors in
 * one launch (the reference library's
 * nvte_delayed_scaling_recipe_amax_and_scale_update_after_reduction).
 *
 * Group k owns an amax history H_k [L, n_k] (row 0 is the staging slot the
 * quantize kernels max-reduce into), a scale S_k [n_k] and optionally a
 * scale_inv [n_k]. The reduction buffer, when given, is the concatenation of
 * the (all-reduced) staging rows of all groups, sum(n_k) elements.
 * For each column j of each group:
 *   last = buffer[j] if the buffer is given and buffer[j] != 0, else H[0][j]
 *   if last != 0:   a_i = H[i+1][j] for i < L-1, a_{L-1} = last
 *                   amax = max_i a_i ; H[0][j] = 0 ; H[i][j] = a_i for i > 0
 *   else:           no roll; amax = 0 (so the scale is kept)
 *   algo MOST_RECENT uses amax = last instead of the window max.
 *   scale = (fp8_max * 2^-margin) / amax  if amax is finite and > 0,
 *           else the old scale; an infinite result becomes FLT_MAX.
 *   scale_inv = 1 / scale.
 */
#ifndef TE_RECIPE_H_
#define TE_RECIPE_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum TE_ENUM_BASE {
  TE_AMAX_COMPUTE_MAX = 0,
  TE_AMAX_COMPUTE_MOST_RECENT = 1
} te_amax_compute_algo;

/* \param[in]     amax_reduction_buffer  FP32 [sum n_k], or NULL.
 * \param[in,out] amax_histories          num_tensors FP32 tensors [L, n_k], same L.
 * \param[in,out] scales                  num_tensors FP32 tensors [n_k].
 * \param[out]    scale_invs              num_tensors FP32 tensors [n_k], or NULL.
 * \param[in]     fp8_dtype               E4M3 or E5M2: gives fp8_max.
 * \param[in]     margin                  the recipe margin (>= 0). */
TE_API te_status te_recipe_delayed_scaling_update(const te_tensor* amax_reduction_buffer,
                                                  te_tensor* const* amax_histories,
                                                  te_tensor* const* scales,
                                                  te_tensor* const* scale_invs, size_t num_tensors,
                                                  te_amax_compute_algo algo, te_dtype fp8_dtype,
                                                  float margin, te_stream stream);

/* Deprecated aliases: the names before the te_<family>_<verb> rule
 * (docs/c_api.md). They forward to the new names and go in the next release. */
TE_DEPRECATED("renamed te_recipe_delayed_scaling_update")
TE_API te_status te_delayed_scaling_update(const te_tensor* amax_reduction_buffer,
                                           te_tensor* const* amax_histories,
                                           te_tensor* const* scales, te_tensor* const* scale_invs,
                                           size_t num_tensors, te_amax_compute_algo algo,
                                           te_dtype fp8_dtype, float margin, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_RECIPE_H_ */
