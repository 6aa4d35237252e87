// Fused softmax handlers (te/softmax.h), forward and backward, for the four
// variants of the reference's scaled softmax family, picked by an int32
// attribute `kind` (the order of transformer_engine.jax.softmax's _KINDS):
//   0 scaled, 1 scaled_masked (mask: BYTE [b or 1, 1, sq, sk], nonzero hides),
//   2 scaled_upper_triang_masked (x [attn_batches, s, s]),
//   3 scaled_aligned_causal_masked (bottom-right causal, x [b, h, sq, sk]).
// The forward's mask is a zero-element placeholder for every kind but 1.
// The backward is one formula for every kind: dx = scale * y * (dy - sum(dy * y)).
#include "common.h"
#include "te/softmax.h"

namespace te_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

Error softmax_fwd(const Device& d, AnyBuffer x, AnyBuffer mask, Result<AnyBuffer> y, int32_t kind,
                  float scale) {
  te_tensor tx, ty, tm;
  if (Error e = describe_all(d, {{x, "logits", &tx}, {*y, "y", &ty}}); e.failure()) return e;
  switch (kind) {
    case 0: return from_status(te_softmax_scaled_softmax_fwd(&tx, scale, &ty, d.stream));
    case 1:
      if (Error e = describe(mask, d, "mask", &tm); e.failure()) return e;
      return from_status(te_softmax_scaled_masked_softmax_fwd(&tx, &tm, scale, &ty, d.stream));
    case 2:
      return from_status(
          te_softmax_scaled_upper_triang_masked_softmax_fwd(&tx, scale, &ty, d.stream));
    case 3:
      return from_status(
          te_softmax_scaled_aligned_causal_masked_softmax_fwd(&tx, scale, &ty, d.stream));
    default:
      return Error(
          ffi::ErrorCode::kInvalidArgument,
          "te_jax_softmax_fwd: attribute 'kind' must be 0..3, got " + std::to_string(kind));
  }
}

#define TE_JAX_SOFTMAX_FWD_ARGS(b) \
  b.Arg<AnyBuffer>().Arg<AnyBuffer>().Ret<AnyBuffer>().Attr<int32_t>("kind").Attr<float>("scale")

Error softmax_bwd(const Device& d, AnyBuffer dy, AnyBuffer y, Result<AnyBuffer> dx, int32_t kind,
                  float scale) {
  te_tensor tdy, ty, tdx;
  if (Error e = describe_all(d, {{dy, "dy", &tdy}, {y, "y", &ty}, {*dx, "dx", &tdx}}); e.failure())
    return e;
  switch (kind) {
    case 0: return from_status(te_softmax_scaled_softmax_bwd(&tdy, &ty, scale, &tdx, d.stream));
    case 1:
      return from_status(te_softmax_scaled_masked_softmax_bwd(&tdy, &ty, scale, &tdx, d.stream));
    case 2:
      return from_status(
          te_softmax_scaled_upper_triang_masked_softmax_bwd(&tdy, &ty, scale, &tdx, d.stream));
    case 3:
      return from_status(
          te_softmax_scaled_aligned_causal_masked_softmax_bwd(&tdy, &ty, scale, &tdx, d.stream));
    default:
      return Error(
          ffi::ErrorCode::kInvalidArgument,
          "te_jax_softmax_bwd: attribute 'kind' must be 0..3, got " + std::to_string(kind));
  }
}

#define TE_JAX_SOFTMAX_BWD_ARGS(b) \
  b.Arg<AnyBuffer>().Arg<AnyBuffer>().Ret<AnyBuffer>().Attr<int32_t>("kind").Attr<float>("scale")

}  // namespace

// (In te_jax, not the anonymous namespace: the handlers are extern "C" symbols.)
TE_JAX_DEFINE_HANDLERS(te_jax_softmax_fwd, softmax_fwd, TE_JAX_SOFTMAX_FWD_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_softmax_bwd, softmax_bwd, TE_JAX_SOFTMAX_BWD_ARGS);

}  // namespace te_jax
