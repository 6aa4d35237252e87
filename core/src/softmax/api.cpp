// C entry points of the fused softmax family: validate once, then run the
// backend of x's device.
#include <cmath>
#include <cstdint>

#include "runtime/device.h"
#include "runtime/tensor.h"
#include "softmax/backend.h"
#include "te/softmax.h"

namespace te::softmax {
namespace {

void check_element_aligned(const te_tensor* t, const char* name) {
  const uintptr_t bytes = static_cast<uintptr_t>(dtype_bits(t->dtype) / 8);
  if (bytes > 1 && reinterpret_cast<uintptr_t>(t->data) % bytes != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be aligned to its element size (",
         bytes, " bytes)");
}

void check_scale(float scale) {
  if (!std::isfinite(scale))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'scale' must be finite, got ", scale);
}

const char* rank_text(Kind kind) {
  switch (kind) {
    case kPlain: return "at least 1 dimension";
    case kCausal: return "3 dimensions [attn_batches, sq, sk]";
    default: return "4 dimensions [b, h, sq, sk]";
  }
}

// The input's shape rule for the kind; fills rows, sk, sq.
void check_input(const te_tensor* t, const char* name, Kind kind, Args* a) {
  Arg(t, name).dtype_in(kHighPrecision, kHighPrecisionText);
  check_element_aligned(t, name);
  const bool ok = kind == kPlain ? t->ndim >= 1 : t->ndim == (kind == kCausal ? 3 : 4);
  if (!ok)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have ", rank_text(kind),
         ", got shape ", shape_string(*t));
  a->sk = last_dim(*t);
  if (a->sk < 1)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name,
         "' must have a non-empty last dimension, got shape ", shape_string(*t));
  a->rows = leading_rows(*t);
  a->sq = kind == kPlain ? 1 : t->shape[t->ndim - 2];
  if (kind == kCausal && a->sq != a->sk)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name,
         "' must be square in its last two dimensions (sq == sk) for the upper-triangular "
         "causal softmax, got shape ",
         shape_string(*t));
}

void check_like(const te_tensor* t, const char* name, const te_tensor& like,
                const char* like_name) {
  Arg(t, name).same_shape(like, like_name).same_device(like, like_name);
  if (t->dtype != like.dtype)
    fail(TE_ERROR_INVALID_DTYPE, "argument '", name, "' must have the type of '", like_name, "' (",
         dtype_name(like.dtype), "), got ", dtype_name(t->dtype));
  check_element_aligned(t, name);
}

void check_mask(const te_tensor* mask, const te_tensor& x, Args* a) {
  Arg(mask, "mask").dtype(TE_DTYPE_BYTE).same_device(x, "x");
  const int64_t* s = x.shape;
  if (mask->ndim != 4 || (mask->shape[0] != 1 && mask->shape[0] != s[0]) || mask->shape[1] != 1 ||
      mask->shape[2] != s[2] || mask->shape[3] != s[3])
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'mask' must be [", s[0], " or 1, 1, ", s[2], ", ",
         s[3], "] for x ", shape_string(x), ", got shape ", shape_string(*mask));
  a->mask = static_cast<const uint8_t*>(mask->data);
  a->mask_batches = mask->shape[0];
  a->rows_per_mask = s[1] * s[2];
}

void run(const Args& a, const te_tensor& like, te_stream stream) {
  if (a.rows == 0) return;
  TE_DISPATCH(like, cpu::run(a), cuda::run(a, stream));
}

void forward(Kind kind, const te_tensor* x, const te_tensor* mask, float scale, te_tensor* y,
             te_stream stream) {
  Args a{};
  a.kind = kind;
  check_input(x, "x", kind, &a);
  check_scale(scale);
  a.scale = scale;
  check_like(y, "y", *x, "x");
  mark_written(y);
  allow_alias(y, x);  // in place (te/softmax.h); any other overlap fails at the dispatch
  if (kind == kMasked) check_mask(mask, *x, &a);
  a.dtype = x->dtype;
  a.in = x->data;
  a.out = y->data;
  run(a, *x, stream);
}

void backward(Kind kind, const te_tensor* dy, const te_tensor* y, float scale, te_tensor* dx,
              te_stream stream) {
  Args a{};
  a.kind = kind;
  a.backward = true;
  check_input(y, "y", kind, &a);
  check_scale(scale);
  a.scale = scale;
  check_like(dy, "dy", *y, "y");
  check_like(dx, "dx", *y, "y");
  mark_written(dx);
  allow_alias(dx, dy);  // in place (te/softmax.h); dx overlapping y fails at the dispatch
  a.dtype = y->dtype;
  a.in = dy->data;
  a.y = y->data;
  a.out = dx->data;
  run(a, *y, stream);
}

}  // namespace
}  // namespace te::softmax

using namespace te;
using namespace te::softmax;

extern "C" {

te_status te_softmax_scaled_softmax_fwd(const te_tensor* x, float scale, te_tensor* y,
                                        te_stream stream) {
  return guarded("te_softmax_scaled_softmax_fwd",
                 [&] { forward(kPlain, x, nullptr, scale, y, stream); });
}

te_status te_softmax_scaled_softmax_bwd(const te_tensor* dy, const te_tensor* y, float scale,
                                        te_tensor* dx, te_stream stream) {
  return guarded("te_softmax_scaled_softmax_bwd",
                 [&] { backward(kPlain, dy, y, scale, dx, stream); });
}

te_status te_softmax_scaled_masked_softmax_fwd(const te_tensor* x, const te_tensor* mask,
                                               float scale, te_tensor* y, te_stream stream) {
  return guarded("te_softmax_scaled_masked_softmax_fwd",
                 [&] { forward(kMasked, x, mask, scale, y, stream); });
}

te_status te_softmax_scaled_masked_softmax_bwd(const te_tensor* dy, const te_tensor* y, float scale,
                                               te_tensor* dx, te_stream stream) {
  return guarded("te_softmax_scaled_masked_softmax_bwd",
                 [&] { backward(kMasked, dy, y, scale, dx, stream); });
}

te_status te_softmax_scaled_upper_triang_masked_softmax_fwd(const te_tensor* x, float scale,
                                                            te_tensor* y, te_stream stream) {
  return guarded("te_softmax_scaled_upper_triang_masked_softmax_fwd",
                 [&] { forward(kCausal, x, nullptr, scale, y, stream); });
}

te_status te_softmax_scaled_upper_triang_masked_softmax_bwd(const te_tensor* dy, const te_tensor* y,
                                                            float scale, te_tensor* dx,
                                                            te_stream stream) {
  return guarded("te_softmax_scaled_upper_triang_masked_softmax_bwd",
                 [&] { backward(kCausal, dy, y, scale, dx, stream); });
}

te_status te_softmax_scaled_aligned_causal_masked_softmax_fwd(const te_tensor* x, float scale,
                                                              te_tensor* y, te_stream stream) {
  return guarded("te_softmax_scaled_aligned_causal_masked_softmax_fwd",
                 [&] { forward(kBottomRight, x, nullptr, scale, y, stream); });
}

te_status te_softmax_scaled_aligned_causal_masked_softmax_bwd(const te_tensor* dy,
                                                              const te_tensor* y, float scale,
                                                              te_tensor* dx, te_stream stream) {
  return guarded("te_softmax_scaled_aligned_causal_masked_softmax_bwd",
                 [&] { backward(kBottomRight, dy, y, scale, dx, stream); });
}

}  // extern "C"
