// C entry points of the GEMM family: validate every argument once, then run
// the backend of A's device. The rules are the contract of te/gemm.h; each
// message names the argument and the rule it broke.
#include <cmath>

#include "gemm/backend.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "te/gemm.h"

namespace te::gemm {
namespace {

constexpr std::initializer_list<te_dtype> kInputTypes = {TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16,
                                                         TE_DTYPE_FLOAT16, TE_DTYPE_FLOAT8E4M3,
                                                         TE_DTYPE_FLOAT8E5M2};
constexpr const char* kInputText = "float32, bfloat16, float16, float8_e4m3 or float8_e5m2";

// te_gemm_workspace_size reads no data pointer: it validates copies of the
// descriptors whose NULL data is replaced by distinct dummy pointers (never
// dereferenced; distinct so that the aliasing check of C and D stays quiet).
class Descriptors {
 public:
  explicit Descriptors(bool size_only) : size_only_(size_only) {}

  const te_tensor* view(const te_tensor* t) {
    if (!size_only_ || t == nullptr) return t;
    te_tensor& copy = storage_[used_++];
    copy = *t;
    if (copy.data == nullptr) copy.data = reinterpret_cast<void*>(kDummyBase * used_);
    return &copy;
  }

 private:
  static constexpr uintptr_t kDummyBase = 256;
  bool size_only_;
  te_tensor storage_[12] = {};
  int used_ = 0;
};

// One optional tensor on A's device: its Arg checks, or nothing when NULL.
const te_tensor* optional_on_device(const te_tensor* t, const char* name, const te_tensor& a) {
  if (t != nullptr) Arg(t, name).same_device(a, "a");
  return t;
}

void check_fp8_scale(const te_tensor* scale_inv, const char* scale_name, const te_tensor& operand,
                     const char* operand_name) {
  if (is_fp8(operand.dtype)) {
    if (scale_inv == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument '", scale_name, "' is required when '",
           operand_name, "' is FP8 (", dtype_name(operand.dtype), "): the FP32 scalar 1/scale");
    Arg(scale_inv, scale_name).scalar_fp32().same_device(operand, operand_name);
  } else if (scale_inv != nullptr) {
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", scale_name, "' is only for an FP8 '",
         operand_name, "', got ", dtype_name(operand.dtype), " data; pass NULL");
  }
}

void check_input_types(const te_tensor& a, const te_tensor& b) {
  Arg(&a, "a").dtype_in(kInputTypes, kInputText);
  Arg(&b, "b").dtype_in(kInputTypes, kInputText);
  const bool fp8_a = is_fp8(a.dtype), fp8_b = is_fp8(b.dtype);
  if (fp8_a != fp8_b)
    fail(TE_ERROR_INVALID_DTYPE,
         "arguments 'a' and 'b' must both be FP8 or both high precision, "
         "got ",
         dtype_name(a.dtype), " and ", dtype_name(b.dtype));
  if (!fp8_a && a.dtype != b.dtype)
    fail(TE_ERROR_INVALID_DTYPE, "arguments 'a' and 'b' must have the same type, got ",
         dtype_name(a.dtype), " and ", dtype_name(b.dtype));
  if (a.dtype == TE_DTYPE_FLOAT8E5M2 && b.dtype == TE_DTYPE_FLOAT8E5M2)
    fail(TE_ERROR_INVALID_DTYPE,
         "arguments 'a' and 'b' cannot both be float8_e5m2 (FP8 GEMMs "
         "take E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3)");
}

void check_matrix_rank(const te_tensor& t, const char* name) {
  if (t.ndim < 2)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name,
         "' must have at least 2 dims (leading dims "
         "are folded into rows), got shape ",
         shape_string(t));
}

// Fills m, n, k and the operands from A and B.
void infer_dims(const te_gemm_params& p, GemmArgs& g) {
  const te_tensor& a = *p.a;
  const te_tensor& b = *p.b;
  check_matrix_rank(a, "a");
  check_matrix_rank(b, "b");
  const int64_t a_rows = leading_rows(a), a_cols = last_dim(a);
  const int64_t b_rows = leading_rows(b), b_cols = last_dim(b);
  g.m = p.transa ? a_cols : a_rows;
  const int64_t k_a = p.transa ? a_rows : a_cols;
  const int64_t k_b = p.transb ? b_cols : b_rows;
  g.n = p.transb ? b_rows : b_cols;
  if (k_a != k_b)
    fail(TE_ERROR_INVALID_ARGUMENT, "inner dimensions differ: op(A) is [", g.m, ", ", k_a, "] (a ",
         shape_string(a), p.transa ? ", transa" : "", ") but op(B) is [", k_b, ", ", g.n, "] (b ",
         shape_string(b), p.transb ? ", transb" : "", ")");
  g.k = k_a;
  if (is_fp8(a.dtype) && (g.m % 16 != 0 || g.n % 16 != 0 || g.k % 16 != 0))
    fail(TE_ERROR_INVALID_ARGUMENT, "FP8 GEMM needs M, N and K divisible by 16 (got M=", g.m,
         ", N=", g.n, ", K=", g.k, "); pad the tensors to a multiple of 16");
  g.a = Operand{a.data, a.dtype, nullptr, p.transa != 0};
  g.b = Operand{b.data, b.dtype, nullptr, p.transb != 0};
  if (p.a_scale_inv) g.a.scale_inv = static_cast<const float*>(p.a_scale_inv->data);
  if (p.b_scale_inv) g.b.scale_inv = static_cast<const float*>(p.b_scale_inv->data);
}

void check_output(const te_gemm_params& p, GemmArgs& g) {
  const te_tensor& a = *p.a;
  Arg(p.d, "d").output().dtype_in(kInputTypes, kInputText).shape2d(g.m, g.n).same_device(a, "a");
  g.d = p.d->data;
  g.d_dtype = p.d->dtype;
  if (is_fp8(p.d->dtype)) {
    if (p.d_scale == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'd_scale' is required when 'd' is FP8 (",
           dtype_name(p.d->dtype), "): D = saturate(round(result * d_scale))");
    Arg(p.d_scale, "d_scale").scalar_fp32().same_device(a, "a");
    g.d_scale = static_cast<const float*>(p.d_scale->data);
    if (p.d_amax) {
      Arg(p.d_amax, "d_amax").output().scalar_fp32().same_device(a, "a");
      g.d_amax = static_cast<float*>(p.d_amax->data);
    }
  } else {
    if (p.d_scale)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'd_scale' is only for an FP8 'd', got ",
           dtype_name(p.d->dtype), "; pass NULL");
    if (p.d_amax)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'd_amax' is only for an FP8 'd', got ",
           dtype_name(p.d->dtype), "; pass NULL");
  }
}

void check_c(const te_gemm_params& p, GemmArgs& g) {
  if (p.c == nullptr) {
    if (p.beta != 0.0f)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'beta' is ", p.beta,
           " but 'c' is NULL; pass C or beta = 0");
    return;
  }
  Arg c(p.c, "c");
  c.shape2d(g.m, g.n).same_device(*p.a, "a");
  if (is_fp8(g.d_dtype))
    c.dtype_in(kHighPrecision, "float32, bfloat16 or float16 (C of an FP8 D is high precision)");
  else
    c.dtype(g.d_dtype);
  if (p.c->data == p.d->data && p.c->dtype != g.d_dtype)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "arguments 'c' and 'd' share memory but have different "
         "types (",
         dtype_name(p.c->dtype), " and ", dtype_name(g.d_dtype), ")");
  allow_alias(p.d, p.c);  // accumulation in place (te/gemm.h): C is D itself
  // beta == 0: C is not read (so NaN or garbage in C never reaches D).
  if (p.beta != 0.0f) g.c = Optional{p.c->data, p.c->dtype};
}

void check_epilogues(const te_gemm_params& p, GemmArgs& g) {
  const te_tensor& a = *p.a;
  if (optional_on_device(p.bias, "bias", a)) {
    Arg bias(p.bias, "bias");
    bias.dtype_in(kHighPrecision, kHighPrecisionText);
    if (p.bias->ndim != 1 || p.bias->shape[0] != g.n)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'bias' must have shape [N] = [", g.n, "], got ",
           shape_string(*p.bias));
    g.bias = Optional{p.bias->data, p.bias->dtype};
  }
  if (optional_on_device(p.pre_gelu_out, "pre_gelu_out", a)) {
    Arg(p.pre_gelu_out, "pre_gelu_out")
        .output()
        .dtype_in(kHighPrecision, kHighPrecisionText)
        .shape2d(g.m, g.n);
    g.pre_gelu_out = Optional{p.pre_gelu_out->data, p.pre_gelu_out->dtype};
  }
  if (optional_on_device(p.bias_grad, "bias_grad", a)) {
    Arg(p.bias_grad, "bias_grad").output().dtype_in(kHighPrecision, kHighPrecisionText);
    if (p.bias_grad->ndim != 1 || p.bias_grad->shape[0] != g.m)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'bias_grad' must have shape [M] = [", g.m,
           "], got ", shape_string(*p.bias_grad));
    g.bias_grad = Optional{p.bias_grad->data, p.bias_grad->dtype};
  }
}

}  // namespace

// Everything but the workspace (declared in backend.h: te/gemm_block.h uses it too).
GemmArgs check_params(const te_gemm_params* params, bool size_only) {
  if (params == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'params' is required (got NULL)");
  Descriptors views(size_only);
  te_gemm_params p = *params;
  p.a = views.view(p.a);
  p.a_scale_inv = views.view(p.a_scale_inv);
  p.b = views.view(p.b);
  p.b_scale_inv = views.view(p.b_scale_inv);
  p.c = views.view(p.c);
  p.d = const_cast<te_tensor*>(views.view(p.d));
  p.d_scale = views.view(p.d_scale);
  p.d_amax = const_cast<te_tensor*>(views.view(p.d_amax));
  p.bias = views.view(p.bias);
  p.pre_gelu_out = const_cast<te_tensor*>(views.view(p.pre_gelu_out));
  p.bias_grad = const_cast<te_tensor*>(views.view(p.bias_grad));

  Arg a(p.a, "a");
  Arg b(p.b, "b");
  b.same_device(*p.a, "a");
  check_input_types(*p.a, *p.b);
  check_fp8_scale(p.a_scale_inv, "a_scale_inv", *p.a, "a");
  check_fp8_scale(p.b_scale_inv, "b_scale_inv", *p.b, "b");
  GemmArgs g;
  infer_dims(p, g);
  check_output(p, g);
  check_c(p, g);
  check_epilogues(p, g);
  if (!std::isfinite(p.alpha) || !std::isfinite(p.beta))
    fail(TE_ERROR_INVALID_ARGUMENT,
         "arguments 'alpha' and 'beta' must be finite, got alpha=", p.alpha, ", beta=", p.beta);
  g.alpha = p.alpha;
  g.beta = g.c.present() ? p.beta : 0.0f;
  g.use_split_accumulator = p.use_split_accumulator != 0;
  g.device_index = p.a->device_index;
  return g;
}

namespace {

size_t required_workspace(const GemmArgs& g, const te_tensor& a) {
  return on_cuda(a) ? cuda_workspace_size(g) : 0;  // the CPU backend uses host scratch
}

}  // namespace
}  // namespace te::gemm

using namespace te;
using namespace te::gemm;

extern "C" {

te_status te_gemm_workspace_size(const te_gemm_params* params, size_t* workspace_bytes) {
  return guarded("te_gemm_workspace_size", [&] {
    if (workspace_bytes == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace_bytes' is required (got NULL)");
    const GemmArgs g = check_params(params, /*size_only=*/true);
#ifndef TE_WITH_CUDA
    if (on_cuda(*params->a)) fail_no_cuda();
#endif
    *workspace_bytes = required_workspace(g, *params->a);
  });
}

te_status te_gemm(const te_gemm_params* params, te_stream stream) {
  return guarded("te_gemm", [&] {
    GemmArgs g = check_params(params, /*size_only=*/false);
    const te_tensor& a = *params->a;
    const size_t needed = required_workspace(g, a);
    if (params->workspace != nullptr) {
      Arg(params->workspace, "workspace").output().dtype(TE_DTYPE_BYTE).same_device(a, "a");
      g.workspace = params->workspace->data;
      g.workspace_bytes = static_cast<size_t>(size_bytes(*params->workspace));
    }
    if (g.workspace_bytes < needed)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace' must hold at least ", needed,
           " bytes for this GEMM, got ", g.workspace_bytes,
           " (query te_gemm_workspace_size with the same parameters)");
    TE_DISPATCH(a, cpu::gemm(g), cuda::gemm(g, stream));
  });
}

}  // extern "C"
