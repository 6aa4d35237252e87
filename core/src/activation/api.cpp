// C entry points of the activation family: validate once, then run the
// backend of the input's device.
#include "activation/backend.h"
#include "runtime/device.h"
#include "runtime/element.h"
#include "runtime/tensor.h"
#include "te/activation.h"

namespace te::activation {
namespace {

constexpr std::initializer_list<te_dtype> kAnyOutput = {TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16,
                                                        TE_DTYPE_FLOAT16, TE_DTYPE_FLOAT8E4M3,
                                                        TE_DTYPE_FLOAT8E5M2};
constexpr const char* kAnyOutputText = "float32, bfloat16, float16, float8_e4m3 or float8_e5m2";

void check_kind(te_activation kind) {
  if (!is_valid_kind(kind))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'kind' must be a te_activation value from 0 to ",
         kKindCount - 1, ", got ", static_cast<int>(kind));
}

// Kinds that read no parameters get the defaults (never read).
Params check_params(te_activation kind, const te_activation_params* params) {
  if (params == nullptr || !kind_info(kind).params) return kDefaultParams;
  const char* name = kind_name(kind);
  if (!(params->limit > 0.0f))
    fail(TE_ERROR_INVALID_ARGUMENT, name, " needs 'limit' > 0, got ", params->limit);
  if (!std::isfinite(params->alpha))
    fail(TE_ERROR_INVALID_ARGUMENT, name, " needs a finite 'alpha', got ", params->alpha);
  if (!std::isfinite(params->glu_linear_offset))
    fail(TE_ERROR_INVALID_ARGUMENT, name, " needs a finite 'glu_linear_offset', got ",
         params->glu_linear_offset);
  return *params;
}

// The input as [rows, in_cols]; returns the width H of the activation output.
int64_t check_input(te_activation kind, const te_tensor* input) {
  Arg(input, "input").dtype_in(kHighPrecision, kHighPrecisionText);
  if (!is_gated(kind)) return last_dim(*input);
  if (input->ndim == 0 || last_dim(*input) % 2 != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, kind_name(kind),
         " needs the input's last dimension to be even (halves [activated | linear]), got shape ",
         shape_string(*input));
  return last_dim(*input) / 2;
}

// t must have the shape of input, with the last dimension halved when halve.
void check_shape(const te_tensor& t, const char* name, const te_tensor& input, bool halve,
                 te_activation kind) {
  te_tensor expected = input;
  if (halve) expected.shape[expected.ndim - 1] /= 2;
  bool same = t.ndim == expected.ndim;
  for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == expected.shape[i];
  if (same) return;
  if (halve)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have shape ",
         shape_string(expected), " (the input ", shape_string(input),
         " with its last dimension halved, for ", kind_name(kind), "), got ", shape_string(t));
  fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have the shape of 'input' ",
       shape_string(input), ", got ", shape_string(t));
}

// Checks the outputs of a [rows, cols] result matrix shaped like `like`
// (output / grad_input); `name` is the rowwise argument's name.
OutputArgs check_outputs(const te_tensor& input, te_tensor* rowwise, const char* name,
                         te_tensor* columnwise, const te_tensor* scale, te_tensor* scale_inv,
                         te_tensor* amax, int64_t rows, int64_t cols, bool halve,
                         te_activation kind) {
  OutputArgs out{};
  if (rowwise == nullptr && columnwise == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "at least one of '", name, "' and 'columnwise' must be given");
  if (rowwise != nullptr) {
    Arg(rowwise, name).output().dtype_in(kAnyOutput, kAnyOutputText).same_device(input, "input");
    check_shape(*rowwise, name, input, halve, kind);
    out.rowwise = rowwise->data;
    out.rowwise_dtype = rowwise->dtype;
    if (is_fp8(rowwise->dtype)) out.fp8_dtype = rowwise->dtype;
  }
  if (columnwise != nullptr) {
    Arg(columnwise, "columnwise").output().dtype_in(kFp8, kFp8Text).same_device(input, "input");
    if (columnwise->ndim != 2 || columnwise->shape[0] != cols || columnwise->shape[1] != rows)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'columnwise' must have shape [", cols, ", ", rows,
           "] (the '", name, "' matrix [", rows, ", ", cols, "] transposed), got ",
           shape_string(*columnwise));
    if (rowwise != nullptr && rowwise->dtype != columnwise->dtype)
      fail(TE_ERROR_INVALID_DTYPE, "arguments '", name,
           "' and 'columnwise' must have the same FP8 "
           "type, got ",
           dtype_name(rowwise->dtype), " and ", dtype_name(columnwise->dtype));
    out.columnwise = static_cast<uint8_t*>(columnwise->data);
    out.fp8_dtype = columnwise->dtype;
  }
  const bool fp8 = columnwise != nullptr || is_fp8(rowwise->dtype);
  if (fp8 && scale == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'scale' is required for an FP8 '", name, "'");
  if (!fp8 && scale != nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'scale' is only used with an FP8 '", name,
         "', which is ", dtype_name(rowwise->dtype));
  if (!fp8 && scale_inv != nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'scale_inv' is only used with an FP8 '", name,
         "', which is ", dtype_name(rowwise->dtype));
  if (scale != nullptr) {
    Arg(scale, "scale").scalar_fp32().same_device(input, "input");
    out.scale = static_cast<const float*>(scale->data);
  }
  out.scale_inv = optional_fp32_scalar(scale_inv, "scale_inv", input);
  out.amax = optional_fp32_scalar(amax, "amax", input);
  return out;
}

// Fills the fields both directions share: kind, params, input, rows, cols.
template <class Args>
void check_common(Args& args, te_activation kind, const te_activation_params* params,
                  const te_tensor* input) {
  check_kind(kind);
  args.kind = kind;
  args.params = check_params(kind, params);
  args.cols = check_input(kind, input);
  args.input = input->data;
  args.input_dtype = input->dtype;
  args.rows = leading_rows(*input);
}

size_t workspace_bytes(const te_tensor& input, bool with_dbias) {
  if (!with_dbias || !on_cuda(input)) return 0;
  return static_cast<size_t>(4 * dbias_chunks(leading_rows(input)) * last_dim(input));
}

BackwardArgs check_backward(const te_activation_bwd_params& p) {
  const te_activation kind = p.kind;
  const te_tensor *grad = p.grad, *input = p.input;
  te_tensor *dbias = p.dbias, *workspace = p.workspace;
  BackwardArgs args{};
  check_common(args, kind, p.params, input);
  Arg(grad, "grad").same_device(*input, "input");
  if (grad->dtype != input->dtype)
    fail(TE_ERROR_INVALID_DTYPE, "argument 'grad' must have the dtype of 'input' (",
         dtype_name(input->dtype), "), got ", dtype_name(grad->dtype));
  check_shape(*grad, "grad", *input, is_gated(kind), kind);
  args.grad = grad->data;
  const int64_t in_cols = input_cols(kind, args.cols);
  args.out = check_outputs(*input, p.grad_input, "grad_input", p.columnwise, p.scale, p.scale_inv,
                           p.amax, args.rows, in_cols, false, kind);
  if (dbias != nullptr) {
    Arg(dbias, "dbias")
        .output()
        .dtype_in(kHighPrecision, kHighPrecisionText)
        .same_device(*input, "input");
    if (dbias->ndim != 1 || dbias->shape[0] != in_cols)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'dbias' must have shape [", in_cols,
           "] (the input's last dimension), got ", shape_string(*dbias));
    args.dbias = dbias->data;
    args.dbias_dtype = dbias->dtype;
  }
  const size_t needed = workspace_bytes(*input, dbias != nullptr);
  if (needed > 0) {
    if (workspace == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace' is required: the bias gradient on ",
           "CUDA needs ", static_cast<int64_t>(needed),
           " bytes (te_activation_bwd_workspace_size)");
    Arg(workspace, "workspace").output().dtype(TE_DTYPE_BYTE).same_device(*input, "input");
    if (static_cast<size_t>(numel(*workspace)) < needed)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace' must hold at least ",
           static_cast<int64_t>(needed), " bytes, got ", numel(*workspace));
    if (reinterpret_cast<uintptr_t>(workspace->data) % 16 != 0)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace' must be 16-byte aligned");
    args.workspace = static_cast<float*>(workspace->data);
  }
  return args;
}

// The forward output's columnwise copy of the fused backward: FP8 [H, M] with
// its own scale (required) and scale_inv (optional).
OutputArgs check_fwd_columnwise(const te_tensor& input, te_tensor* fwd_columnwise,
                                const te_tensor* fwd_scale, te_tensor* fwd_scale_inv, int64_t rows,
                                int64_t cols, te_activation kind) {
  Arg(fwd_columnwise, "fwd_columnwise")
      .output()
      .dtype_in(kFp8, kFp8Text)
      .same_device(input, "input");
  if (fwd_columnwise->ndim != 2 || fwd_columnwise->shape[0] != cols ||
      fwd_columnwise->shape[1] != rows)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'fwd_columnwise' must have shape [", cols, ", ", rows,
         "] (the ", kind_name(kind), " output [", rows, ", ", cols, "] transposed), got ",
         shape_string(*fwd_columnwise));
  if (fwd_scale == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'fwd_scale' is required: 'fwd_columnwise' is quantized with it");
  Arg(fwd_scale, "fwd_scale").scalar_fp32().same_device(input, "input");
  OutputArgs fwd{};
  fwd.columnwise = static_cast<uint8_t*>(fwd_columnwise->data);
  fwd.fp8_dtype = fwd_columnwise->dtype;
  fwd.scale = static_cast<const float*>(fwd_scale->data);
  fwd.scale_inv = optional_fp32_scalar(fwd_scale_inv, "fwd_scale_inv", input);
  return fwd;
}

void run_backward(const BackwardArgs& args, const te_tensor& input, te_stream stream) {
  TE_DISPATCH(input, cpu::backward(args), cuda::backward(args, stream));
}

}  // namespace
}  // namespace te::activation

using namespace te;
using namespace te::activation;

extern "C" {

te_status te_activation_fwd(te_activation kind, const te_activation_params* params,
                            const te_tensor* input, te_tensor* output, te_tensor* columnwise,
                            const te_tensor* scale, te_tensor* scale_inv, te_tensor* amax,
                            te_stream stream) {
  return guarded("te_activation_fwd", [&] {
    ForwardArgs args{};
    check_common(args, kind, params, input);
    args.out = check_outputs(*input, output, "output", columnwise, scale, scale_inv, amax,
                             args.rows, args.cols, is_gated(kind), kind);
    TE_DISPATCH(*input, cpu::forward(args), cuda::forward(args, stream));
  });
}

te_status te_activation_bwd(const te_activation_bwd_params* params, te_stream stream) {
  return guarded("te_activation_bwd", [&] {
    const BackwardArgs args = check_backward(required_params(params));
    run_backward(args, *params->input, stream);
  });
}

te_status te_activation_bwd_with_fwd_columnwise(const te_activation_bwd_params* params,
                                                te_tensor* fwd_columnwise,
                                                const te_tensor* fwd_scale,
                                                te_tensor* fwd_scale_inv, te_dtype fwd_values_dtype,
                                                te_stream stream) {
  return guarded("te_activation_bwd_with_fwd_columnwise", [&] {
    BackwardArgs args = check_backward(required_params(params));
    args.fwd = check_fwd_columnwise(*params->input, fwd_columnwise, fwd_scale, fwd_scale_inv,
                                    args.rows, args.cols, params->kind);
    if (fwd_values_dtype != TE_DTYPE_FLOAT32 && fwd_values_dtype != TE_DTYPE_BFLOAT16 &&
        fwd_values_dtype != TE_DTYPE_FLOAT16)
      fail(TE_ERROR_INVALID_DTYPE, "argument 'fwd_values_dtype' must be ", kHighPrecisionText,
           " (the type the forward values are rounded to before quantizing), got ",
           dtype_name(fwd_values_dtype));
    args.fwd_values_dtype = fwd_values_dtype;
    run_backward(args, *params->input, stream);
  });
}

te_status te_activation_bwd_workspace_size(const te_tensor* input, int with_dbias,
                                           size_t* workspace_bytes_out) {
  return guarded("te_activation_bwd_workspace_size", [&] {
    if (input == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'input' is required (got NULL)");
    if (workspace_bytes_out == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace_bytes' is required (got NULL)");
    te_tensor shape_only = *input;
    if (shape_only.data == nullptr) shape_only.data = &shape_only;  // the data is not read
    check_descriptor(&shape_only, "input");
    *workspace_bytes_out = workspace_bytes(*input, with_dbias != 0);
  });
}

}  // extern "C"
