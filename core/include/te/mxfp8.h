/* MXFP8: FP8 data with one power-of-two (E8M0) scale per block of 32 elements.
 *
 * A tensor of rank >= 2 is viewed as a matrix [M, K]: K is its last dimension
 * and M the product of the others.
 *
 * Blocks
 *   rowwise     1x32: x[r, 32j .. 32j+31]          (K % 32 == 0)
 *   columnwise  32x1: x[32i .. 32i+31, c]           (also M % 32 == 0)
 *   2-D         32x32: x[32i.., 32j..] (use_2d_blocks; M % 32 == 0). One scale per
 *               tile is used by both directions, so rowwise and columnwise data
 *               are then byte-identical.
 * Columnwise data is NOT transposed: it has the input's shape [.., K], only its
 * blocks run down the columns (Blackwell GEMMs take it as it is).
 *
 * Quantization of one block with elements x (FP32/BF16/FP16 widened to FP32):
 *   amax = max |x| over the non-NaN elements (0 when there are none)
 *   v    = fl32(amax * R)              R = fl32(1/fp8_max): FP32 multiply, not a
 *                                      division (448 for E4M3, 57344 for E5M2)
 *   e    = e8m0_round_up(v)            the stored scale byte, see below
 *   q    = fp8(fl32(x * 2^(127 - e)))  RNE, saturating to +-fp8_max (inf too),
 *                                      NaN -> 0x7F, as in te/cast.h
 * e8m0_round_up(v) = the smallest e in [0, 254] with 2^(e-127) >= v:
 *   v NaN -> 255; v inf -> 254; v == 0 -> 0;
 *   v normal, FP32 exponent field E, mantissa m: E if m == 0, else E + 1,
 *     except E == 254 with m != 0 stays 254 (saturate; no finite amax gets there:
 *     amax * R < 2^120);
 *   v subnormal: 0 if v <= 2^-127 (mantissa <= 0x400000), else 1.
 * So 2^(e-127) = 2^ceil(log2(amax / fp8_max)) and |x * 2^(127-e)| <= fp8_max: the
 * exponent is rounded UP and no finite element saturates. 2^(127-e) is exact
 * for every e <= 254 (2^127 for e = 0, the subnormal 2^-127 for e = 254).
 * Consequences: an all-zero or all-NaN block gets e = 0 (its NaNs stay 0x7F); a
 * block holding +-inf gets e = 254, its infinities become +-fp8_max and its
 * finite elements x * 2^-127. e = 255 is never written.
 *
 * Dequantization: y = out_type(fl32(float(q) * 2^(e - 127))), 2^-127 for e = 0
 * (subnormal, exact), NaN for e = 255; rounded to nearest even into FP32/BF16/FP16.
 * A NaN result is the quiet NaN with the sign bit of q's byte (FP32 0x7FC00000 /
 * 0xFFC00000, BF16/FP16 0x7FFF / 0xFFFF), on both backends.
 *
 * Scale buffers: E8M0 (TE_DTYPE_FLOAT8E8M0, one byte each), 2-D, padded:
 *   rowwise     [roundup(M, 128), roundup(K / 32, 4)]   scale of block (r, j) at [r, j]
 *   columnwise  [roundup(M / 32, 4), roundup(K, 128)]   scale of block (i, c) at [i, c]
 * With 2-D blocks the tile (i, j) scale is repeated: rowwise [r, j] for the 32
 * rows r of the tile, columnwise [i, c] for its 32 columns c. Padding bytes are
 * written as 0. With swizzled_scales the same buffers hold the cuBLAS "128x4
 * tile" layout instead (te/swizzle.h; columnwise scales as their transpose),
 * padding included (zeros stay zeros).
 */
#ifndef TE_MXFP8_H_
#define TE_MXFP8_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MXFP8 quantize: rowwise and/or columnwise data with their E8M0 scales in one
 * pass over the input.
 * \param[in]  input                 FP32, BF16 or FP16, rank >= 2, shape [.., K].
 * \param[out] rowwise               FP8 (E4M3 or E5M2), input's shape; may be NULL.
 * \param[out] rowwise_scale_inv     E8M0 [roundup(M,128), roundup(K/32,4)]; given
 *                                   exactly when rowwise is.
 * \param[out] columnwise            FP8, input's shape (not transposed); may be NULL.
 *                                   Same FP8 type as rowwise.
 * \param[out] columnwise_scale_inv  E8M0 [roundup(M/32,4), roundup(K,128)]; given
 *                                   exactly when columnwise is.
 * \param[in]  use_2d_blocks         nonzero: 32x32 blocks (needs M % 32 == 0).
 * \param[in]  swizzled_scales       nonzero: write the scales in the GEMM
 *                                   (swizzled) layout instead of the compact one.
 * At least one of rowwise/columnwise must be given. */
TE_API te_status te_mxfp8_quantize(const te_tensor* input, te_tensor* rowwise,
                                   te_tensor* rowwise_scale_inv, te_tensor* columnwise,
                                   te_tensor* columnwise_scale_inv, int use_2d_blocks,
                                   int swizzled_scales, te_stream stream);

/* MXFP8 dequantize one direction: output = float(q) * 2^(e - 127), rounded to
 * output's type.
 * \param[in]  input            FP8 data (rowwise or columnwise), rank >= 2, K % 32 == 0
 *                              (and M % 32 == 0 when columnwise).
 * \param[in]  scale_inv        its E8M0 scales, padded shape as in te_mxfp8_quantize.
 * \param[out] output           FP32, BF16 or FP16, input's shape.
 * \param[in]  columnwise       nonzero: input holds columnwise (32x1) blocks.
 * \param[in]  swizzled_scales  nonzero: scale_inv is in the swizzled layout. */
TE_API te_status te_mxfp8_dequantize(const te_tensor* input, const te_tensor* scale_inv,
                                     te_tensor* output, int columnwise, int swizzled_scales,
                                     te_stream stream);

/* Deprecated aliases: the names before the te_<family>_<verb> rule
 * (docs/c_api.md). They forward to the new names and go in the next release. */
TE_DEPRECATED("renamed te_mxfp8_quantize")
TE_API te_status te_quantize_mxfp8(const te_tensor* input, te_tensor* rowwise,
                                   te_tensor* rowwise_scale_inv, te_tensor* columnwise,
                                   te_tensor* columnwise_scale_inv, int use_2d_blocks,
                                   int swizzled_scales, te_stream stream);
TE_DEPRECATED("renamed te_mxfp8_dequantize")
TE_API te_status te_dequantize_mxfp8(const te_tensor* input, const te_tensor* scale_inv,
                                     te_tensor* output, int columnwise, int swizzled_scales,
                                     te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_MXFP8_H_ */
