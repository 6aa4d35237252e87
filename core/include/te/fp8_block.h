/* FP8 block scaling (the reference library's Float8BlockScaling, DeepSeek-v3
 * style): FP8 data with one FP32 scale per block of 128 elements (1-D) or per
 * 128x128 tile (2-D).
 *
 * A tensor of any rank is viewed as a matrix [M, K]: K is its last dimension
 * and M the product of the others. K must be a multiple of 16 (what FP8 GEMMs
 * and 16-byte vector accesses need); M is free. Blocks that the tensor's edge
 * cuts (M or K not a multiple of 128) use only their valid elements.
 *
 * Blocks:
 *   TE_FP8_BLOCK_1D  rowwise: 1x128 (128 consecutive elements of a row);
 *                    columnwise: 128x1 (128 consecutive rows of a column).
 *                    The two directions have different blocks, so columnwise
 *                    data is always quantized from the high-precision input,
 *                    never derived from rowwise data.
 *   TE_FP8_BLOCK_2D  128x128 tiles in both directions: the columnwise data and
 *                    scales are exactly the rowwise ones transposed
 *                    (te_fp8_block_transpose_2d derives them).
 *
 * Per block, with fp8_max = 448 (E4M3) or 57344 (E5M2):
 *   amax = max |x| over the block's non-NaN elements (0 when none)
 *   s    = the scale-from-amax formula of cast.h, as the fused current-scaling quantize uses it:
 *          a = max(amax, amax_epsilon); s = 1 when a is 0, inf or NaN;
 *          else s = fp8_max / a (IEEE, RNE); when that overflows, s = the largest
 *          finite value of the input's type (FLT_MAX, 0x1.FEp127 for BF16, 65504);
 *          then, with force_pow2_scales, rounded down to a power of 2
 *   q    = saturate(round_to_nearest_even(float32(x) * s))   (as in cast.h; NaN -> 0x7F)
 *   scale_inv = 1 / s   (FP32 IEEE division): the stored decode scale
 * Dequantize: y = out_type(float32(q) * scale_inv of q's block).
 *
 * Layouts of a [M, K] tensor (b = 128, cdiv = ceiling division, pad4(n) =
 * n rounded up to a multiple of 4):
 *
 *   TE_FP8_BLOCK_GEMM_READY (what block-scaled GEMMs read)
 *     rowwise data        [M, K]   (input's shape)
 *     columnwise data     [K, M]   transposed
 *     1-D rowwise scales    [cdiv(K,b), pad4(M)]         scale of row m, block j at [j, m]
 *     1-D columnwise scales [cdiv(M,b), pad4(K)]         scale of column k, block i at [i, k]
 *     2-D rowwise scales    [cdiv(M,b), pad4(cdiv(K,b))] tile (i, j) at [i, j]
 *     2-D columnwise scales [cdiv(K,b), pad4(cdiv(M,b))] tile (i, j) at [j, i]
 *     The columnwise data and scales of [M, K] are exactly the rowwise ones
 *     of the transposed [K, M] matrix. Padding entries (the last dimension's
 *     positions past the real count) are written as 0.0f.
 *
 *   TE_FP8_BLOCK_COMPACT (for all-gather: rows can be concatenated; no padding)
 *     rowwise data        [M, K]
 *     columnwise data     [M, K]   not transposed
 *     1-D rowwise scales    [M, cdiv(K,b)]               row m, block j at [m, j]
 *     1-D columnwise scales [cdiv(M,b), K]               column k, block i at [i, k]
 *     2-D scales (both)     [cdiv(M,b), cdiv(K,b)]       tile (i, j) at [i, j]
 *     (2-D compact columnwise data and scales equal the rowwise ones.)
 *
 * Scale tensors are FP32 matrices of the shapes above (any rank whose matrix
 * view [prod(leading dims), last dim] matches). te_fp8_block_scale_shape
 * gives them.
 */
#ifndef TE_FP8_BLOCK_H_
#define TE_FP8_BLOCK_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TE_FP8_BLOCK_SIZE 128

typedef enum TE_ENUM_BASE {
  TE_FP8_BLOCK_1D = 1, /* 1x128 rowwise, 128x1 columnwise */
  TE_FP8_BLOCK_2D = 2  /* 128x128 */
} te_fp8_block_dim;

typedef enum TE_ENUM_BASE {
  TE_FP8_BLOCK_GEMM_READY = 0, /* columnwise data transposed, scales padded (see above) */
  TE_FP8_BLOCK_COMPACT = 1     /* nothing transposed or padded */
} te_fp8_block_layout;

/* Shape of a scale tensor for an [rows, cols] = [M, K] tensor.
 * \param[in]  columnwise  0: the rowwise scales; 1: the columnwise scales.
 * \param[out] shape       {outer, inner}. */
TE_API te_status te_fp8_block_scale_shape(int64_t rows, int64_t cols, te_fp8_block_dim block_dim,
                                          te_fp8_block_layout layout, int columnwise,
                                          int64_t shape[2]);

/* Quantize with per-block scales, rowwise and/or columnwise in one pass.
 * \param[in]  input                 FP32, BF16 or FP16, [M, K] view, K % 16 == 0.
 * \param[out] rowwise               FP8 (E4M3 or E5M2), input's shape; may be NULL.
 * \param[out] rowwise_scale_inv     FP32 rowwise scales; required with rowwise.
 * \param[out] columnwise            FP8, [K, M] (GEMM-ready) or input's shape (compact);
 *                                   may be NULL. Same FP8 type as rowwise.
 * \param[out] columnwise_scale_inv  FP32 columnwise scales; required with columnwise.
 * At least one of rowwise/columnwise must be given.
 * \param[in]  force_pow2_scales     nonzero: power-of-2 scales (the recipe's default).
 * \param[in]  amax_epsilon          floor of each block's amax, >= 0. */
TE_API te_status te_fp8_block_quantize(const te_tensor* input, te_tensor* rowwise,
                                       te_tensor* rowwise_scale_inv, te_tensor* columnwise,
                                       te_tensor* columnwise_scale_inv, te_fp8_block_dim block_dim,
                                       te_fp8_block_layout layout, int force_pow2_scales,
                                       float amax_epsilon, te_stream stream);

/* Dequantize one stored FP8 block-scaled matrix: output = float32(q) * its
 * block's scale_inv, rounded (nearest even) to output's type.
 * \param[in]  data        FP8 data as stored: rowwise [M, K], or columnwise
 *                         ([K, M] GEMM-ready, [M, K] compact).
 * \param[in]  scale_inv   its FP32 scales, in the layout above.
 * \param[out] output      FP32, BF16 or FP16, data's shape (so a GEMM-ready
 *                         columnwise input gives the transposed tensor).
 * \param[in]  columnwise  which of the two the data is. Only 1-D compact data
 *                         depends on it: GEMM-ready columnwise data of [M, K]
 *                         is the rowwise data of [K, M], and 2-D blocks are
 *                         direction-free. */
TE_API te_status te_fp8_block_dequantize(const te_tensor* data, const te_tensor* scale_inv,
                                         te_tensor* output, te_fp8_block_dim block_dim,
                                         te_fp8_block_layout layout, int columnwise,
                                         te_stream stream);

/* 2-D blocks only: the columnwise data and scales from the rowwise ones,
 * bit-identical to quantizing columnwise from the input (128x128 tiles are
 * the same in both directions). GEMM-ready: data [M, K] -> [K, M] and the
 * valid scale tiles transposed (padding written as 0.0f); compact: copies.
 * \param[in]  rowwise, rowwise_scale_inv         FP8 [M, K] and its 2-D scales.
 * \param[out] columnwise, columnwise_scale_inv   as te_fp8_block_quantize writes them. */
TE_API te_status te_fp8_block_transpose_2d(const te_tensor* rowwise,
                                           const te_tensor* rowwise_scale_inv,
                                           te_tensor* columnwise, te_tensor* columnwise_scale_inv,
                                           te_fp8_block_layout layout, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_FP8_BLOCK_H_ */
