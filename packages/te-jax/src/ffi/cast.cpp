// Per-tensor FP8 handlers (te/cast.h, te/recipe.h). JAX arrays are values,
// so what te-core updates in place (amax, history, scale) comes back as a
// result that the Python side aliases to the input (input_output_aliases):
// XLA then hands the handler the input's bytes in the result buffer.
#include "common.h"
#include "te/cast.h"
#include "te/recipe.h"

namespace te_jax {
namespace {

using ffi::AnyBuffer;
using ffi::Error;
using ffi::Result;

// rowwise = q(x * scale) (+ its [K, M] transpose), scale_inv = 1/scale,
// amax_out = max(amax_in, max|x|) (amax_out aliases amax_in).
Error quantize_fp8(const Device& d, AnyBuffer x, AnyBuffer scale, AnyBuffer /*amax_in*/,
                   Result<AnyBuffer> row, Result<AnyBuffer> col, Result<AnyBuffer> scale_inv,
                   Result<AnyBuffer> amax_out) {
  // (rowwise/columnwise: a placeholder means "not asked")
  te_tensor tx, trow, tcol;
  te_tensor *prow, *pcol;
  Scaling s;
  if (Error e = describe_all(
          d, {{x, "x", &tx}, {*row, "rowwise", &trow, &prow}, {*col, "columnwise", &tcol, &pcol}});
      e.failure())
    return e;
  if (Error e = describe_scaling(d, scale, *scale_inv, *amax_out, &s); e.failure()) return e;
  return from_status(
      te_cast_quantize_fp8(&tx, s.scale_ptr, prow, pcol, s.scale_inv_ptr, s.amax_ptr, d.stream));
}

#define TE_JAX_QUANTIZE_FP8_ARGS(b) \
  b.Arg<AnyBuffer>()                \
      .Arg<AnyBuffer>()             \
      .Arg<AnyBuffer>()             \
      .Ret<AnyBuffer>()             \
      .Ret<AnyBuffer>()             \
      .Ret<AnyBuffer>()             \
      .Ret<AnyBuffer>()

// amax, scale (compute_scale_from_amax rules) and quantize in one call.
Error quantize_fp8_current_scaling(const Device& d, AnyBuffer x, Result<AnyBuffer> row,
                                   Result<AnyBuffer> col, Result<AnyBuffer> scale,
                                   Result<AnyBuffer> scale_inv, Result<AnyBuffer> amax,
                                   bool force_pow_2_scales, float amax_epsilon) {
  te_tensor tx, trow, tcol;
  te_tensor *prow, *pcol;
  Scaling s;
  if (Error e = describe_all(
          d, {{x, "x", &tx}, {*row, "rowwise", &trow, &prow}, {*col, "columnwise", &tcol, &pcol}});
      e.failure())
    return e;
  if (Error e = describe_scaling(d, *scale, *scale_inv, *amax, &s); e.failure()) return e;
  return from_status(te_cast_quantize_fp8_current_scaling(
      &tx, prow, pcol, s.scale_ptr, s.scale_inv_ptr, s.amax_ptr, force_pow_2_scales ? 1 : 0,
      amax_epsilon, d.stream));
}

#define TE_JAX_QUANTIZE_FP8_CURRENT_ARGS(b) \
  b.Arg<AnyBuffer>()                        \
      .Ret<AnyBuffer>()                     \
      .Ret<AnyBuffer>()                     \
      .Ret<AnyBuffer>()                     \
      .Ret<AnyBuffer>()                     \
      .Ret<AnyBuffer>()                     \
      .Attr<bool>("force_pow_2_scales")     \
      .Attr<float>("amax_epsilon")

// out = float32(q) * scale_inv, rounded to out's type.
Error dequantize_fp8(const Device& d, AnyBuffer q, AnyBuffer scale_inv, Result<AnyBuffer> out) {
  te_tensor tq, tsi, to;
  if (Error e =
          describe_all(d, {{q, "data", &tq}, {scale_inv, "scale_inv", &tsi}, {*out, "out", &to}});
      e.failure())
    return e;
  return from_status(te_cast_dequantize_fp8(&tq, &tsi, &to, d.stream));
}

#define TE_JAX_DEQUANTIZE_FP8_ARGS(b) b.Arg<AnyBuffer>().Arg<AnyBuffer>().Ret<AnyBuffer>()

// max|x| over the non-NaN elements.
Error compute_amax(const Device& d, AnyBuffer x, Result<AnyBuffer> amax) {
  te_tensor tx, ta;
  if (Error e = describe_all(d, {{x, "x", &tx}, {*amax, "amax", &ta}}); e.failure()) return e;
  return from_status(te_cast_compute_amax(&tx, &ta, d.stream));
}

#define TE_JAX_COMPUTE_AMAX_ARGS(b) b.Arg<AnyBuffer>().Ret<AnyBuffer>()

// One delayed-scaling group: history [L, n] and scale [n] updated (results
// aliased to the inputs), scale_inv [n] written.
Error delayed_scaling_update(const Device& d, AnyBuffer /*history_in*/, AnyBuffer /*scale_in*/,
                             Result<AnyBuffer> history, Result<AnyBuffer> scale,
                             Result<AnyBuffer> scale_inv, int32_t algo, int32_t fp8_dtype,
                             float margin) {
  te_tensor th, ts, tsi;
  if (Error e = describe_all(d, {{*history, "amax_history", &th},
                                 {*scale, "scale", &ts},
                                 {*scale_inv, "scale_inv", &tsi}});
      e.failure())
    return e;
  te_tensor* histories[] = {&th};
  te_tensor* scales[] = {&ts};
  te_tensor* scale_invs[] = {&tsi};
  return from_status(te_recipe_delayed_scaling_update(
      nullptr, histories, scales, scale_invs, 1, static_cast<te_amax_compute_algo>(algo),
      static_cast<te_dtype>(fp8_dtype), margin, d.stream));
}

#define TE_JAX_DELAYED_SCALING_UPDATE_ARGS(b) \
  b.Arg<AnyBuffer>()                          \
      .Arg<AnyBuffer>()                       \
      .Ret<AnyBuffer>()                       \
      .Ret<AnyBuffer>()                       \
      .Ret<AnyBuffer>()                       \
      .Attr<int32_t>("algo")                  \
      .Attr<int32_t>("fp8_dtype")             \
      .Attr<float>("margin")

}  // namespace

// (In te_jax, not the anonymous namespace: the handlers are extern "C" symbols.)
TE_JAX_DEFINE_HANDLERS(te_jax_quantize_fp8, quantize_fp8, TE_JAX_QUANTIZE_FP8_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_quantize_fp8_current_scaling, quantize_fp8_current_scaling,
                       TE_JAX_QUANTIZE_FP8_CURRENT_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_dequantize_fp8, dequantize_fp8, TE_JAX_DEQUANTIZE_FP8_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_compute_amax, compute_amax, TE_JAX_COMPUTE_AMAX_ARGS);
TE_JAX_DEFINE_HANDLERS(te_jax_delayed_scaling_update, delayed_scaling_update,
                       TE_JAX_DELAYED_SCALING_UPDATE_ARGS);

}  // namespace te_jax
