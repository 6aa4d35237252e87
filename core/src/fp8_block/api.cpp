// C entry points of the FP8-block family: validate once (every message names
// the argument and the rule), then run the backend of the input's device.
#include "fp8_block/backend.h"
#include "runtime/device.h"
#include "runtime/element.h"
#include "runtime/tensor.h"
#include "te/fp8_block.h"

namespace te::fp8_block {
namespace {

// K % 16: FP8 GEMMs need it, and the CUDA kernels move 16-byte vectors.
constexpr int64_t kColsMultiple = 16;

void check_options(te_fp8_block_dim dim, te_fp8_block_layout layout) {
  if (dim != TE_FP8_BLOCK_1D && dim != TE_FP8_BLOCK_2D)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'block_dim' must be 1 (1x128 blocks) or 2 "
         "(128x128 blocks), got ",
         static_cast<int>(dim));
  if (layout != TE_FP8_BLOCK_GEMM_READY && layout != TE_FP8_BLOCK_COMPACT)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'layout' must be TE_FP8_BLOCK_GEMM_READY (0) or "
         "TE_FP8_BLOCK_COMPACT (1), got ",
         static_cast<int>(layout));
}

const char* describe(te_fp8_block_dim dim, te_fp8_block_layout layout, bool columnwise) {
  static const char* names[2][2][2] = {{{"1-D GEMM-ready rowwise", "1-D GEMM-ready columnwise"},
                                        {"1-D compact rowwise", "1-D compact columnwise"}},
                                       {{"2-D GEMM-ready rowwise", "2-D GEMM-ready columnwise"},
                                        {"2-D compact rowwise", "2-D compact columnwise"}}};
  return names[dim == TE_FP8_BLOCK_2D][layout == TE_FP8_BLOCK_COMPACT][columnwise];
}

// An FP32 scale tensor whose matrix view is exactly the map's shape.
float* check_scales(const te_tensor* t, const char* name, const ScaleMap& map,
                    const te_tensor& data, const char* data_name, int64_t rows, int64_t cols,
                    const char* what) {
  Arg arg(t, name);
  arg.dtype(TE_DTYPE_FLOAT32).same_device(data, data_name);
  if (t->ndim == 0 || leading_rows(*t) != map.shape0 || last_dim(*t) != map.shape1)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have shape [", map.shape0, ", ",
         map.shape1, "] (", what, " scales of a [", rows, ", ", cols, "] tensor), got ",
         shape_string(*t));
  return static_cast<float*>(t->data);
}

// Columnwise FP8 data: [K, M] (GEMM-ready) or the rowwise shape (compact).
void check_columnwise_shape(const te_tensor* col, const te_tensor& like, const char* like_name,
                            int64_t m, int64_t k, te_fp8_block_layout layout) {
  if (layout == TE_FP8_BLOCK_COMPACT) {
    Arg(col, "columnwise").same_shape(like, like_name);
  } else if (col->ndim != 2 || col->shape[0] != k || col->shape[1] != m) {
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'columnwise' must have shape [", k, ", ", m,
         "] (GEMM-ready columnwise data is the [M, K] = [", m, ", ", k, "] view transposed), got ",
         shape_string(*col));
  }
}

void check_same_fp8(const te_tensor& a, const te_tensor& b) {
  if (a.dtype != b.dtype)
    fail(TE_ERROR_INVALID_DTYPE,
         "arguments 'rowwise' and 'columnwise' must have the same FP8 "
         "type, got ",
         dtype_name(a.dtype), " and ", dtype_name(b.dtype));
}

QuantizeArgs check_quantize(const te_tensor* input, te_tensor* rowwise, te_tensor* row_scales,
                            te_tensor* columnwise, te_tensor* col_scales, te_fp8_block_dim dim,
                            te_fp8_block_layout layout, float epsilon) {
  Arg(input, "input").dtype_in(kHighPrecision, kHighPrecisionText);
  check_options(dim, layout);
  if (!(epsilon >= 0.0f))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'amax_epsilon' must be >= 0, got ", epsilon);
  if (input->ndim == 0)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "argument 'input' must have at least 1 dimension, got a "
         "scalar");
  const int64_t m = leading_rows(*input), k = last_dim(*input);
  if (k % kColsMultiple != 0)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "FP8 block scaling needs the last dimension of 'input' "
         "divisible by ",
         kColsMultiple, ", got ", k);
  if (rowwise == nullptr && columnwise == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "at least one of 'rowwise' and 'columnwise' must be given");

  QuantizeArgs args{};
  args.input = input->data;
  args.input_dtype = input->dtype;
  args.rows = m;
  args.cols = k;
  args.dim = dim;
  args.layout = layout;
  if (rowwise) {
    Arg(rowwise, "rowwise")
        .output()
        .dtype_in(kFp8, kFp8Text)
        .same_shape(*input, "input")
        .same_device(*input, "input");
    if (row_scales == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'rowwise_scale_inv' is required with 'rowwise'");
    args.rowwise_map = output_scale_map(m, k, dim, layout, false);
    args.rowwise_scale_inv = check_scales(row_scales, "rowwise_scale_inv", args.rowwise_map, *input,
                                          "input", m, k, describe(dim, layout, false));
    mark_written(row_scales);
    args.rowwise = static_cast<uint8_t*>(rowwise->data);
    args.fp8_dtype = rowwise->dtype;
  }
  if (columnwise) {
    Arg(columnwise, "columnwise").output().dtype_in(kFp8, kFp8Text).same_device(*input, "input");
    check_columnwise_shape(columnwise, *input, "input", m, k, layout);
    if (rowwise) check_same_fp8(*rowwise, *columnwise);
    if (col_scales == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "argument 'columnwise_scale_inv' is required with "
           "'columnwise'");
    args.columnwise_map = output_scale_map(m, k, dim, layout, true);
    args.columnwise_scale_inv =
        check_scales(col_scales, "columnwise_scale_inv", args.columnwise_map, *input, "input", m, k,
                     describe(dim, layout, true));
    mark_written(col_scales);
    args.columnwise = static_cast<uint8_t*>(columnwise->data);
    args.fp8_dtype = columnwise->dtype;
  }
  return args;
}

}  // namespace
}  // namespace te::fp8_block

using namespace te;
using namespace te::fp8_block;

extern "C" {

te_status te_fp8_block_scale_shape(int64_t rows, int64_t cols, te_fp8_block_dim block_dim,
                                   te_fp8_block_layout layout, int columnwise, int64_t shape[2]) {
  return guarded("te_fp8_block_scale_shape", [&] {
    check_options(block_dim, layout);
    if (rows < 0 || cols < 0)
      fail(TE_ERROR_INVALID_ARGUMENT, "arguments 'rows' and 'cols' must be >= 0, got ", rows,
           " and ", cols);
    if (shape == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'shape' is required (got NULL)");
    const ScaleMap map = output_scale_map(rows, cols, block_dim, layout, columnwise != 0);
    shape[0] = map.shape0;
    shape[1] = map.shape1;
  });
}

te_status te_fp8_block_quantize(const te_tensor* input, te_tensor* rowwise,
                                te_tensor* rowwise_scale_inv, te_tensor* columnwise,
                                te_tensor* columnwise_scale_inv, te_fp8_block_dim block_dim,
                                te_fp8_block_layout layout, int force_pow2_scales,
                                float amax_epsilon, te_stream stream) {
  return guarded("te_fp8_block_quantize", [&] {
    QuantizeArgs args = check_quantize(input, rowwise, rowwise_scale_inv, columnwise,
                                       columnwise_scale_inv, block_dim, layout, amax_epsilon);
    args.force_pow2 = force_pow2_scales != 0;
    args.epsilon = amax_epsilon;
    TE_DISPATCH(*input, cpu::quantize(args), cuda::quantize(args, stream));
  });
}

te_status te_fp8_block_dequantize(const te_tensor* data, const te_tensor* scale_inv,
                                  te_tensor* output, te_fp8_block_dim block_dim,
                                  te_fp8_block_layout layout, int columnwise, te_stream stream) {
  return guarded("te_fp8_block_dequantize", [&] {
    Arg(data, "data").dtype_in(kFp8, kFp8Text);
    check_options(block_dim, layout);
    if (data->ndim == 0)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "argument 'data' must have at least 1 dimension, got a "
           "scalar");
    Arg(output, "output")
        .output()
        .dtype_in(kHighPrecision, kHighPrecisionText)
        .same_shape(*data, "data")
        .same_device(*data, "data");
    DequantizeArgs args{};
    args.rows = leading_rows(*data);
    args.cols = last_dim(*data);
    args.map = scale_map(args.rows, args.cols, block_dim, layout, columnwise != 0);
    args.scale_inv = check_scales(scale_inv, "scale_inv", args.map, *data, "data", args.rows,
                                  args.cols, describe(block_dim, layout, columnwise != 0));
    args.data = static_cast<const uint8_t*>(data->data);
    args.fp8_dtype = data->dtype;
    args.output = output->data;
    args.output_dtype = output->dtype;
    TE_DISPATCH(*data, cpu::dequantize(args), cuda::dequantize(args, stream));
  });
}

te_status te_fp8_block_transpose_2d(const te_tensor* rowwise, const te_tensor* rowwise_scale_inv,
                                    te_tensor* columnwise, te_tensor* columnwise_scale_inv,
                                    te_fp8_block_layout layout, te_stream stream) {
  return guarded("te_fp8_block_transpose_2d", [&] {
    Arg(rowwise, "rowwise").dtype_in(kFp8, kFp8Text);
    check_options(TE_FP8_BLOCK_2D, layout);
    if (rowwise->ndim == 0)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "argument 'rowwise' must have at least 1 dimension, got a "
           "scalar");
    Transpose2dArgs args{};
    args.rows = leading_rows(*rowwise);
    args.cols = last_dim(*rowwise);
    args.layout = layout;
    args.rowwise_map = output_scale_map(args.rows, args.cols, TE_FP8_BLOCK_2D, layout, false);
    args.columnwise_map = output_scale_map(args.rows, args.cols, TE_FP8_BLOCK_2D, layout, true);
    args.rowwise_scale_inv =
        check_scales(rowwise_scale_inv, "rowwise_scale_inv", args.rowwise_map, *rowwise, "rowwise",
                     args.rows, args.cols, describe(TE_FP8_BLOCK_2D, layout, false));
    Arg(columnwise, "columnwise").output().same_device(*rowwise, "rowwise");
    check_same_fp8(*rowwise, *columnwise);
    check_columnwise_shape(columnwise, *rowwise, "rowwise", args.rows, args.cols, layout);
    args.columnwise_scale_inv =
        check_scales(columnwise_scale_inv, "columnwise_scale_inv", args.columnwise_map, *rowwise,
                     "rowwise", args.rows, args.cols, describe(TE_FP8_BLOCK_2D, layout, true));
    mark_written(columnwise_scale_inv);
    args.rowwise = static_cast<const uint8_t*>(rowwise->data);
    args.columnwise = static_cast<uint8_t*>(columnwise->data);
    TE_DISPATCH(*rowwise, cpu::transpose_2d(args), cuda::transpose_2d(args, stream));
  });
}

}  // extern "C"
