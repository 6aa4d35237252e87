// The attention family (te/attention.h). Every function takes the tensors as
// descriptors and the configuration as keyword arguments named like the
// te_attention_config fields; optional tensors are None. The GIL is released
// while the core runs.
#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

namespace {

// The configuration and the inputs forward and backward share.
struct Common {
  te_attention_config config{};
  const te_tensor *bias, *alibi_slopes, *cu_q, *cu_kv, *cu_q_padded, *cu_kv_padded, *attn_mask,
      *softmax_offset, *rng_state;
};

Common common(int qkv_format, int mask_type, int bias_type, int softmax_type, float scale,
              float dropout, int64_t window_left, int64_t window_right, int64_t max_seqlen_q,
              int64_t max_seqlen_kv, bool deterministic, Opt bias, Opt alibi_slopes,
              Opt cu_seqlens_q, Opt cu_seqlens_kv, Opt cu_seqlens_q_padded,
              Opt cu_seqlens_kv_padded, Opt attn_mask, Opt softmax_offset, Opt rng_state) {
  Common c;
  c.config = te_attention_config{qkv_format,   mask_type,    bias_type,    softmax_type,
                                 scale,        dropout,      window_left,  window_right,
                                 max_seqlen_q, max_seqlen_kv, deterministic ? 1 : 0};
  c.bias = opt(bias);
  c.alibi_slopes = opt(alibi_slopes);
  c.cu_q = opt(cu_seqlens_q);
  c.cu_kv = opt(cu_seqlens_kv);
  c.cu_q_padded = opt(cu_seqlens_q_padded);
  c.cu_kv_padded = opt(cu_seqlens_kv_padded);
  c.attn_mask = opt(attn_mask);
  c.softmax_offset = opt(softmax_offset);
  c.rng_state = opt(rng_state);
  return c;
}

te_attention_fwd_params fwd_params(const Common& c, TensorDesc& q, TensorDesc& k, TensorDesc& v,
                                   Opt o, Opt softmax_lse, Opt workspace) {
  te_attention_fwd_params p{};
  p.config = c.config;
  p.q = &q.t;
  p.k = &k.t;
  p.v = &v.t;
  p.bias = c.bias;
  p.alibi_slopes = c.alibi_slopes;
  p.cu_seqlens_q = c.cu_q;
  p.cu_seqlens_kv = c.cu_kv;
  p.cu_seqlens_q_padded = c.cu_q_padded;
  p.cu_seqlens_kv_padded = c.cu_kv_padded;
  p.attn_mask = c.attn_mask;
  p.softmax_offset = c.softmax_offset;
  p.rng_state = c.rng_state;
  p.o = opt(o);
  p.softmax_lse = opt(softmax_lse);
  p.workspace = opt(workspace);
  return p;
}

te_attention_bwd_params bwd_params(const Common& c, TensorDesc& q, TensorDesc& k, TensorDesc& v,
                                   Opt o, Opt d_o, Opt softmax_lse) {
  te_attention_bwd_params p{};
  p.config = c.config;
  p.q = &q.t;
  p.k = &k.t;
  p.v = &v.t;
  p.o = opt(o);
  p.d_o = opt(d_o);
  p.softmax_lse = opt(softmax_lse);
  p.bias = c.bias;
  p.alibi_slopes = c.alibi_slopes;
  p.cu_seqlens_q = c.cu_q;
  p.cu_seqlens_kv = c.cu_kv;
  p.cu_seqlens_q_padded = c.cu_q_padded;
  p.cu_seqlens_kv_padded = c.cu_kv_padded;
  p.attn_mask = c.attn_mask;
  p.softmax_offset = c.softmax_offset;
  p.rng_state = c.rng_state;
  return p;
}

}  // namespace

// The keyword arguments of the configuration and the shared optional inputs,
// in the order of common()'s parameters.
#define TE_ATTN_COMMON_ARGS                                                                 \
  nb::arg("qkv_format"), nb::arg("mask_type"), nb::arg("bias_type") = 0,                    \
      nb::arg("softmax_type") = 0, nb::arg("scale"), nb::arg("dropout") = 0.0f,             \
      nb::arg("window_left") = -1, nb::arg("window_right") = -1,                            \
      nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_kv") = 0,                            \
      nb::arg("deterministic") = false, nb::arg("bias").none() = nb::none(),                \
      nb::arg("alibi_slopes").none() = nb::none(), nb::arg("cu_seqlens_q").none() = nb::none(), \
      nb::arg("cu_seqlens_kv").none() = nb::none(),                                         \
      nb::arg("cu_seqlens_q_padded").none() = nb::none(),                                   \
      nb::arg("cu_seqlens_kv_padded").none() = nb::none(),                                  \
      nb::arg("attn_mask").none() = nb::none(), nb::arg("softmax_offset").none() = nb::none(), \
      nb::arg("rng_state").none() = nb::none()

#define TE_ATTN_COMMON_PARAMS                                                                  \
  int qkv_format, int mask_type, int bias_type, int softmax_type, float scale, float dropout, \
      int64_t window_left, int64_t window_right, int64_t max_seqlen_q, int64_t max_seqlen_kv, \
      bool deterministic, Opt bias, Opt alibi_slopes, Opt cu_seqlens_q, Opt cu_seqlens_kv,    \
      Opt cu_seqlens_q_padded, Opt cu_seqlens_kv_padded, Opt attn_mask, Opt softmax_offset,   \
      Opt rng_state

#define TE_ATTN_COMMON_VALUES                                                                  \
  common(qkv_format, mask_type, bias_type, softmax_type, scale, dropout, window_left,         \
         window_right, max_seqlen_q, max_seqlen_kv, deterministic, bias, alibi_slopes,        \
         cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded, attn_mask,   \
         softmax_offset, rng_state)

void bind_attention(nb::module_& m) {
  m.def(
      "attention_fwd",
      [](TensorDesc& q, TensorDesc& k, TensorDesc& v, TensorDesc& o, TensorDesc& softmax_lse,
         TE_ATTN_COMMON_PARAMS, Opt workspace, uintptr_t stream) {
        const te_attention_fwd_params p =
            fwd_params(TE_ATTN_COMMON_VALUES, q, k, v, &o, &softmax_lse, workspace);
        call([&] { return te_attention_fwd(&p, as_stream(stream)); });
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("softmax_lse"), nb::kw_only(),
      TE_ATTN_COMMON_ARGS, nb::arg("workspace").none() = nb::none(), nb::arg("stream") = 0);

  m.def(
      "attention_fwd_workspace_size",
      [](TensorDesc& q, TensorDesc& k, TensorDesc& v, TE_ATTN_COMMON_PARAMS) {
        const te_attention_fwd_params p =
            fwd_params(TE_ATTN_COMMON_VALUES, q, k, v, std::nullopt, std::nullopt, std::nullopt);
        size_t bytes = 0;
        call([&] { return te_attention_fwd_workspace_size(&p, &bytes); });
        return bytes;
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::kw_only(), TE_ATTN_COMMON_ARGS);

  m.def(
      "attention_backend",
      [](TensorDesc& q, TensorDesc& k, TensorDesc& v, TE_ATTN_COMMON_PARAMS) {
        const te_attention_fwd_params p =
            fwd_params(TE_ATTN_COMMON_VALUES, q, k, v, std::nullopt, std::nullopt, std::nullopt);
        int backend = -1;
        call([&] { return te_attention_backend(&p, &backend); });
        return backend;
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::kw_only(), TE_ATTN_COMMON_ARGS);
  m.def(
      "attention_bwd",
      [](TensorDesc& q, TensorDesc& k, TensorDesc& v, TensorDesc& o, TensorDesc& d_o,
         TensorDesc& softmax_lse, TensorDesc& dq, TensorDesc& dk, TensorDesc& dv,
         TE_ATTN_COMMON_PARAMS, Opt dbias, Opt dsoftmax_offset, Opt workspace, uintptr_t stream) {
        te_attention_bwd_params p = bwd_params(TE_ATTN_COMMON_VALUES, q, k, v, &o, &d_o, &softmax_lse);
        p.dq = &dq.t;
        p.dk = &dk.t;
        p.dv = &dv.t;
        p.dbias = opt(dbias);
        p.dsoftmax_offset = opt(dsoftmax_offset);
        p.workspace = opt(workspace);
        call([&] { return te_attention_bwd(&p, as_stream(stream)); });
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("d_o"),
      nb::arg("softmax_lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::kw_only(),
      TE_ATTN_COMMON_ARGS, nb::arg("dbias").none() = nb::none(),
      nb::arg("dsoftmax_offset").none() = nb::none(), nb::arg("workspace").none() = nb::none(),
      nb::arg("stream") = 0);

  m.def(
      "attention_bwd_workspace_size",
      [](TensorDesc& q, TensorDesc& k, TensorDesc& v, TE_ATTN_COMMON_PARAMS) {
        const te_attention_bwd_params p =
            bwd_params(TE_ATTN_COMMON_VALUES, q, k, v, std::nullopt, std::nullopt, std::nullopt);
        size_t bytes = 0;
        call([&] { return te_attention_bwd_workspace_size(&p, &bytes); });
        return bytes;
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::kw_only(), TE_ATTN_COMMON_ARGS);
}

#undef TE_ATTN_COMMON_ARGS
#undef TE_ATTN_COMMON_PARAMS
#undef TE_ATTN_COMMON_VALUES

}  // namespace te_py
