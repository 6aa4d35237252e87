// The attention family's backends (formulas in te/attention.h). api.cpp
// validates every argument first and normalizes the configuration (below), so
// the backends receive consistent pointers of the stated types; optional
// inputs are null when not given.
//
// This file is the contract between three branches (attn-core: CPU backend
// and api.cpp; attn-cuda: cuDNN; rope-softmax: the core's CUDA fallback).
// Change existing fields only by agreement; new fields go at the end.
//
// Normalization done by api.cpp (backends can rely on it):
//   - thd: mask_type is always a padding type (no_mask -> padding, causal ->
//     padding_causal, causal_bottom_right -> padding_causal_bottom_right);
//     dims.sq / dims.skv are max_seqlen_q / max_seqlen_kv.
//   - causal mask types: window_right is 0 (a causal mask IS the window
//     right = 0 about its diagonal), so visibility is: padding lengths, then
//     the window about the diagonal of diagonal_offset(), then attn_mask.
//   - bias_type alibi: bias is null (slopes, or null for the default slopes).
//   - dropout == 0: seed/offset unused; dropout > 0: seed/offset (host
//     rng_state) or rng_state_device (device rng_state) is set.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/numerics.h"  // TE_HD
#include "te/attention.h"
#include "te/types.h"

namespace te::attention {

// Sizes. bshd/sbhd: sq, skv are the tensors' sequence dimensions, tq = tkv = 0.
// thd: sq, skv = max_seqlen_q/kv, tq, tkv = the packed token counts (rows of q, k).
struct Dims {
  int64_t b, sq, skv, h, hk, d, dv, tq, tkv;
};

// Everything forward and backward read.
struct Inputs {
  te_qkv_format qkv_format;
  te_attn_mask_type mask_type;
  te_attn_bias_type bias_type;
  te_softmax_type softmax_type;
  float scale;
  float dropout;         // in [0, 1)
  int64_t window_left;   // -1 = unbounded
  int64_t window_right;  // -1 = unbounded; 0 for causal mask types
  bool deterministic;
  Dims dims;
  te_dtype dtype;  // of q, k, v, o (and bias, d_o, dq, dk, dv, dbias): FP32, BF16 or FP16
  const void* q;
  const void* k;
  const void* v;
  const void* bias;        // [bias_b, bias_h, sq, skv] in dtype, or null
  int64_t bias_b, bias_h;  // 1 or b, 1 or h
  const float* alibi_slopes;  // alibi: [h] or [b, h]; null = default slopes
  bool alibi_per_batch;       // slopes are [b, h]
  const int32_t* cu_q;         // [b + 1] or null (no padding, bshd/sbhd)
  const int32_t* cu_kv;        // [b + 1] or null
  const int32_t* cu_q_padded;  // thd: [b + 1] row offsets in q/o (== cu_q when not given)
  const int32_t* cu_kv_padded; // thd: [b + 1] row offsets in k/v (== cu_kv when not given)
  const uint8_t* mask;         // arbitrary: [mask_b, mask_h, sq, skv], nonzero = masked out
  int64_t mask_b, mask_h;
  const float* softmax_offset;  // learnable: [h]
  uint64_t seed, offset;        // dropout, when rng_state is in host memory
  const int64_t* rng_state_device;  // dropout, when rng_state is in device memory, else null
};

struct FwdArgs : Inputs {
  void* o;     // dtype
  float* lse;  // [b, h, sq] (bshd/sbhd) or [tq, h] (thd)
  void* workspace;
  size_t workspace_bytes;
};

struct BwdArgs : Inputs {
  const void* o;
  const void* d_o;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  void* dbias;             // bias's shape, dtype; may be null
  float* dsoftmax_offset;  // learnable: [h]; may be null
  void* workspace;
  size_t workspace_bytes;
};

namespace cpu {
void forward(const FwdArgs& args);
void backward(const BwdArgs& args);
}  // namespace cpu

// Both CUDA backends take the same Inputs for forward and backward, so the
// choice between them (api.cpp) is the same for the two passes of one call.
namespace cudnn {  // defined only in builds with TE_WITH_CUDNN
bool supports(const Inputs& args, std::string* why);
size_t fwd_workspace(const FwdArgs& args);
size_t bwd_workspace(const BwdArgs& args);
void forward(const FwdArgs& args, te_stream stream);
void backward(const BwdArgs& args, te_stream stream);
}  // namespace cudnn

namespace cuda_fallback {  // defined only in builds with TE_ATTENTION_FALLBACK
size_t fwd_workspace(const FwdArgs& args);
size_t bwd_workspace(const BwdArgs& args);
void forward(const FwdArgs& args, te_stream stream);
void backward(const BwdArgs& args, te_stream stream);
}  // namespace cuda_fallback

// ---- Shared rules (host and device), so every backend applies the same ones.

TE_HD bool is_padding_mask(te_attn_mask_type m) {
  return m == TE_ATTN_MASK_PADDING || m == TE_ATTN_MASK_PADDING_CAUSAL ||
         m == TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}

TE_HD bool is_causal_mask(te_attn_mask_type m) {
  return m == TE_ATTN_MASK_CAUSAL || m == TE_ATTN_MASK_PADDING_CAUSAL ||
         m == TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT || m == TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}

// The window's diagonal: key j = i + offset is query i's own position. 0
// (top-left) for causal / padding_causal, len_kv - len_q otherwise (the
// per-sequence lengths).
TE_HD int64_t diagonal_offset(te_attn_mask_type m, int64_t len_q, int64_t len_kv) {
  return (m == TE_ATTN_MASK_CAUSAL || m == TE_ATTN_MASK_PADDING_CAUSAL) ? 0 : len_kv - len_q;
}

// Key j of query row i (both inside their sequence) passes the window.
TE_HD bool in_window(int64_t i, int64_t j, int64_t diag_offset, int64_t window_left,
                     int64_t window_right) {
  const int64_t d = i + diag_offset;
  return (window_left < 0 || j >= d - window_left) && (window_right < 0 || j <= d + window_right);
}

// Default ALiBi slope of head h of n_heads (the reference's rule).
TE_HD float alibi_default_slope(int64_t h, int64_t n_heads) {
  int64_t n = 1;
  while (n * 2 <= n_heads) n *= 2;
  const double e = h < n ? -8.0 * static_cast<double>(h + 1) / static_cast<double>(n)
                         : -4.0 * static_cast<double>(2 * (h - n) + 1) / static_cast<double>(n);
  return static_cast<float>(exp2(e));
}

// The ALiBi term added to S (i, j in-sequence positions).
TE_HD float alibi_bias(float slope, int64_t i, int64_t j, int64_t len_q, int64_t len_kv) {
  const int64_t dist = i + len_kv - len_q - j;
  return -slope * static_cast<float>(dist < 0 ? -dist : dist);
}

// Dropout: element (b, h, i, j) is kept iff its Philox word (nvfp4/philox.h,
// RandomStream{seed, offset}.word(dropout_index(...))) is >= this threshold.
TE_HD uint32_t dropout_threshold(float p) {
  return p <= 0.0f ? 0u : static_cast<uint32_t>(floor(static_cast<double>(p) * 4294967296.0));
}

TE_HD uint64_t dropout_index(const Dims& dims, int64_t b, int64_t h, int64_t i, int64_t j) {
  return static_cast<uint64_t>(((b * dims.h + h) * dims.sq + i) * dims.skv + j);
}

}  // namespace te::attention
