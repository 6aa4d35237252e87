// C entry points of the MXFP8 family: validate once, then run the backend of the
// input's device.
#include "mxfp8/backend.h"
#include "mxfp8/numerics.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "te/mxfp8.h"

namespace te::mxfp8 {
namespace {

// Element-type checks with the argument's name in the message.
void require_high_precision(const te_tensor& t, const char* name) {
  if (!is_high_precision_float(t.dtype))
    fail(TE_ERROR_INVALID_DTYPE, "argument '", name, "' must be float32, bfloat16 or float16, got ",
         dtype_name(t.dtype));
}
void require_fp8(const te_tensor& t, const char* name) {
  if (!is_fp8(t.dtype))
    fail(TE_ERROR_INVALID_DTYPE, "argument '", name, "' must be float8_e4m3 or float8_e5m2, got ",
         dtype_name(t.dtype));
}

// The MXFP8 shape rules on the [M, K] view of t (named `name`).
void check_mxfp8_shape(const te_tensor& t, const char* name, bool rows_in_blocks,
                       const char* why_rows) {
  if (t.ndim < 2)
    fail(TE_ERROR_INVALID_ARGUMENT, "MXFP8 needs an input of at least 2 dimensions, got '", name,
         "' of shape ", shape_string(t));
  if (last_dim(t) % kBlock != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "MXFP8 needs the last dimension divisible by 32, got ",
         last_dim(t), " (argument '", name, "' of shape ", shape_string(t), ")");
  if (rows_in_blocks && leading_rows(t) % kBlock != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "MXFP8 ", why_rows,
         " need the product of the leading dimensions of '", name, "' divisible by 32, got ",
         leading_rows(t), " (shape ", shape_string(t), ")");
}

// An E8M0 scale buffer of exactly [rows, cols].
void check_scales(const te_tensor* t, const char* name, int64_t rows, int64_t cols,
                  const char* what, const te_tensor& data) {
  Arg(t, name).dtype(TE_DTYPE_FLOAT8E8M0).same_device(data, "input");
  if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have shape [", rows, ", ", cols,
         "] (", what, " E8M0 scales of an [M, K] = [", leading_rows(data), ", ", last_dim(data),
         "] tensor, padded), got ", shape_string(*t));
}

// Data and scales of one direction: both or neither.
bool check_pair(const te_tensor* data, const char* data_name, const te_tensor* scales,
                const char* scale_name) {
  if ((data == nullptr) != (scales == nullptr))
    fail(TE_ERROR_INVALID_ARGUMENT, "arguments '", data_name, "' and '", scale_name,
         "' must be given together (got only '", data ? data_name : scale_name, "')");
  return data != nullptr;
}

QuantizeArgs check_quantize(const te_tensor* input, te_tensor* rowwise, te_tensor* row_scales,
                            te_tensor* columnwise, te_tensor* col_scales, int use_2d_blocks,
                            int swizzled_scales) {
  require_high_precision(Arg(input, "input").get(), "input");
  const bool want_row = check_pair(rowwise, "rowwise", row_scales, "rowwise_scale_inv");
  const bool want_col = check_pair(columnwise, "columnwise", col_scales, "columnwise_scale_inv");
  if (!want_row && !want_col)
    fail(TE_ERROR_INVALID_ARGUMENT, "at least one of 'rowwise' and 'columnwise' must be given");
  const char* why_rows = use_2d_blocks ? "2-D (32x32) blocks" : "columnwise (32x1) blocks";
  check_mxfp8_shape(*input, "input", want_col || use_2d_blocks, why_rows);

  QuantizeArgs a{};
  a.input = input->data;
  a.input_dtype = input->dtype;
  a.rows = leading_rows(*input);
  a.cols = last_dim(*input);
  a.use_2d_blocks = use_2d_blocks != 0;
  a.swizzled = swizzled_scales != 0;
  if (want_row) {
    require_fp8(Arg(rowwise, "rowwise").get(), "rowwise");
    Arg(rowwise, "rowwise").same_shape(*input, "input").same_device(*input, "input");
    rowwise_scale_shape(a.rows, a.cols, &a.row_scale_rows, &a.row_scale_cols);
    check_scales(row_scales, "rowwise_scale_inv", a.row_scale_rows, a.row_scale_cols, "rowwise",
                 *input);
    mark_written(rowwise);
    mark_written(row_scales);
    a.rowwise = static_cast<uint8_t*>(rowwise->data);
    a.rowwise_scales = static_cast<uint8_t*>(row_scales->data);
    a.fp8_dtype = rowwise->dtype;
  }
  if (want_col) {
    require_fp8(Arg(columnwise, "columnwise").get(), "columnwise");
    Arg(columnwise, "columnwise").same_shape(*input, "input").same_device(*input, "input");
    if (want_row && columnwise->dtype != rowwise->dtype)
      fail(TE_ERROR_INVALID_DTYPE,
           "arguments 'rowwise' and 'columnwise' must have the same FP8 "
           "type, got ",
           dtype_name(rowwise->dtype), " and ", dtype_name(columnwise->dtype));
    columnwise_scale_shape(a.rows, a.cols, &a.col_scale_rows, &a.col_scale_cols);
    check_scales(col_scales, "columnwise_scale_inv", a.col_scale_rows, a.col_scale_cols,
                 "columnwise", *input);
    mark_written(columnwise);
    mark_written(col_scales);
    a.columnwise = static_cast<uint8_t*>(columnwise->data);
    a.columnwise_scales = static_cast<uint8_t*>(col_scales->data);
    a.fp8_dtype = columnwise->dtype;
  }
  return a;
}

DequantizeArgs check_dequantize(const te_tensor* input, const te_tensor* scale_inv,
                                te_tensor* output, int columnwise, int swizzled_scales) {
  require_fp8(Arg(input, "input").get(), "input");
  check_mxfp8_shape(*input, "input", columnwise != 0, "columnwise (32x1) blocks");
  DequantizeArgs a{};
  a.input = static_cast<const uint8_t*>(input->data);
  a.fp8_dtype = input->dtype;
  a.rows = leading_rows(*input);
  a.cols = last_dim(*input);
  a.columnwise = columnwise != 0;
  a.swizzled = swizzled_scales != 0;
  if (a.columnwise) {
    columnwise_scale_shape(a.rows, a.cols, &a.scale_rows, &a.scale_cols);
  } else {
    rowwise_scale_shape(a.rows, a.cols, &a.scale_rows, &a.scale_cols);
  }
  check_scales(scale_inv, "scale_inv", a.scale_rows, a.scale_cols,
               a.columnwise ? "columnwise" : "rowwise", *input);
  a.scales = static_cast<const uint8_t*>(scale_inv->data);
  require_high_precision(Arg(output, "output").get(), "output");
  Arg(output, "output").output().same_shape(*input, "input").same_device(*input, "input");
  a.output = output->data;
  a.output_dtype = output->dtype;
  return a;
}

}  // namespace
}  // namespace te::mxfp8

using namespace te;
using namespace te::mxfp8;

extern "C" {

te_status te_mxfp8_quantize(const te_tensor* input, te_tensor* rowwise,
                            te_tensor* rowwise_scale_inv, te_tensor* columnwise,
                            te_tensor* columnwise_scale_inv, int use_2d_blocks, int swizzled_scales,
                            te_stream stream) {
  return guarded("te_mxfp8_quantize", [&] {
    const QuantizeArgs args = check_quantize(input, rowwise, rowwise_scale_inv, columnwise,
                                             columnwise_scale_inv, use_2d_blocks, swizzled_scales);
    TE_DISPATCH(*input, cpu::quantize(args), cuda::quantize(args, stream));
  });
}

te_status te_mxfp8_dequantize(const te_tensor* input, const te_tensor* scale_inv, te_tensor* output,
                              int columnwise, int swizzled_scales, te_stream stream) {
  return guarded("te_mxfp8_dequantize", [&] {
    const DequantizeArgs args =
        check_dequantize(input, scale_inv, output, columnwise, swizzled_scales);
    TE_DISPATCH(*input, cpu::dequantize(args), cuda::dequantize(args, stream));
  });
}

// Deprecated aliases (te/mxfp8.h): forward to the new names.
te_status te_quantize_mxfp8(const te_tensor* input, te_tensor* rowwise,
                            te_tensor* rowwise_scale_inv, te_tensor* columnwise,
                            te_tensor* columnwise_scale_inv, int use_2d_blocks, int swizzled_scales,
                            te_stream stream) {
  return te_mxfp8_quantize(input, rowwise, rowwise_scale_inv, columnwise, columnwise_scale_inv,
                           use_2d_blocks, swizzled_scales, stream);
}

te_status te_dequantize_mxfp8(const te_tensor* input, const te_tensor* scale_inv, te_tensor* output,
                              int columnwise, int swizzled_scales, te_stream stream) {
  return te_mxfp8_dequantize(input, scale_inv, output, columnwise, swizzled_scales, stream);
}
}  // extern "C"
