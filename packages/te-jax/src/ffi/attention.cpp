// Scaled dot-product attention handlers (te/attention.h), forward and backward.
//
// Forward: o and softmax_lse from q, k, v and the optional tensors (bias,
// ALiBi slopes, cu_seqlens and their padded offsets, an arbitrary mask, the
// learnable softmax offset, the dropout rng_state, INT32 [4] read as INT64 [2]); backward: dq, dk,
// dv and, when asked, dbias and dsoftmax_offset, from the forward's o and lse. Every optional
// operand or result is a zero-element placeholder when unused (common.h). The configuration arrives
// as attributes named like the fields of te_attention_config. Workspace:
// te_attention_*_workspace_size bytes from XLA's scratch on CUDA (none on the CPU backend).
#include <cstdint>
#include <vector>

#include "common.h"
#include "te/attention.h"

namespace te_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

// The attributes of both passes, as te-core's configuration.
te_attention_config config_of(int64_t qkv_format, int64_t mask_type, int64_t bias_type,
                              int64_t softmax_type, float scale, float dropout, int64_t window_left,
                              int64_t window_right, int64_t max_seqlen_q, int64_t max_seqlen_kv,
                              bool deterministic) {
  te_attention_config c{};
  c.qkv_format = static_cast<int>(qkv_format);
  c.mask_type = static_cast<int>(mask_type);
  c.bias_type = static_cast<int>(bias_type);
  c.softmax_type = static_cast<int>(softmax_type);
  c.scale = scale;
  c.dropout = dropout;
  c.window_left = window_left;
  c.window_right = window_right;
  c.max_seqlen_q = max_seqlen_q;
  c.max_seqlen_kv = max_seqlen_kv;
  c.deterministic = deterministic ? 1 : 0;
  return c;
}

// The optional inputs both passes take, in operand order after the pass's
// own tensors: bias, alibi_slopes, cu_seqlens_q, cu_seqlens_kv,
// cu_seqlens_q_padded, cu_seqlens_kv_padded, attn_mask, softmax_offset, rng_state.
struct Extras {
  te_tensor storage[9]{};
  te_tensor* ptr[9]{};
};

// rng_state arrives as INT32 [4] (JAX without x64 has no 64-bit integers):
// the same 16 bytes are te-core's INT64 [2] (seed, offset), little-endian.
Error as_rng_state(te_tensor* t) {
  if (t->dtype != TE_DTYPE_INT32 || t->ndim != 1 || t->shape[0] != 4)
    return Error::InvalidArgument(
        "argument 'rng_state' must be int32 of shape (4,): (seed lo, seed hi, offset lo, offset "
        "hi)");
  t->dtype = TE_DTYPE_INT64;
  t->shape[0] = 2;
  return Error::Success();
}

Error describe_extras(const Device& d, const AnyBuffer& bias, const AnyBuffer& slopes,
                      const AnyBuffer& cu_q, const AnyBuffer& cu_kv, const AnyBuffer& cu_q_padded,
                      const AnyBuffer& cu_kv_padded, const AnyBuffer& mask, const AnyBuffer& offset,
                      const AnyBuffer& rng, Extras* x) {
  Error e = describe_all(d, {{bias, "bias", &x->storage[0], &x->ptr[0]},
                             {slopes, "alibi_slopes", &x->storage[1], &x->ptr[1]},
                             {cu_q, "cu_seqlens_q", &x->storage[2], &x->ptr[2]},
                             {cu_kv, "cu_seqlens_kv", &x->storage[3], &x->ptr[3]},
                             {cu_q_padded, "cu_seqlens_q_padded", &x->storage[4], &x->ptr[4]},
                             {cu_kv_padded, "cu_seqlens_kv_padded", &x->storage[5], &x->ptr[5]},
                             {mask, "attn_mask", &x->storage[6], &x->ptr[6]},
                             {offset, "softmax_offset", &x->storage[7], &x->ptr[7]},
                             {rng, "rng_state", &x->storage[8], &x->ptr[8]}});
  if (e.failure() || x->ptr[8] == nullptr) return e;
  return as_rng_state(x->ptr[8]);
}

// Points the shared optional fields of either params struct at `x`.
template <class Params>
void fill_extras(const Extras& x, Params* p) {
  p->bias = x.ptr[0];
  p->alibi_slopes = x.ptr[1];
  p->cu_seqlens_q = x.ptr[2];
  p->cu_seqlens_kv = x.ptr[3];
  p->cu_seqlens_q_padded = x.ptr[4];
  p->cu_seqlens_kv_padded = x.ptr[5];
  p->attn_mask = x.ptr[6];
  p->softmax_offset = x.ptr[7];
  p->rng_state = x.ptr[8];
}

// Sizes the workspace with te-core's query and runs the pass on `d`.
template <class Params>
Error run(const Device& d, Params* p, te_status (*size_query)(const Params*, size_t*),
          te_status (*pass)(const Params*, te_stream), const char* what) {
  size_t bytes = 0;
  if (te_status s = size_query(p, &bytes); s != TE_SUCCESS) return from_status(s);
  std::vector<unsigned char> host;
  te_tensor ws{};
  if (Error e = allocate_workspace(d, bytes, what, &host, &ws, &p->workspace); e.failure())
    return e;
  return from_status(pass(p, d.stream));
}

Error attention_fwd(const Device& d, AnyBuffer q, AnyBuffer k, AnyBuffer v, AnyBuffer bias,
                    AnyBuffer slopes, AnyBuffer cu_q, AnyBuffer cu_kv, AnyBuffer cu_q_padded,
                    AnyBuffer cu_kv_padded, AnyBuffer mask, AnyBuffer offset, AnyBuffer rng,
                    Result<AnyBuffer> o, Result<AnyBuffer> lse, int64_t qkv_format,
                    int64_t mask_type, int64_t bias_type, int64_t softmax_type, float scale,
                    float dropout, int64_t window_left, int64_t window_right, int64_t max_seqlen_q,
                    int64_t max_seqlen_kv, bool deterministic) {
  te_tensor tq, tk, tv, to, tl;
  Extras x;
  if (Error e = describe_all(d, {{q, "q", &tq},
                                 {k, "k", &tk},
                                 {v, "v", &tv},
                                 {*o, "o", &to},
                                 {*lse, "softmax_lse", &tl}});
      e.failure())
    return e;
  if (Error e = describe_extras(d, bias, slopes, cu_q, cu_kv, cu_q_padded, cu_kv_padded, mask,
                                offset, rng, &x);
      e.failure())
    return e;
  te_attention_fwd_params p{};
  p.config = config_of(qkv_format, mask_type, bias_type, softmax_type, scale, dropout, window_left,
                       window_right, max_seqlen_q, max_seqlen_kv, deterministic);
  p.q = &tq;
  p.k = &tk;
  p.v = &tv;
  fill_extras(x, &p);
  p.o = &to;
  p.softmax_lse = &tl;
  return run(d, &p, te_attention_fwd_workspace_size, te_attention_fwd, "te_attention_fwd");
}

// The operands after a pass's own tensors (nine optional ones) and the
// configuration attributes, shared by both passes' bindings.
#define TE_JAX_ATTENTION_EXTRAS(b) \
  b.Arg<AnyBuffer>()               \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()
#define TE_JAX_ATTENTION_CONFIG(b)    \
  b.Attr<int64_t>("qkv_format")       \
      .Attr<int64_t>("mask_type")     \
      .Attr<int64_t>("bias_type")     \
      .Attr<int64_t>("softmax_type")  \
      .Attr<float>("scale")           \
      .Attr<float>("dropout")         \
      .Attr<int64_t>("window_left")   \
      .Attr<int64_t>("window_right")  \
      .Attr<int64_t>("max_seqlen_q")  \
      .Attr<int64_t>("max_seqlen_kv") \
      .Attr<bool>("deterministic")

#define TE_JAX_ATTENTION_FWD_ARGS(b)                                                \
  TE_JAX_ATTENTION_CONFIG(                                                          \
      TE_JAX_ATTENTION_EXTRAS(b.Arg<AnyBuffer>().Arg<AnyBuffer>().Arg<AnyBuffer>()) \
          .Ret<AnyBuffer>()                                                         \
          .Ret<AnyBuffer>())

Error attention_bwd(const Device& d, AnyBuffer q, AnyBuffer k, AnyBuffer v, AnyBuffer o,
                    AnyBuffer d_o, AnyBuffer lse, AnyBuffer bias, AnyBuffer slopes, AnyBuffer cu_q,
                    AnyBuffer cu_kv, AnyBuffer cu_q_padded, AnyBuffer cu_kv_padded, AnyBuffer mask,
                    AnyBuffer offset, AnyBuffer rng, Result<AnyBuffer> dq, Result<AnyBuffer> dk,
                    Result<AnyBuffer> dv, Result<AnyBuffer> dbias, Result<AnyBuffer> doffset,
                    int64_t qkv_format, int64_t mask_type, int64_t bias_type, int64_t softmax_type,
                    float scale, float dropout, int64_t window_left, int64_t window_right,
                    int64_t max_seqlen_q, int64_t max_seqlen_kv, bool deterministic) {
  te_tensor tq, tk, tv, to, tdo, tl, tdq, tdk, tdv, tdb, tdoff;
  te_tensor *pdb = nullptr, *pdoff = nullptr;
  Extras x;
  if (Error e = describe_all(d, {{q, "q", &tq},
                                 {k, "k", &tk},
                                 {v, "v", &tv},
                                 {o, "o", &to},
                                 {d_o, "d_o", &tdo},
                                 {lse, "softmax_lse", &tl},
                                 {*dq, "dq", &tdq},
                                 {*dk, "dk", &tdk},
                                 {*dv, "dv", &tdv},
                                 {*dbias, "dbias", &tdb, &pdb},
                                 {*doffset, "dsoftmax_offset", &tdoff, &pdoff}});
      e.failure())
    return e;
  if (Error e = describe_extras(d, bias, slopes, cu_q, cu_kv, cu_q_padded, cu_kv_padded, mask,
                                offset, rng, &x);
      e.failure())
    return e;
  te_attention_bwd_params p{};
  p.config = config_of(qkv_format, mask_type, bias_type, softmax_type, scale, dropout, window_left,
                       window_right, max_seqlen_q, max_seqlen_kv, deterministic);
  p.q = &tq;
  p.k = &tk;
  p.v = &tv;
  p.o = &to;
  p.d_o = &tdo;
  p.softmax_lse = &tl;
  fill_extras(x, &p);
  p.dq = &tdq;
  p.dk = &tdk;
  p.dv = &tdv;
  p.dbias = pdb;
  p.dsoftmax_offset = pdoff;
  return run(d, &p, te_attention_bwd_workspace_size, te_attention_bwd, "te_attention_bwd");
}

#define TE_JAX_ATTENTION_BWD_ARGS(b)                                     \
  TE_JAX_ATTENTION_CONFIG(TE_JAX_ATTENTION_EXTRAS(b.Arg<AnyBuffer>()     \
                                                      .Arg<AnyBuffer>()  \
                                                      .Arg<AnyBuffer>()  \
                                                      .Arg<AnyBuffer>()  \
                                                      .Arg<AnyBuffer>()  \
                                                      .Arg<AnyBuffer>()) \
                              .Ret<AnyBuffer>()                          \
                              .Ret<AnyBuffer>()                          \
                              .Ret<AnyBuffer>()                          \
                              .Ret<AnyBuffer>()                          \
                              .Ret<AnyBuffer>())

}  // namespace

// (In te_jax, not the anonymous namespace: the handlers are extern "C" symbols.)
TE_JAX_DEFINE_HANDLERS(te_jax_attention_fwd, attention_fwd, TE_JAX_ATTENTION_FWD_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_attention_bwd, attention_bwd, TE_JAX_ATTENTION_BWD_ARGS);

}  // namespace te_jax
