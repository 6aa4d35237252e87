// C entry points of the norm family: validate once, then run the backend of
// x's device.
#include <cmath>
#include <cstdint>

#include "norm/backend.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "te/norm.h"

namespace te::norm {
namespace {

// Every buffer of the family must start at a multiple of its element size:
// the kernels access elements (and, when the address allows, 16-byte
// vectors) directly, and a CUDA element access at a misaligned address is a
// sticky "misaligned address" fault. Allocators always align this much.
void check_element_aligned(const te_tensor* t, const char* name) {
  const uintptr_t bytes = static_cast<uintptr_t>(dtype_bits(t->dtype) / 8);
  const uintptr_t off = bytes > 1 ? reinterpret_cast<uintptr_t>(t->data) % bytes : 0;
  if (off != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be aligned to its element size (",
         bytes, " bytes for ", dtype_name(t->dtype), "), got an address ", off,
         " bytes past a multiple of ", bytes);
}

// x as [rows, cols]: rank >= 1 and a non-empty last dimension.
void check_x(const te_tensor* x, int64_t* rows, int64_t* cols) {
  Arg(x, "x").dtype_in(kHighPrecision, kHighPrecisionText);
  check_element_aligned(x, "x");
  if (x->ndim < 1)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'x' must have at least 1 dimension (the normalized "
         "last one), got a scalar");
  *rows = leading_rows(*x);
  *cols = last_dim(*x);
  if (*cols < 1)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'x' must have a non-empty last dimension, got shape ",
         shape_string(*x));
}

// A per-column vector (gamma, beta, dgamma, dbeta): H elements on x's device.
void check_per_column(const te_tensor* t, const char* name, int64_t cols, const te_tensor& x) {
  Arg(t, name).same_device(x, "x");
  check_element_aligned(t, name);
  if (numel(*t) != cols)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have ", cols,
         " elements (the last dimension of 'x'), got shape ", shape_string(*t));
}

void check_same_type(const te_tensor* t, const char* name, const te_tensor& like,
                     const char* like_name) {
  if (t->dtype != like.dtype)
    fail(TE_ERROR_INVALID_DTYPE, "argument '", name, "' must have the type of '", like_name, "' (",
         dtype_name(like.dtype), "), got ", dtype_name(t->dtype));
}

// A per-row FP32 vector (mu, rsigma): N elements on x's device.
float* per_row(const te_tensor* t, const char* name, int64_t rows, const te_tensor& x) {
  Arg(t, name).dtype(TE_DTYPE_FLOAT32).same_device(x, "x");
  check_element_aligned(t, name);
  if (numel(*t) != rows)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have ", rows,
         " elements (one per row of 'x' viewed as [N, H]), got shape ", shape_string(*t));
  return static_cast<float*>(t->data);
}

// (An output: the forward's mu and rsigma.)
float* optional_per_row(te_tensor* t, const char* name, int64_t rows, const te_tensor& x) {
  if (t == nullptr) return nullptr;
  float* data = per_row(t, name, rows, x);
  mark_written(t);
  return data;
}

void check_eps(float eps) {
  if (!(eps >= 0.0f) || std::isinf(eps))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'eps' must be finite and >= 0, got ", eps);
}

// Everything the two forward entry points share: x, gamma, eps, y and its
// FP8 scaling tensors, rsigma.
FwdArgs check_forward(const te_tensor* x, const te_tensor* gamma, float eps,
                      int zero_centered_gamma, te_tensor* y, const te_tensor* y_scale,
                      te_tensor* y_scale_inv, te_tensor* y_amax, te_tensor* rsigma) {
  FwdArgs a{};
  check_x(x, &a.rows, &a.cols);
  a.x = x->data;
  a.x_dtype = x->dtype;
  Arg(gamma, "gamma").dtype_in(kHighPrecision, kHighPrecisionText);
  check_per_column(gamma, "gamma", a.cols, *x);
  a.gamma = gamma->data;
  a.w_dtype = gamma->dtype;
  check_eps(eps);
  a.eps = eps;
  a.zero_centered_gamma = zero_centered_gamma != 0;

  Arg(y, "y")
      .output()
      .dtype_in({TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT16, TE_DTYPE_FLOAT8E4M3,
                 TE_DTYPE_FLOAT8E5M2},
                "float32, bfloat16, float16, float8_e4m3 or float8_e5m2")
      .same_shape(*x, "x")
      .same_device(*x, "x");
  check_element_aligned(y, "y");
  a.y = y->data;
  a.y_dtype = y->dtype;
  if (is_fp8(y->dtype)) {
    if (y_scale == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'y_scale' is required when 'y' is FP8 (",
           dtype_name(y->dtype), ")");
    Arg(y_scale, "y_scale").scalar_fp32().same_device(*x, "x");
    check_element_aligned(y_scale, "y_scale");
    a.y_scale = static_cast<const float*>(y_scale->data);
    if (y_scale_inv) {
      Arg(y_scale_inv, "y_scale_inv").output().scalar_fp32().same_device(*x, "x");
      check_element_aligned(y_scale_inv, "y_scale_inv");
      a.y_scale_inv = static_cast<float*>(y_scale_inv->data);
    }
  } else if (y_scale || y_scale_inv) {
    fail(TE_ERROR_INVALID_ARGUMENT,
         "arguments 'y_scale' and 'y_scale_inv' are only for "
         "an FP8 'y'; 'y' is ",
         dtype_name(y->dtype), " (pass NULL)");
  }
  if (y_amax) {  // any y type: a high-precision y gives the amax of its stored values
    Arg(y_amax, "y_amax").output().scalar_fp32().same_device(*x, "x");
    check_element_aligned(y_amax, "y_amax");
    a.y_amax = static_cast<float*>(y_amax->data);
  }
  a.rsigma = optional_per_row(rsigma, "rsigma", a.rows, *x);
  return a;
}

// Bytes of workspace the backward of x [rows, cols] needs: 0 on the CPU; on
// CUDA the size depends on the launch plan (grid) of the device, made current.
size_t backward_workspace_bytes(const te_tensor& x, int64_t rows, int64_t cols, bool layernorm) {
  if (!on_cuda(x)) return 0;
#ifdef TE_WITH_CUDA
  use_cuda_device(x.device_index);
  return cuda::backward_workspace_bytes(x.dtype, rows, cols, layernorm);
#else
  fail_no_cuda();
#endif
}

// Everything the two backward entry points share.
BwdArgs check_backward(bool layernorm, const te_tensor* dz, const te_tensor* x,
                       const te_tensor* rsigma, const te_tensor* gamma, int zero_centered_gamma,
                       te_tensor* dx, te_tensor* dgamma, te_tensor* workspace) {
  BwdArgs a{};
  a.layernorm = layernorm;
  check_x(x, &a.rows, &a.cols);
  a.x = x->data;
  a.x_dtype = x->dtype;
  Arg(dz, "dz").same_shape(*x, "x").same_device(*x, "x");
  check_same_type(dz, "dz", *x, "x");
  check_element_aligned(dz, "dz");
  a.dz = dz->data;
  a.rsigma = per_row(rsigma, "rsigma", a.rows, *x);
  Arg(gamma, "gamma").dtype_in(kHighPrecision, kHighPrecisionText);
  check_per_column(gamma, "gamma", a.cols, *x);
  a.gamma = gamma->data;
  a.w_dtype = gamma->dtype;
  a.zero_centered_gamma = zero_centered_gamma != 0;
  Arg(dx, "dx").output().same_shape(*x, "x").same_device(*x, "x");
  check_same_type(dx, "dx", *x, "x");
  check_element_aligned(dx, "dx");
  a.dx = dx->data;
  check_per_column(dgamma, "dgamma", a.cols, *x);
  mark_written(dgamma);
  check_same_type(dgamma, "dgamma", *gamma, "gamma");
  a.dgamma = dgamma->data;

  const size_t needed = backward_workspace_bytes(*x, a.rows, a.cols, layernorm);
  if (needed > 0 || workspace != nullptr) {
    Arg ws(workspace, "workspace");
    ws.output().dtype(TE_DTYPE_BYTE).same_device(*x, "x");
    if (static_cast<size_t>(numel(*workspace)) < needed)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace' must hold at least ", needed,
           " bytes (the workspace-size query for 'x' ", shape_string(*x), "), got ",
           numel(*workspace));
    if (reinterpret_cast<uintptr_t>(workspace->data) % 16 != 0)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace' must be 16-byte aligned");
    a.workspace = workspace->data;
  }
  return a;
}

size_t workspace_bytes(const te_tensor* x, bool layernorm) {
  int64_t rows = 0, cols = 0;
  check_descriptor(x, "x");
  check_x(x, &rows, &cols);
  return backward_workspace_bytes(*x, rows, cols, layernorm);
}

void write_size(size_t* out, size_t bytes) {
  if (out == nullptr) fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace_bytes' is required");
  *out = bytes;
}

}  // namespace
}  // namespace te::norm

using namespace te;
using namespace te::norm;

extern "C" {

te_status te_layernorm_fwd(const te_norm_fwd_params* params, te_stream stream) {
  return guarded("te_layernorm_fwd", [&] {
    const te_norm_fwd_params& p = required_params(params);
    FwdArgs a = check_forward(p.x, p.gamma, p.eps, p.zero_centered_gamma, p.y, p.y_scale,
                              p.y_scale_inv, p.y_amax, p.rsigma);
    a.layernorm = true;
    check_per_column(p.beta, "beta", a.cols, *p.x);
    check_same_type(p.beta, "beta", *p.gamma, "gamma");
    a.beta = p.beta->data;
    a.mu = optional_per_row(p.mu, "mu", a.rows, *p.x);
    TE_DISPATCH(*p.x, cpu::forward(a), cuda::forward(a, stream));
  });
}

te_status te_rmsnorm_fwd(const te_norm_fwd_params* params, te_stream stream) {
  return guarded("te_rmsnorm_fwd", [&] {
    const te_norm_fwd_params& p = required_params(params);
    require_null(p.beta, "beta", "RMSNorm has no beta");
    require_null(p.mu, "mu", "RMSNorm has no mean");
    FwdArgs a = check_forward(p.x, p.gamma, p.eps, p.zero_centered_gamma, p.y, p.y_scale,
                              p.y_scale_inv, p.y_amax, p.rsigma);
    a.layernorm = false;
    TE_DISPATCH(*p.x, cpu::forward(a), cuda::forward(a, stream));
  });
}

te_status te_layernorm_bwd_workspace_size(const te_tensor* x, size_t* workspace_bytes) {
  return guarded("te_layernorm_bwd_workspace_size",
                 [&] { write_size(workspace_bytes, te::norm::workspace_bytes(x, true)); });
}

te_status te_rmsnorm_bwd_workspace_size(const te_tensor* x, size_t* workspace_bytes) {
  return guarded("te_rmsnorm_bwd_workspace_size",
                 [&] { write_size(workspace_bytes, te::norm::workspace_bytes(x, false)); });
}

te_status te_layernorm_bwd(const te_norm_bwd_params* params, te_stream stream) {
  return guarded("te_layernorm_bwd", [&] {
    const te_norm_bwd_params& p = required_params(params);
    BwdArgs a = check_backward(true, p.dz, p.x, p.rsigma, p.gamma, p.zero_centered_gamma, p.dx,
                               p.dgamma, p.workspace);
    a.mu = per_row(p.mu, "mu", a.rows, *p.x);
    check_per_column(p.dbeta, "dbeta", a.cols, *p.x);
    mark_written(p.dbeta);
    check_same_type(p.dbeta, "dbeta", *p.gamma, "gamma");
    a.dbeta = p.dbeta->data;
    TE_DISPATCH(*p.x, cpu::backward(a), cuda::backward(a, stream));
  });
}

te_status te_rmsnorm_bwd(const te_norm_bwd_params* params, te_stream stream) {
  return guarded("te_rmsnorm_bwd", [&] {
    const te_norm_bwd_params& p = required_params(params);
    require_null(p.mu, "mu", "RMSNorm has no mean");
    require_null(p.dbeta, "dbeta", "RMSNorm has no beta");
    BwdArgs a = check_backward(false, p.dz, p.x, p.rsigma, p.gamma, p.zero_centered_gamma, p.dx,
                               p.dgamma, p.workspace);
    TE_DISPATCH(*p.x, cpu::backward(a), cuda::backward(a, stream));
  });
}

}  // extern "C"
