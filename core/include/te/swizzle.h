/* The GEMM ("swizzled") layout of one-byte block scales (MXFP8 E8M0, NVFP4 E4M3).
 *
 * cuBLASLt's block-scaled GEMMs read the scales of an operand in 128x4 tiles:
 * 128 rows of the operand's outer dimension (M for A, N for B) by 4 scales along
 * K. A compact row-major scale matrix S [R, C] (R % 128 == 0, C % 4 == 0; S[r, j]
 * scales row r, K-block j) is stored swizzled as
 *
 *   offset(r, j) = ((r / 128) * (C / 4) + j / 4) * 512       512-byte tile, tiles
 *                + (r % 32) * 16 + ((r % 128) / 32) * 4      row-major over
 *                + j % 4                                      [R/128, C/4]
 *
 * so within a tile the 16-byte groups hold rows 0,32,64,96, then 1,33,65,97, ...
 * (4 scales each). This is the "rowwise" variant.
 *
 * Columnwise scales (blocks running down the columns of an [M, K] operand, as
 * MXFP8 columnwise data has) are stored compact as [R, C] = [M/32 padded to 4,
 * K padded to 128]: their GEMM outer dimension is the column index. The
 * "columnwise" variant swizzles the transpose: S[i, c] goes to offset(c, i)
 * with C / 4 replaced by R / 4 (R % 4 == 0, C % 128 == 0).
 *
 * Both functions are pure permutations of every byte, padding included; the
 * inverse restores the compact layout exactly.
 */
#ifndef TE_SWIZZLE_H_
#define TE_SWIZZLE_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Compact -> swizzled.
 * \param[in]  input       one-byte elements (byte, FP8, E8M0), 2-D [R, C]:
 *                         R % 128 == 0 and C % 4 == 0, or, when columnwise,
 *                         R % 4 == 0 and C % 128 == 0.
 * \param[out] output      same dtype and shape; must not overlap input.
 * \param[in]  columnwise  nonzero: the columnwise variant (see above). */
TE_API te_status te_swizzle_block_scales(const te_tensor* input, te_tensor* output, int columnwise,
                                         te_stream stream);

/* Swizzled -> compact: the inverse of te_swizzle_block_scales (same arguments). */
TE_API te_status te_swizzle_block_scales_inverse(const te_tensor* input, te_tensor* output,
                                                 int columnwise, te_stream stream);

/* Deprecated aliases: the names before the te_<family>_<verb> rule
 * (docs/c_api.md). They forward to the new names and go in the next release. */
TE_DEPRECATED("renamed te_swizzle_block_scales_inverse")
TE_API te_status te_unswizzle_block_scales(const te_tensor* input, te_tensor* output,
                                           int columnwise, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_SWIZZLE_H_ */
