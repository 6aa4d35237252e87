// Argument validation of the attention family (validate.cpp): every rule of
// te/attention.h checked once, with messages naming the argument and the rule.
#pragma once

#include "attention/backend.h"
#include "te/attention.h"

namespace te::attention {

// The tensors forward and backward share.
struct InputTensors {
  const te_tensor *q, *k, *v, *bias, *alibi_slopes;
  const te_tensor *cu_seqlens_q, *cu_seqlens_kv, *cu_seqlens_q_padded, *cu_seqlens_kv_padded;
  const te_tensor *attn_mask, *softmax_offset, *rng_state;
  const te_tensor *q_scale_inv, *k_scale_inv, *v_scale_inv;  // FP8 only
};

// Validates the configuration and the shared inputs; returns them normalized
// (backend.h says how).
Inputs check_inputs(const te_attention_config& config, const InputTensors& t);

// An output or gradient shaped exactly like `like` (name_like in messages),
// of the attention dtype, on like's device and element aligned.
void check_like(const te_tensor* t, const char* name, const te_tensor& like, const char* like_name,
                te_dtype dtype);

// The shape of o / d_o for the validated inputs: [.., H, Dv] in the layout.
void check_output(const te_tensor* t, const char* name, const Inputs& in, const te_tensor& q);

// softmax_lse: FP32, [B, H, Sq] (bshd/sbhd) or [Tq, H] (thd).
float* check_lse(const te_tensor* t, const char* name, const Inputs& in, const te_tensor& q);

// A workspace of at least `needed` bytes (may be NULL when that is 0).
void* check_workspace(const te_tensor* t, size_t needed, const te_tensor& q);

// An FP32 [H] vector (dsoftmax_offset).
float* check_per_head(const te_tensor* t, const char* name, const Inputs& in, const te_tensor& q);

}  // namespace te::attention
