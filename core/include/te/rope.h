/* Fused rotary position embedding (RoPE), forward and backward: the
 * reference library's fused_rope.h and the semantics of its
 * apply_rotary_pos_emb(t, freqs, tensor_format, start_positions, interleaved,
 * fused, cu_seqlens, cp_size, cp_rank).
 *
 * t holds one head vector of d elements per (token, head):
 *   tensor_format 0 (bshd): t [b, s, h, d]      tensor_format 1 (sbhd): t [s, b, h, d]
 *   tensor_format 2 (thd):  t [t, h, d], sequences packed one after the other,
 *                           cu_seqlens INT32 [b + 1] (required) gives their bounds.
 * (The numbers are te_qkv_format's of te/attention.h.)
 * freqs is FP32 [S, 1, 1, d2] (any rank >= 2 whose middle dimensions are 1): row p
 * holds the angles of position p. d2 is the rotary dimension: even, 2 <= d2 <= d;
 * elements d2..d-1 of each head pass through unchanged (partial rotary).
 *
 * Position p of a token (the freqs row it reads):
 *   bshd/sbhd: p = i + start_positions[b] (i its index along s; start_positions
 *              INT32 [b], optional, 0 when NULL).
 *   thd:       sequence k covers tokens cu_seqlens[k] / cp_size <= j < cu_seqlens[k+1] / cp_size
 *              and p = j - cu_seqlens[k] / cp_size + start_positions[k]: positions restart
 *              per sequence. Tokens of no sequence (past cu_seqlens[b] / cp_size) are copied
 *              through unchanged.
 *   Context parallelism (cp_size > 1, 0 <= cp_rank < cp_size): the local sequence of L
 *   tokens (L = s, or each thd sequence's local length; L must be even) holds the
 *   load-balanced chunks cp_rank and 2 cp_size - 1 - cp_rank of the global sequence
 *   of cp_size * L tokens, so p = i + cp_rank L/2 for i < L/2 and
 *   p = cp_size L - (cp_rank + 1) L/2 + (i - L/2) otherwise. thd's cu_seqlens are then
 *   the global ones (every global length a multiple of 2 cp_size). start_positions must
 *   be NULL with cp_size > 1 (as in the reference).
 *   Every p must be < S. The CPU backend checks it (and the thd/cp rules above) and fails
 *   with TE_ERROR_INVALID_ARGUMENT; the CUDA backend cannot read device-resident
 *   cu_seqlens / start_positions without synchronizing, so it checks what the shapes
 *   tell and writes NaN into the rotated elements of a token whose p is out of range.
 *
 * Forward, per head vector x (d elements), with c_i = cos(freqs[p, i]) and
 * s_i = sin(freqs[p, i]) in FP32, for i < d2:
 *   out_i = x_i c_i + r_i s_i
 *   r_i = -x_{i+d2/2} (i < d2/2), x_{i-d2/2} (otherwise)        not interleaved (rotate_half)
 *   r_i = -x_{i+1} (i even),  x_{i-1} (i odd)                   interleaved (pairs 2k, 2k+1)
 * Backward: the transpose of that linear map, for i < d2:
 *   dx_i = g_i c_i + g_{i+d2/2} s_{i+d2/2} (i < d2/2),  g_i c_i - g_{i-d2/2} s_{i-d2/2} (otherwise)
 *   (interleaved: partners i+1 / i-1), and dx_i = g_i for i >= d2. With the frequencies
 *   RotaryPositionEmbedding makes (equal angles at i and its partner) this is the rotation
 *   by -theta.
 * Arithmetic is FP32 (each product and the sum rounded once, no FMA), the result
 * rounded once to t's type. CPU and CUDA evaluate sin/cos with their own FP32 functions
 * (<= 1 and <= 2 ulp from exact), so they agree within rounding (docs/numerics.md).
 */
#ifndef TE_ROPE_H_
#define TE_ROPE_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RoPE forward.
 * \param[in]  t               FP32, BF16 or FP16; [b, s, h, d], [s, b, h, d] or [t, h, d].
 * \param[in]  freqs           FP32 [S, 1, 1, d2] (middle dimensions 1), t's device.
 * \param[in]  cu_seqlens      INT32 [b + 1], thd only (required there, NULL otherwise).
 * \param[in]  start_positions INT32 [b], may be NULL; cp_size must be 1 then.
 * \param[in]  tensor_format   0 bshd, 1 sbhd, 2 thd.
 * \param[in]  interleaved     nonzero: rotate the pairs (2k, 2k+1), else the two halves.
 * \param[in]  cp_size, cp_rank context-parallel size (>= 1) and rank (0 <= rank < size).
 * \param[out] out             t's shape and type; must not overlap t.
 */
TE_API te_status te_rope_fwd(const te_tensor* t, const te_tensor* freqs,
                             const te_tensor* cu_seqlens, const te_tensor* start_positions,
                             int tensor_format, int interleaved, int cp_size, int cp_rank,
                             te_tensor* out, te_stream stream);

/* RoPE backward: the gradient of te_rope_fwd with respect to t.
 * \param[in]  d_out  the output gradient: t's shape and type.
 * \param[out] d_t    d_out's shape and type; must not overlap d_out.
 * The other arguments as te_rope_fwd's.
 */
TE_API te_status te_rope_bwd(const te_tensor* d_out, const te_tensor* freqs,
                             const te_tensor* cu_seqlens, const te_tensor* start_positions,
                             int tensor_format, int interleaved, int cp_size, int cp_rank,
                             te_tensor* d_t, te_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_ROPE_H_ */
