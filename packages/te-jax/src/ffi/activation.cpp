// Activation handlers (te/activation.h), forward and backward, for every
// te_activation kind (an int32 attribute; gated kinds halve the last dim).
//
// The output (forward: f(x); backward: grad_input) is high precision or FP8
// with the given scale, rowwise and/or as the [N, M] columnwise copy;
// placeholders stand for the copies not asked for, for scale/scale_inv with
// a high-precision output and for an amax not asked for. The amax result
// aliases its input (max-accumulated). The backward's optional dbias needs a
// workspace on te-core's CUDA backend, taken from XLA's scratch.
#include <vector>

#include "common.h"
#include "te/activation.h"

namespace te_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

// The descriptors of an activation's output: the (optional) rowwise and
// columnwise copies, then its scaling buffers.
struct ActOutput {
  te_tensor row{}, col{};
  te_tensor *row_ptr = nullptr, *col_ptr = nullptr;
  Scaling s;
};

Error describe_output(const Device& d, const char* row_name, const AnyBuffer& scale,
                      const AnyBuffer& row, const AnyBuffer& col, const AnyBuffer& scale_inv,
                      const AnyBuffer& amax, ActOutput* o) {
  if (Error e = describe_all(
          d, {{row, row_name, &o->row, &o->row_ptr}, {col, "columnwise", &o->col, &o->col_ptr}});
      e.failure())
    return e;
  return describe_scaling(d, scale, scale_inv, amax, &o->s);
}

Error activation_fwd(const Device& d, AnyBuffer x, AnyBuffer scale, AnyBuffer /*amax_in*/,
                     Result<AnyBuffer> out, Result<AnyBuffer> columnwise,
                     Result<AnyBuffer> scale_inv, Result<AnyBuffer> amax, int32_t kind, float limit,
                     float alpha, float glu_linear_offset) {
  te_tensor tx;
  ActOutput o;
  if (Error e = describe(x, d, "x", &tx); e.failure()) return e;
  if (Error e = describe_output(d, "out", scale, *out, *columnwise, *scale_inv, *amax, &o);
      e.failure())
    return e;
  const te_activation_params p{limit, alpha, glu_linear_offset};
  return from_status(te_activation_fwd(static_cast<te_activation>(kind), &p, &tx, o.row_ptr,
                                       o.col_ptr, o.s.scale_ptr, o.s.scale_inv_ptr, o.s.amax_ptr,
                                       d.stream));
}

#define TE_JAX_ACTIVATION_FWD_ARGS(b) \
  b.Arg<AnyBuffer>()                  \
      .Arg<AnyBuffer>()               \
      .Arg<AnyBuffer>()               \
      .Ret<AnyBuffer>()               \
      .Ret<AnyBuffer>()               \
      .Ret<AnyBuffer>()               \
      .Ret<AnyBuffer>()               \
      .Attr<int32_t>("kind")          \
      .Attr<float>("limit")           \
      .Attr<float>("alpha")           \
      .Attr<float>("glu_linear_offset")

Error activation_bwd(const Device& d, AnyBuffer grad, AnyBuffer x, AnyBuffer scale,
                     AnyBuffer /*amax_in*/, Result<AnyBuffer> grad_input,
                     Result<AnyBuffer> columnwise, Result<AnyBuffer> scale_inv,
                     Result<AnyBuffer> amax, Result<AnyBuffer> dbias, int32_t kind, float limit,
                     float alpha, float glu_linear_offset) {
  te_tensor tg, tx, tdb, tws;
  te_tensor *pdb, *pws;
  ActOutput o;
  if (Error e = describe_all(d, {{grad, "grad", &tg}, {x, "x", &tx}}); e.failure()) return e;
  if (Error e =
          describe_output(d, "grad_input", scale, *grad_input, *columnwise, *scale_inv, *amax, &o);
      e.failure())
    return e;
  if (Error e = describe_optional(*dbias, d, "dbias", &tdb, &pdb); e.failure()) return e;
  size_t bytes = 0;
  if (te_status s = te_activation_bwd_workspace_size(&tx, pdb != nullptr ? 1 : 0, &bytes);
      s != TE_SUCCESS)
    return from_status(s);
  std::vector<unsigned char> host;
  if (Error e = allocate_workspace(d, bytes, "te_activation_bwd", &host, &tws, &pws); e.failure())
    return e;
  const te_activation_params p{limit, alpha, glu_linear_offset};
  const te_activation_bwd_params bp{static_cast<te_activation>(kind),
                                    &p,
                                    &tg,
                                    &tx,
                                    o.row_ptr,
                                    o.col_ptr,
                                    o.s.scale_ptr,
                                    o.s.scale_inv_ptr,
                                    o.s.amax_ptr,
                                    pdb,
                                    pws};
  return from_status(te_activation_bwd(&bp, d.stream));
}

#define TE_JAX_ACTIVATION_BWD_ARGS(b) \
  b.Arg<AnyBuffer>()                  \
      .Arg<AnyBuffer>()               \
      .Arg<AnyBuffer>()               \
      .Arg<AnyBuffer>()               \
      .Ret<AnyBuffer>()               \
      .Ret<AnyBuffer>()               \
      .Ret<AnyBuffer>()               \
      .Ret<AnyBuffer>()               \
      .Ret<AnyBuffer>()               \
      .Attr<int32_t>("kind")          \
      .Attr<float>("limit")           \
      .Attr<float>("alpha")           \
      .Attr<float>("glu_linear_offset")

}  // namespace

// (In te_jax, not the anonymous namespace: the handlers are extern "C" symbols.)
TE_JAX_DEFINE_HANDLERS(te_jax_activation_fwd, activation_fwd, TE_JAX_ACTIVATION_FWD_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_activation_bwd, activation_bwd, TE_JAX_ACTIVATION_BWD_ARGS);

}  // namespace te_jax
