/* NVFP4 quantization: E2M1 data, one E4M3 scale per 16-element block and an
 * FP32 global scale from the tensor's amax (reference library: NVFP4BlockScaling).
 *
 * A tensor of any rank is viewed as a matrix [M, K]: K is its last dimension,
 * M the product of the others. Two outputs can be produced, each quantized
 * separately from the high-precision input:
 *   rowwise     data [M, K], blocks of 16 consecutive elements of a row (1x16)
 *   columnwise  data [K, M] (the transpose, which NVFP4 GEMMs need), blocks of
 *               16 consecutive elements of its rows, i.e. 16 rows of the input
 * With block_2d (weights), the block is a 16x16 tile of [M, K] and both outputs
 * use the tile's one scale, so columnwise is exactly the transpose of rowwise.
 *
 * Data: FP4 E2M1 (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; code s.ee.m), two per
 * byte, element 2i in the low nibble and 2i+1 in the high nibble (the layout
 * of PyTorch's float4_e2m1fn_x2 and of the reference library).
 * Scales: E4M3 bytes, "compact" row-major buffers, padded for cuBLAS:
 *   rowwise    [roundup(M, 128), roundup(K/16, 4)]  scale of data[m][16c..16c+15] at [m][c]
 *   columnwise [roundup(K, 128), roundup(M/16, 4)]  scale of data[k][16c..16c+15] at [k][c]
 * 2-D tiles repeat their scale on each of their 16 rows. Padding bytes are
 * written with 0. (The cuBLAS 128x4 "swizzled" order is a separate step.)
 *
 * Arithmetic, all FP32 with IEEE round-to-nearest-even, in this order
 * (the reference's kernels, cast/nvfp4/core_nvfp4.cuh):
 *   S_enc   = min(2688 / amax, FLT_MAX)     2688 = 448 * 6; min ignores NaN (fminf)
 *             S_enc = 1 when amax == 0 or S_enc == 0 (amax = +inf)
 *   S_dec   = 1 / S_enc
 *   s_b     = e4m3(min(block_amax * (S_enc * (1/6)), FLT_MAX))   the stored scale;
 *             1/6 is the FP32 constant; e4m3() rounds to nearest even, saturates at 448
 *   enc_b   = min(1 / (float(s_b) * S_dec), FLT_MAX)             (s_b = 0 gives FLT_MAX)
 *   q       = e2m1(x * enc_b)                                     per element
 *   dequant = float(q) * (float(s_b) * S_dec)
 * block_amax = max |x| over the block, NaN skipped (0 when all NaN). amax is
 * the global amax of the direction (see te_nvfp4_compute_amax); it must be >= 0.
 * e2m1(v), round to nearest even: |v| <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1,
 * < 1.75 -> 1.5, <= 2.5 -> 2, < 3.5 -> 3, <= 5 -> 4, else 6 (inf too); the sign
 * is kept (-0 is 0x8); NaN gives +6 (0x7), as the CUDA conversion instruction.
 *
 * Stochastic rounding: with a = |v| < 6 between the neighbouring E2M1 values
 * lo <= a < hi, frac = (a - lo) / (hi - lo) (exact in FP32) and r the element's
 * 32-bit random word, |q| = hi when r < frac * 2^32 (exact comparison), else
 * lo; so P(hi) = frac up to 2^-32. NaN -> +6, |v| >= 6 -> 6, sign kept.
 * Random words: Philox4x32-10 with key (seed_lo, seed_hi) and counter
 * (n_lo, n_hi, offset_lo, offset_hi) gives words 4n..4n+3 of the stream of
 * (seed, offset) (seed, offset: the two int64 of rng_state, read as uint64).
 * Word j of the stream goes to: rowwise element (m, k): j = m*K + k;
 * columnwise element (k, m) of [K, M]: j = M*K + k*M + m; with block_2d both
 * outputs use j = m*K + k of the input element (so they stay transposes).
 *
 * Random Hadamard transform (RHT, columnwise only; the GEMM reduction dim of
 * the columnwise operand is M): each 16-element block of a columnwise row,
 * v_i = x[16c + i][k], becomes v' = v H with H = (1/4) diag(S) H16, H16 the
 * Sylvester Hadamard matrix (H16[i][j] = (-1)^popcount(i & j)), S_i = -1 where
 * bit i of rht_sign_mask is set. Computed in FP32 as: flip signs; butterfly
 * stages h = 1, 2, 4, 8: (v_j, v_{j+h}) -> (v_j + v_{j+h}, v_j - v_{j+h}) for j
 * with bit h clear; multiply by 0.25. The columnwise amax, scales and data
 * are those of v'. Since H is orthogonal, (A H)(H^T B) = A B.
 */
#ifndef TE_NVFP4_H_
#define TE_NVFP4_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options of NVFP4 quantization. A NULL pointer means all zero: 1x16 blocks,
 * round to nearest even, no RHT. */
typedef struct {
  int block_2d;            /* 1: 16x16 tiles (weights); needs M % 16 == 0; no RHT */
  int stochastic_rounding; /* 1: stochastic rounding with rng_state */
  int random_hadamard;     /* 1: RHT on the columnwise output (and its amax) */
  uint32_t rht_sign_mask;  /* 16 bits: bit i set means S_i = -1 */
  /* int64 [2] = (seed, offset) on the input's device, read by the kernel (so
   * CUDA graphs can replay with new values); required with stochastic_rounding. */
  const te_tensor* rng_state;
} te_nvfp4_options;

/* Global amaxes of the two directions (overwritten, FP32 scalars):
 *   amax_rowwise    = max |x| (NaN skipped; 0 when empty or all NaN)
 *   amax_columnwise = max |RHT(x)| with options->random_hadamard, else max |x|
 * Either may be NULL. An all-reduce (MAX) across ranks, when wanted, goes
 * between this call and te_nvfp4_quantize.
 * \param[in] input  FP32, BF16 or FP16, last dim K % 16 == 0; M % 16 == 0
 *                   when amax_columnwise is given with RHT. */
TE_API te_status te_nvfp4_compute_amax(const te_tensor* input, te_tensor* amax_rowwise,
                                       te_tensor* amax_columnwise, const te_nvfp4_options* options,
                                       te_stream stream);

/* Quantize input with the given global amaxes (FP32 scalars, read only).
 * Each direction's four arguments (amax, data, scale) are given together or
 * all NULL; at least one direction must be given.
 * \param[in]  input             FP32, BF16 or FP16, any rank >= 1, K % 16 == 0.
 * \param[in]  amax_rowwise      FP32 scalar: the global amax for rowwise.
 * \param[out] rowwise           FP4 (TE_DTYPE_FLOAT4E2M1), the input's shape.
 * \param[out] rowwise_scale     E4M3 [roundup(M,128), roundup(K/16,4)].
 * \param[in]  amax_columnwise   FP32 scalar: the global amax for columnwise.
 * \param[out] columnwise        FP4 [K, M]; needs M % 16 == 0.
 * \param[out] columnwise_scale  E4M3 [roundup(K,128), roundup(M/16,4)].
 * \param[in]  options           may be NULL (see te_nvfp4_options). */
TE_API te_status te_nvfp4_quantize(const te_tensor* input, const te_tensor* amax_rowwise,
                                   te_tensor* rowwise, te_tensor* rowwise_scale,
                                   const te_tensor* amax_columnwise, te_tensor* columnwise,
                                   te_tensor* columnwise_scale, const te_nvfp4_options* options,
                                   te_stream stream);

/* Dequantize one direction: data [A, B] (FP4, any rank, B % 16 == 0), its
 * scale [roundup(A,128), roundup(B/16,4)] and its global amax give
 *   output = out_type(float(q) * (float(s_b) * S_dec))
 * rounded (nearest even) to output's type (FP32, BF16 or FP16; data's shape).
 * Columnwise data dequantizes to the transposed (and, with RHT, transformed)
 * values. */
TE_API te_status te_nvfp4_dequantize(const te_tensor* data, const te_tensor* scale,
                                     const te_tensor* amax, te_tensor* output, te_stream stream);

/* Columnwise data and scales from 2-D (16x16) quantized rowwise ones, without
 * the high-precision input: columnwise[k][m] = rowwise[m][k] and
 * columnwise_scale[k][t] = rowwise_scale[16 t][k / 16]; padding written with 0.
 * Equal to te_nvfp4_quantize with block_2d and the same amax (RHT off).
 * \param[in]  rowwise           FP4 [M, K] (any rank), M % 16 == 0, K % 16 == 0.
 * \param[in]  rowwise_scale     E4M3 [roundup(M,128), roundup(K/16,4)].
 * \param[out] columnwise        FP4 [K, M].
 * \param[out] columnwise_scale  E4M3 [roundup(K,128), roundup(M/16,4)]. */
TE_API te_status te_nvfp4_transpose_2d(const te_tensor* rowwise, const te_tensor* rowwise_scale,
                                       te_tensor* columnwise, te_tensor* columnwise_scale,
                                       te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_NVFP4_H_ */
