// LayerNorm and RMSNorm handlers (te/norm.h), forward and backward.
//
// Forward: y = ((x - mu) * rsigma) * g + beta (LayerNorm) or (x * rsigma) * g
// (RMSNorm) over the last dim, g = gamma or 1 + gamma, with mu and rsigma
// returned for the backward. y is high precision or FP8; an FP8 y is
// quantized in the same pass with the given scale (delayed scaling). The
// optional amax is max-accumulated: the result aliases the input (a
// placeholder when not asked), so XLA hands over the old value in it.
// Backward: dx, dgamma (and dbeta) from the saved mu/rsigma; te-core's CUDA
// backend needs a workspace for its column sums, taken from XLA's scratch.
#include <vector>

#include "common.h"
#include "te/norm.h"

namespace te_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

// The descriptors of a forward's y and its optional FP8 scale, scale_inv and amax.
struct NormOutput {
  te_tensor y{};
  Scaling s;
};

Error describe_output(const Device& d, const AnyBuffer& y_scale, const AnyBuffer& y,
                      const AnyBuffer& y_scale_inv, const AnyBuffer& amax, NormOutput* o) {
  if (Error e = describe(y, d, "y", &o->y); e.failure()) return e;
  return describe_scaling(d, y_scale, y_scale_inv, amax, &o->s,
                          {"y_scale", "y_scale_inv", "y_amax"});
}

Error layernorm_fwd(const Device& d, AnyBuffer x, AnyBuffer gamma, AnyBuffer beta,
                    AnyBuffer y_scale, AnyBuffer /*amax_in*/, Result<AnyBuffer> y,
                    Result<AnyBuffer> y_scale_inv, Result<AnyBuffer> amax, Result<AnyBuffer> mu,
                    Result<AnyBuffer> rsigma, float eps, bool zero_centered_gamma) {
  te_tensor tx, tg, tb, tmu, trs;
  NormOutput o;
  if (Error e = describe_all(d, {{x, "x", &tx}, {gamma, "gamma", &tg}, {beta, "beta", &tb}});
      e.failure())
    return e;
  if (Error e = describe_output(d, y_scale, *y, *y_scale_inv, *amax, &o); e.failure()) return e;
  if (Error e = describe_all(d, {{*mu, "mu", &tmu}, {*rsigma, "rsigma", &trs}}); e.failure())
    return e;
  const te_norm_fwd_params p{&tx,
                             &tg,
                             &tb,
                             eps,
                             zero_centered_gamma ? 1 : 0,
                             &o.y,
                             o.s.scale_ptr,
                             o.s.scale_inv_ptr,
                             o.s.amax_ptr,
                             &tmu,
                             &trs};
  return from_status(te_layernorm_fwd(&p, d.stream));
}

#define TE_JAX_LAYERNORM_FWD_ARGS(b) \
  b.Arg<AnyBuffer>()                 \
      .Arg<AnyBuffer>()              \
      .Arg<AnyBuffer>()              \
      .Arg<AnyBuffer>()              \
      .Arg<AnyBuffer>()              \
      .Ret<AnyBuffer>()              \
      .Ret<AnyBuffer>()              \
      .Ret<AnyBuffer>()              \
      .Ret<AnyBuffer>()              \
      .Ret<AnyBuffer>()              \
      .Attr<float>("eps")            \
      .Attr<bool>("zero_centered_gamma")

Error rmsnorm_fwd(const Device& d, AnyBuffer x, AnyBuffer gamma, AnyBuffer y_scale,
                  AnyBuffer /*amax_in*/, Result<AnyBuffer> y, Result<AnyBuffer> y_scale_inv,
                  Result<AnyBuffer> amax, Result<AnyBuffer> rsigma, float eps,
                  bool zero_centered_gamma) {
  te_tensor tx, tg, trs;
  NormOutput o;
  if (Error e = describe_all(d, {{x, "x", &tx}, {gamma, "gamma", &tg}}); e.failure()) return e;
  if (Error e = describe_output(d, y_scale, *y, *y_scale_inv, *amax, &o); e.failure()) return e;
  if (Error e = describe_all(d, {{*rsigma, "rsigma", &trs}}); e.failure()) return e;
  const te_norm_fwd_params p{
      &tx,  &tg,           nullptr,           eps,          zero_centered_gamma ? 1 : 0,
      &o.y, o.s.scale_ptr, o.s.scale_inv_ptr, o.s.amax_ptr, nullptr,
      &trs};
  return from_status(te_rmsnorm_fwd(&p, d.stream));
}

#define TE_JAX_RMSNORM_FWD_ARGS(b) \
  b.Arg<AnyBuffer>()               \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Ret<AnyBuffer>()            \
      .Ret<AnyBuffer>()            \
      .Ret<AnyBuffer>()            \
      .Ret<AnyBuffer>()            \
      .Attr<float>("eps")          \
      .Attr<bool>("zero_centered_gamma")

// The backward's workspace for an input described by `tx`, sized by te-core.
Error norm_workspace(const Device& d, te_status (*size_query)(const te_tensor*, size_t*),
                     const te_tensor& tx, const char* what, std::vector<unsigned char>* host,
                     te_tensor* storage, te_tensor** out) {
  size_t bytes = 0;
  if (te_status s = size_query(&tx, &bytes); s != TE_SUCCESS) return from_status(s);
  return allocate_workspace(d, bytes, what, host, storage, out);
}

Error layernorm_bwd(const Device& d, AnyBuffer dz, AnyBuffer x, AnyBuffer mu, AnyBuffer rsigma,
                    AnyBuffer gamma, Result<AnyBuffer> dx, Result<AnyBuffer> dgamma,
                    Result<AnyBuffer> dbeta, bool zero_centered_gamma) {
  te_tensor tdz, tx, tmu, trs, tg, tdx, tdg, tdb, tws;
  te_tensor* pws;
  if (Error e = describe_all(d, {{dz, "dz", &tdz},
                                 {x, "x", &tx},
                                 {mu, "mu", &tmu},
                                 {rsigma, "rsigma", &trs},
                                 {gamma, "gamma", &tg},
                                 {*dx, "dx", &tdx},
                                 {*dgamma, "dgamma", &tdg},
                                 {*dbeta, "dbeta", &tdb}});
      e.failure())
    return e;
  std::vector<unsigned char> host;
  if (Error e = norm_workspace(d, te_layernorm_bwd_workspace_size, tx, "te_layernorm_bwd", &host,
                               &tws, &pws);
      e.failure())
    return e;
  const te_norm_bwd_params p{&tdz, &tx,  &tmu, &trs, &tg, zero_centered_gamma ? 1 : 0,
                             &tdx, &tdg, &tdb, pws};
  return from_status(te_layernorm_bwd(&p, d.stream));
}

#define TE_JAX_LAYERNORM_BWD_ARGS(b) \
  b.Arg<AnyBuffer>()                 \
      .Arg<AnyBuffer>()              \
      .Arg<AnyBuffer>()              \
      .Arg<AnyBuffer>()              \
      .Arg<AnyBuffer>()              \
      .Ret<AnyBuffer>()              \
      .Ret<AnyBuffer>()              \
      .Ret<AnyBuffer>()              \
      .Attr<bool>("zero_centered_gamma")

Error rmsnorm_bwd(const Device& d, AnyBuffer dz, AnyBuffer x, AnyBuffer rsigma, AnyBuffer gamma,
                  Result<AnyBuffer> dx, Result<AnyBuffer> dgamma, bool zero_centered_gamma) {
  te_tensor tdz, tx, trs, tg, tdx, tdg, tws;
  te_tensor* pws;
  if (Error e = describe_all(d, {{dz, "dz", &tdz},
                                 {x, "x", &tx},
                                 {rsigma, "rsigma", &trs},
                                 {gamma, "gamma", &tg},
                                 {*dx, "dx", &tdx},
                                 {*dgamma, "dgamma", &tdg}});
      e.failure())
    return e;
  std::vector<unsigned char> host;
  if (Error e =
          norm_workspace(d, te_rmsnorm_bwd_workspace_size, tx, "te_rmsnorm_bwd", &host, &tws, &pws);
      e.failure())
    return e;
  const te_norm_bwd_params p{&tdz, &tx,  nullptr, &trs, &tg, zero_centered_gamma ? 1 : 0,
                             &tdx, &tdg, nullptr, pws};
  return from_status(te_rmsnorm_bwd(&p, d.stream));
}

#define TE_JAX_RMSNORM_BWD_ARGS(b) \
  b.Arg<AnyBuffer>()               \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Arg<AnyBuffer>()            \
      .Ret<AnyBuffer>()            \
      .Ret<AnyBuffer>()            \
      .Attr<bool>("zero_centered_gamma")

}  // namespace

// (In te_jax, not the anonymous namespace: the handlers are extern "C" symbols.)
TE_JAX_DEFINE_HANDLERS(te_jax_layernorm_fwd, layernorm_fwd, TE_JAX_LAYERNORM_FWD_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_rmsnorm_fwd, rmsnorm_fwd, TE_JAX_RMSNORM_FWD_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_layernorm_bwd, layernorm_bwd, TE_JAX_LAYERNORM_BWD_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_rmsnorm_bwd, rmsnorm_bwd, TE_JAX_RMSNORM_BWD_ARGS);

}  // namespace te_jax
