/* Scaled dot-product attention, forward and backward (the reference library's
 * fused_attn.h, with its NVTE_* enum numbering).
 *
 * Notation: B batch, H query heads, Hk key/value heads (H % Hk == 0; query
 * head h reads kv head h / (H / Hk): MHA Hk = H, GQA, MQA Hk = 1), D the q/k
 * head size, Dv the v/o head size. Within one sequence of b: sq query rows
 * and skv keys (the per-sequence lengths: cu_seqlens for padding masks and
 * thd, else the tensors' Sq and Skv); i a query index, j a key index.
 *
 * Forward, per (b, h, i), all arithmetic in FP32 (inputs widen exactly):
 *   S[i,j] = scale * q_i . k_j                               no_bias
 *   S[i,j] = scale * (q_i . k_j + bias[h,i,j])               pre_scale_bias
 *   S[i,j] = scale * q_i . k_j + bias[h,i,j]                 post_scale_bias
 *   S[i,j] = scale * q_i . k_j - slope_h * |i + skv - sq - j| alibi
 *     default slopes (alibi_slopes NULL): for H a power of two
 *     slope_h = 2^(-8 (h+1) / H); otherwise, with n the largest power of two
 *     <= H, heads h < n take 2^(-8 (h+1) / n) and the others take
 *     2^(-4 (2 (h-n) + 1) / n) (the odd-numbered slopes of 2n heads).
 *   masked (i,j): S = -inf. Visible iff the mask type allows it and the window does:
 *     no_mask: all; causal: j <= i; causal_bottom_right: j <= i + skv - sq;
 *     padding: i < sq and j < skv with the cu_seqlens lengths;
 *     padding_causal / padding_causal_bottom_right: both conditions;
 *     arbitrary: attn_mask[b or 0, h or 0, i, j] == 0 (nonzero = MASKED OUT,
 *     the reference's True = masked).
 *     window (window_left, window_right), -1 = unbounded on that side:
 *     j >= i + off - window_left and j <= i + off + window_right, with
 *     off = 0 for causal / padding_causal and off = skv - sq otherwise.
 *   Softmax over j (m = the row maximum, the sink term in the denominator):
 *     vanilla:    P = exp(S - m) / sum_j exp(S - m)
 *     off_by_one: P = exp(S) / (1 + sum_j exp(S))
 *     learnable:  P = exp(S) / (exp(alpha_h) + sum_j exp(S)), alpha = softmax_offset
 *   lse_i = log(sink + sum_j exp(S[i,j])) (natural log; sink = 0, 1 or exp(alpha_h)).
 *   Dropout p: P'[i,j] = P[i,j] * keep[i,j] / (1 - p). The random word of element
 *     (b, h, i, j) has index n = ((b * H + h) * Sq + i) * Skv + j (Sq, Skv: the
 *     tensors' sequence sizes, max_seqlen_q/kv for thd) in the Philox4x32-10
 *     stream of rng_state = (seed, offset): word n is word n % 4 of Philox with
 *     counter (lo(n/4), hi(n/4), lo(offset), hi(offset)) and key (lo(seed),
 *     hi(seed)); keep iff word >= floor(p * 2^32). The CPU backend and the
 *     core's CUDA fallback draw the same bits; cuDNN uses its own generator.
 *   O_i = sum_j P'[i,j] v_j. A row with no visible key (and every query row
 *     past its sequence) gives O_i = 0 and lse_i = -inf, whatever the softmax
 *     variant, and zero gradients.
 *
 * Backward (FlashAttention's): P recomputed from S and lse, P = exp(S - lse);
 *   dV = P'^T dO;  dP' = dO V^T;  D_i = sum(dO_i * O_i);
 *   dS = P .* (dP' .* keep / (1 - p) - D_i);  dQ = scale * dS K;  dK = scale * dS^T Q
 *   (summed over the query heads that share a kv head), dbias = dS (post_scale)
 *   or scale * dS (pre_scale), summed over the broadcast dimensions of bias;
 *   dsoftmax_offset_h = -sum_{b,i} P_sink[i] * D_i with P_sink = sink / exp(lse)
 *   (learnable only). Rows with no visible key give zero gradients.
 *
 * Layouts (C-contiguous tensors; qkv_format):
 *   bshd: q [B, Sq, H, D], k [B, Skv, Hk, D], v [B, Skv, Hk, Dv], o [B, Sq, H, Dv]
 *   sbhd: q [Sq, B, H, D], k [Skv, B, Hk, D], v [Skv, B, Hk, Dv], o [Sq, B, H, Dv]
 *   thd:  q [Tq, H, D], k [Tkv, Hk, D], v [Tkv, Hk, Dv], o [Tq, H, Dv]: packed
 *     sequences; token i of sequence b is row cu_seqlens_q_padded[b] + i
 *     (cu_seqlens_q when no padded offsets are given). thd always takes its
 *     lengths from cu_seqlens: no_mask / causal / causal_bottom_right mean
 *     padding / padding_causal / padding_causal_bottom_right there.
 *   softmax_lse: FP32 [B, H, Sq] (bshd, sbhd) or [Tq, H] (thd; rows of tokens
 *     outside every sequence are written as masked rows).
 *   bias, dbias: q's type, [Bb, Hb, Sq, Skv] with Bb in {1, B}, Hb in {1, H}
 *     (thd: Sq, Skv = max_seqlen_q, max_seqlen_kv), indexed by in-sequence i, j.
 *   attn_mask: TE_DTYPE_BYTE, [Bm, Hm, Sq, Skv], Bm in {1, B}, Hm in {1, H}.
 * Types: q, k, v, o, d_o, dq, dk, dv one of FP32, BF16, FP16 (all the same);
 * outputs are rounded to nearest even once. FP8 (E4M3/E5M2 with per-tensor
 * scale_inv tensors) is part of the parameters but returns
 * TE_ERROR_UNSUPPORTED ("FP8 attention is not yet supported") for now.
 * cu_seqlens*: INT32 [B + 1], non-decreasing; cu_seqlens_q/kv start at 0, the
 * padded offsets at >= 0 (checked on the host for CPU tensors; on CUDA the
 * values are not read by the validation).
 *
 * Backends: the CPU backend (tiled over key blocks with an online softmax: one
 * [32, 64] tile of S per thread, never a whole S matrix; deterministic); on CUDA
 * cuDNN's fused attention when compiled in and it supports the combination,
 * else the core's own CUDA kernel. NVTE_FUSED_ATTN=0 forces the core's
 * kernel. te_attention_backend says which one a call would use.
 */
#ifndef TE_ATTENTION_H_
#define TE_ATTENTION_H_

#include "te/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum TE_ENUM_BASE {
  TE_QKV_FORMAT_BSHD = 0,
  TE_QKV_FORMAT_SBHD = 1,
  TE_QKV_FORMAT_THD = 2
} te_qkv_format;

typedef enum TE_ENUM_BASE {
  TE_ATTN_MASK_NO_MASK = 0,
  TE_ATTN_MASK_PADDING = 1,
  TE_ATTN_MASK_CAUSAL = 2,
  TE_ATTN_MASK_PADDING_CAUSAL = 3,
  TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT = 4,
  TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT = 5,
  TE_ATTN_MASK_ARBITRARY = 6
} te_attn_mask_type;

typedef enum TE_ENUM_BASE {
  TE_ATTN_BIAS_NO_BIAS = 0,
  TE_ATTN_BIAS_PRE_SCALE_BIAS = 1,
  TE_ATTN_BIAS_POST_SCALE_BIAS = 2,
  TE_ATTN_BIAS_ALIBI = 3
} te_attn_bias_type;

typedef enum TE_ENUM_BASE {
  TE_SOFTMAX_VANILLA = 0,
  TE_SOFTMAX_OFF_BY_ONE = 1,
  TE_SOFTMAX_LEARNABLE = 2
} te_softmax_type;

/* Which backend runs a call (te_attention_backend). */
typedef enum TE_ENUM_BASE {
  TE_ATTENTION_BACKEND_CPU = 0,
  TE_ATTENTION_BACKEND_CUDNN = 1,
  TE_ATTENTION_BACKEND_CUDA_FALLBACK = 2
} te_attention_backend_kind;

/* The scalar configuration shared by forward and backward.
 * \param qkv_format    te_qkv_format.
 * \param mask_type     te_attn_mask_type.
 * \param bias_type     te_attn_bias_type.
 * \param softmax_type  te_softmax_type.
 * \param scale         multiplies q . k (usually 1 / sqrt(D)); finite.
 * \param dropout       probability of dropping an element of P, in [0, 1).
 * \param window_left   keys visible to the left of the diagonal, >= 0, or -1 (unbounded).
 * \param window_right  keys visible to the right, >= 0 or -1; must be 0 or -1 with a
 *                      causal mask type (causal implies 0).
 * \param max_seqlen_q  thd: Sq, >= every query length (> 0). Ignored for bshd/sbhd.
 * \param max_seqlen_kv thd: Skv, >= every key length (> 0). Ignored for bshd/sbhd.
 * \param deterministic nonzero: the backward must give the same bits run to run
 *                      (the CPU backend always does).
 */
typedef struct {
  int qkv_format;
  int mask_type;
  int bias_type;
  int softmax_type;
  float scale;
  float dropout;
  int64_t window_left;
  int64_t window_right;
  int64_t max_seqlen_q;
  int64_t max_seqlen_kv;
  int deterministic;
} te_attention_config;

/* Forward arguments. Optional tensors are NULL when not used.
 * \param config               the scalar configuration.
 * \param q, k, v              see Layouts; same type, same device.
 * \param bias                 pre/post_scale_bias only (required then): q's type,
 *                             [Bb, Hb, Sq, Skv].
 * \param alibi_slopes         alibi only, optional: FP32 [H] or [B, H] (NULL: default slopes).
 * \param cu_seqlens_q         INT32 [B + 1]: query sequence starts; required for thd
 *                             and for padding masks, NULL otherwise.
 * \param cu_seqlens_kv        INT32 [B + 1]: key sequence starts; same rule.
 * \param cu_seqlens_q_padded  thd only, optional: INT32 [B + 1] row offsets of the
 *                             sequences in q and o (default cu_seqlens_q).
 * \param cu_seqlens_kv_padded thd only, optional: the same for k and v.
 * \param attn_mask            arbitrary mask only (required then): BYTE [Bm, Hm, Sq, Skv],
 *                             nonzero = masked out.
 * \param softmax_offset       learnable softmax only (required then): FP32, H values (any
 *                             shape, e.g. the reference's [1, H, 1, 1]).
 * \param rng_state            dropout > 0 only (required then): INT64 [2] = (seed, offset),
 *                             in host memory or on q's device.
 * \param q_scale_inv, k_scale_inv, v_scale_inv  FP8 only (not yet supported).
 * \param o                    q's type (FP8: not yet), [.., H, Dv] per the layout.
 * \param softmax_lse          FP32 log-sum-exp per query row (see Layouts).
 * \param workspace            BYTE, at least te_attention_fwd_workspace_size bytes on
 *                             q's device, 16-byte aligned; may be NULL when that is 0.
 */
typedef struct {
  te_attention_config config;
  const te_tensor* q;
  const te_tensor* k;
  const te_tensor* v;
  const te_tensor* bias;
  const te_tensor* alibi_slopes;
  const te_tensor* cu_seqlens_q;
  const te_tensor* cu_seqlens_kv;
  const te_tensor* cu_seqlens_q_padded;
  const te_tensor* cu_seqlens_kv_padded;
  const te_tensor* attn_mask;
  const te_tensor* softmax_offset;
  const te_tensor* rng_state;
  const te_tensor* q_scale_inv;
  const te_tensor* k_scale_inv;
  const te_tensor* v_scale_inv;
  te_tensor* o;
  te_tensor* softmax_lse;
  te_tensor* workspace;
} te_attention_fwd_params;

/* Backward arguments: the forward's inputs (same rules) plus
 * \param o, d_o            the forward output and its gradient: o's shape and type.
 * \param softmax_lse       as written by te_attention_fwd.
 * \param dq, dk, dv        q's, k's, v's shapes, q's type (overwritten).
 * \param dbias             pre/post_scale_bias only, may be NULL: bias's shape and type.
 * \param dsoftmax_offset   learnable softmax only, may be NULL: FP32, H values (overwritten).
 * \param workspace         as for the forward, te_attention_bwd_workspace_size bytes.
 */
typedef struct {
  te_attention_config config;
  const te_tensor* q;
  const te_tensor* k;
  const te_tensor* v;
  const te_tensor* o;
  const te_tensor* d_o;
  const te_tensor* softmax_lse;
  const te_tensor* bias;
  const te_tensor* alibi_slopes;
  const te_tensor* cu_seqlens_q;
  const te_tensor* cu_seqlens_kv;
  const te_tensor* cu_seqlens_q_padded;
  const te_tensor* cu_seqlens_kv_padded;
  const te_tensor* attn_mask;
  const te_tensor* softmax_offset;
  const te_tensor* rng_state;
  te_tensor* dq;
  te_tensor* dk;
  te_tensor* dv;
  te_tensor* dbias;
  te_tensor* dsoftmax_offset;
  te_tensor* workspace;
} te_attention_bwd_params;

/* Bytes of workspace te_attention_fwd needs (validates the parameters; data
 * pointers are not read). 0 on the CPU backend. */
TE_API te_status te_attention_fwd_workspace_size(const te_attention_fwd_params* params,
                                                 size_t* workspace_bytes);

/* Attention forward: writes o and softmax_lse. */
TE_API te_status te_attention_fwd(const te_attention_fwd_params* params, te_stream stream);

/* Bytes of workspace te_attention_bwd needs. 0 on the CPU backend. */
TE_API te_status te_attention_bwd_workspace_size(const te_attention_bwd_params* params,
                                                 size_t* workspace_bytes);

/* Attention backward: writes dq, dk, dv and, when given, dbias and dsoftmax_offset. */
TE_API te_status te_attention_bwd(const te_attention_bwd_params* params, te_stream stream);

/* The backend te_attention_fwd would run for these parameters
 * (te_attention_backend_kind), after validating them. */
TE_API te_status te_attention_backend(const te_attention_fwd_params* params, int* backend);

#ifdef __cplusplus
}
#endif

#endif /* TE_ATTENTION_H_ */
