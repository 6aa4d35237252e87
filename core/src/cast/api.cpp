// C entry points of the cast family: validate once, then run the backend of
// the input's device.
#include "cast/backend.h"
#include "runtime/device.h"
#include "runtime/element.h"
#include "runtime/tensor.h"
#include "te/cast.h"

namespace te::cast {
namespace {

// Checks input and the FP8 outputs; fills everything but the scaling pointers.
Fp8QuantizeArgs check_quantize_outputs(const te_tensor* input, te_tensor* rowwise,
                                       te_tensor* columnwise, te_tensor* scale_inv,
                                       te_tensor* amax) {
  Arg in(input, "input");
  in.dtype_in(kHighPrecision, kHighPrecisionText);
  if (rowwise == nullptr && columnwise == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "at least one of 'rowwise' and 'columnwise' must be given");
  Fp8QuantizeArgs args{};
  args.input = input->data;
  args.input_dtype = input->dtype;
  args.rows = leading_rows(*input);
  args.cols = last_dim(*input);
  if (rowwise) {
    Arg(rowwise, "rowwise")
        .output()
        .dtype_in(kFp8, kFp8Text)
        .same_shape(*input, "input")
        .same_device(*input, "input");
    args.rowwise = static_cast<uint8_t*>(rowwise->data);
    args.fp8_dtype = rowwise->dtype;
  }
  if (columnwise) {
    Arg col(columnwise, "columnwise");
    col.output().dtype_in(kFp8, kFp8Text).same_device(*input, "input");
    if (columnwise->ndim != 2 || columnwise->shape[0] != args.cols ||
        columnwise->shape[1] != args.rows)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'columnwise' must have shape [", args.cols, ", ",
           args.rows, "] (the input viewed as [M, K] = [", args.rows, ", ", args.cols,
           "], transposed), got ", shape_string(*columnwise));
    if (rowwise && columnwise->dtype != rowwise->dtype)
      fail(TE_ERROR_INVALID_DTYPE,
           "arguments 'rowwise' and 'columnwise' must have the same FP8 "
           "type, got ",
           dtype_name(rowwise->dtype), " and ", dtype_name(columnwise->dtype));
    args.columnwise = static_cast<uint8_t*>(columnwise->data);
    args.fp8_dtype = columnwise->dtype;
  }
  args.scale_inv = optional_fp32_scalar(scale_inv, "scale_inv", *input);
  args.amax = optional_fp32_scalar(amax, "amax", *input);
  return args;
}

void check_epsilon(float amax_epsilon) {
  if (!(amax_epsilon >= 0.0f))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'amax_epsilon' must be >= 0, got ", amax_epsilon);
}

}  // namespace
}  // namespace te::cast

using namespace te;
using namespace te::cast;

extern "C" {

te_status te_cast_quantize_fp8(const te_tensor* input, const te_tensor* scale, te_tensor* rowwise,
                               te_tensor* columnwise, te_tensor* scale_inv, te_tensor* amax,
                               te_stream stream) {
  return guarded("te_cast_quantize_fp8", [&] {
    Fp8QuantizeArgs args = check_quantize_outputs(input, rowwise, columnwise, scale_inv, amax);
    Arg(scale, "scale").scalar_fp32().same_device(*input, "input");
    const float* s = static_cast<const float*>(scale->data);
    TE_DISPATCH(*input, cpu::quantize_fp8(args, s), cuda::quantize_fp8(args, s, stream));
  });
}

te_status te_cast_compute_amax(const te_tensor* input, te_tensor* amax, te_stream stream) {
  return guarded("te_cast_compute_amax", [&] {
    Arg(input, "input").dtype_in(kHighPrecision, kHighPrecisionText);
    Arg(amax, "amax").output().scalar_fp32().same_device(*input, "input");
    float* out = static_cast<float*>(amax->data);
    const int64_t n = numel(*input);
    TE_DISPATCH(*input, cpu::compute_amax(input->data, input->dtype, n, out),
                cuda::compute_amax(input->data, input->dtype, n, out, stream));
  });
}

te_status te_cast_compute_scale_from_amax(const te_tensor* amax, te_tensor* scale,
                                          te_tensor* scale_inv, te_dtype fp8_dtype,
                                          int force_pow2_scales, float amax_epsilon,
                                          te_stream stream) {
  return guarded("te_cast_compute_scale_from_amax", [&] {
    Arg(amax, "amax").scalar_fp32();
    Arg(scale, "scale").output().scalar_fp32().same_device(*amax, "amax");
    float* inv = optional_fp32_scalar(scale_inv, "scale_inv", *amax);
    if (!is_fp8(fp8_dtype))
      fail(TE_ERROR_INVALID_DTYPE, "argument 'fp8_dtype' must be ", kFp8Text, ", got ",
           dtype_name(fp8_dtype));
    check_epsilon(amax_epsilon);
    const float* a = static_cast<const float*>(amax->data);
    float* s = static_cast<float*>(scale->data);
    const float fp8_max = fp8_format(fp8_dtype).max_finite;
    const bool pow2 = force_pow2_scales != 0;
    TE_DISPATCH(*amax, cpu::scale_from_amax(a, s, inv, fp8_max, pow2, amax_epsilon),
                cuda::scale_from_amax(a, s, inv, fp8_max, pow2, amax_epsilon, stream));
  });
}

te_status te_cast_quantize_fp8_current_scaling(const te_tensor* input, te_tensor* rowwise,
                                               te_tensor* columnwise, te_tensor* scale,
                                               te_tensor* scale_inv, te_tensor* amax,
                                               int force_pow2_scales, float amax_epsilon,
                                               te_stream stream) {
  return guarded("te_cast_quantize_fp8_current_scaling", [&] {
    Fp8QuantizeArgs args = check_quantize_outputs(input, rowwise, columnwise, scale_inv, amax);
    if (scale_inv == nullptr) fail(TE_ERROR_INVALID_ARGUMENT, "argument 'scale_inv' is required");
    if (amax == nullptr) fail(TE_ERROR_INVALID_ARGUMENT, "argument 'amax' is required");
    Arg(scale, "scale").output().scalar_fp32().same_device(*input, "input");
    check_epsilon(amax_epsilon);
    CurrentScaling cs{static_cast<float*>(scale->data), force_pow2_scales != 0, amax_epsilon,
                      max_finite_of(input->dtype)};
    TE_DISPATCH(*input, cpu::quantize_fp8_current_scaling(args, cs),
                cuda::quantize_fp8_current_scaling(args, cs, stream));
  });
}

te_status te_cast_dequantize_fp8(const te_tensor* input, const te_tensor* scale_inv,
                                 te_tensor* output, te_stream stream) {
  return guarded("te_cast_dequantize_fp8", [&] {
    Arg(input, "input").dtype_in(kFp8, kFp8Text);
    Arg(scale_inv, "scale_inv").scalar_fp32().same_device(*input, "input");
    Arg(output, "output")
        .output()
        .dtype_in(kHighPrecision, kHighPrecisionText)
        .same_shape(*input, "input")
        .same_device(*input, "input");
    const auto* q = static_cast<const uint8_t*>(input->data);
    const auto* s = static_cast<const float*>(scale_inv->data);
    const int64_t n = numel(*input);
    TE_DISPATCH(*input, cpu::dequantize_fp8(q, input->dtype, s, output->data, output->dtype, n),
                cuda::dequantize_fp8(q, input->dtype, s, output->data, output->dtype, n, stream));
  });
}

// Deprecated aliases (te/cast.h): forward to the new names.
te_status te_quantize_fp8_current_scaling(const te_tensor* input, te_tensor* rowwise,
                                          te_tensor* columnwise, te_tensor* scale,
                                          te_tensor* scale_inv, te_tensor* amax,
                                          int force_pow2_scales, float amax_epsilon,
                                          te_stream stream) {
  return te_cast_quantize_fp8_current_scaling(input, rowwise, columnwise, scale, scale_inv, amax,
                                              force_pow2_scales, amax_epsilon, stream);
}

te_status te_quantize_fp8(const te_tensor* input, const te_tensor* scale, te_tensor* rowwise,
                          te_tensor* columnwise, te_tensor* scale_inv, te_tensor* amax,
                          te_stream stream) {
  return te_cast_quantize_fp8(input, scale, rowwise, columnwise, scale_inv, amax, stream);
}

te_status te_compute_scale_from_amax(const te_tensor* amax, te_tensor* scale, te_tensor* scale_inv,
                                     te_dtype fp8_dtype, int force_pow2_scales, float amax_epsilon,
                                     te_stream stream) {
  return te_cast_compute_scale_from_amax(amax, scale, scale_inv, fp8_dtype, force_pow2_scales,
                                         amax_epsilon, stream);
}

te_status te_compute_amax(const te_tensor* input, te_tensor* amax, te_stream stream) {
  return te_cast_compute_amax(input, amax, stream);
}

te_status te_dequantize_fp8(const te_tensor* input, const te_tensor* scale_inv, te_tensor* output,
                            te_stream stream) {
  return te_cast_dequantize_fp8(input, scale_inv, output, stream);
}
}  // extern "C"
