// C entry points of the NVFP4 family: validate once (messages name the argument
// and the rule), then run the backend of the input's device.
#include <cstdint>

#include "nvfp4/backend.h"
#include "nvfp4/formulas.h"
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "te/nvfp4.h"

namespace te::nvfp4 {
namespace {

// The [M, K] view of a tensor of rank >= 1, with NVFP4's last-dimension rule.
struct MatrixView {
  int64_t rows, cols;
};

MatrixView nvfp4_view(const te_tensor& t, const char* name) {
  if (t.ndim < 1)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name,
         "' must have at least 1 dimension, got a scalar");
  const MatrixView v{leading_rows(t), last_dim(t)};
  if (v.cols % kBlock != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "NVFP4 needs the last dimension of '", name,
         "' divisible by 16, got ", v.cols);
  return v;
}

void require_rows_multiple_of_16(int64_t rows, const char* what) {
  if (rows % kBlock != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "NVFP4 ", what,
         " needs the rows (the product of the leading dimensions) divisible by 16, got ", rows);
}

// An FP4 data tensor that must be the matrix [rows, cols] (2-D) or, when
// like != nullptr, have like's shape.
void check_data(const te_tensor* t, const char* name, int64_t rows, int64_t cols,
                const te_tensor& device_of, const te_tensor* like) {
  Arg a(t, name);
  a.dtype(TE_DTYPE_FLOAT4E2M1).same_device(device_of, "input");
  if (like) {
    a.same_shape(*like, "input");
  } else if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have shape [", rows, ", ", cols,
         "] (the input viewed as [M, K], transposed), got ", shape_string(*t));
  }
}

// A scale buffer for data [rows, cols]: E4M3 [roundup(rows,128), roundup(cols/16,4)].
ScaleShape check_scale(const te_tensor* t, const char* name, int64_t rows, int64_t cols,
                       const te_tensor& device_of, const char* device_name) {
  const ScaleShape s = scale_shape(rows, cols);
  Arg a(t, name);
  a.dtype(TE_DTYPE_FLOAT8E4M3).same_device(device_of, device_name);
  if (t->ndim != 2 || t->shape[0] != s.rows || t->shape[1] != s.cols)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have shape [", s.rows, ", ", s.cols,
         "] = [roundup(", rows, ", 128), roundup(", cols, "/16, 4)], got ", shape_string(*t));
  return s;
}

float* check_amax(const te_tensor* t, const char* name, const te_tensor& input) {
  Arg(t, name).scalar_fp32().same_device(input, "input");
  return static_cast<float*>(t->data);
}

// Either all of a direction's arguments or none.
bool direction_given(const te_tensor* amax, const te_tensor* data, const te_tensor* scale,
                     const char* amax_name, const char* data_name, const char* scale_name) {
  const int given = (amax != nullptr) + (data != nullptr) + (scale != nullptr);
  if (given != 0 && given != 3)
    fail(TE_ERROR_INVALID_ARGUMENT, "arguments '", amax_name, "', '", data_name, "' and '",
         scale_name, "' must be given together (or all NULL)");
  return given == 3;
}

Options check_options(const te_nvfp4_options* o, const te_tensor& input) {
  Options out;
  if (o == nullptr) return out;
  out.block_2d = o->block_2d != 0;
  out.stochastic_rounding = o->stochastic_rounding != 0;
  out.random_hadamard = o->random_hadamard != 0;
  out.rht_sign_mask = o->rht_sign_mask;
  if (o->rht_sign_mask > 0xFFFFu)
    fail(TE_ERROR_INVALID_ARGUMENT, "option 'rht_sign_mask' must fit in 16 bits, got ",
         static_cast<long long>(o->rht_sign_mask));
  if (out.block_2d && out.random_hadamard)
    fail(TE_ERROR_INVALID_ARGUMENT,
         "NVFP4 2-D (16x16) quantization cannot be combined with the random Hadamard transform "
         "(RHT applies to 1-D columnwise operands only)");
  if (out.stochastic_rounding) {
    if (o->rng_state == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "option 'rng_state' (int64 [2] = seed, offset) is required with stochastic rounding");
    Arg(o->rng_state, "rng_state").dtype(TE_DTYPE_INT64).numel(2).same_device(input, "input");
    out.rng_state = static_cast<const int64_t*>(o->rng_state->data);
  }
  return out;
}

// The CUDA kernels use 16-byte vector accesses.
void check_aligned(const void* p, const char* name) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name,
         "' must be 16-byte aligned for the CUDA NVFP4 kernels");
}

}  // namespace
}  // namespace te::nvfp4

using namespace te;
using namespace te::nvfp4;

extern "C" {

te_status te_nvfp4_compute_amax(const te_tensor* input, te_tensor* amax_rowwise,
                                te_tensor* amax_columnwise, const te_nvfp4_options* options,
                                te_stream stream) {
  return guarded("te_nvfp4_compute_amax", [&] {
    Arg(input, "input").dtype_in(kHighPrecision, kHighPrecisionText);
    const MatrixView v = nvfp4_view(*input, "input");
    Options opt = check_options(options, *input);
    if (amax_rowwise == nullptr && amax_columnwise == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "at least one of 'amax_rowwise' and 'amax_columnwise' must be given");
    float* row = nullptr;
    float* col = nullptr;
    if (amax_rowwise) row = check_amax(amax_rowwise, "amax_rowwise", *input);
    mark_written(amax_rowwise);  // (outputs here; inputs of te_nvfp4_quantize)
    if (amax_columnwise) {
      col = check_amax(amax_columnwise, "amax_columnwise", *input);
      mark_written(amax_columnwise);
      if (opt.random_hadamard) require_rows_multiple_of_16(v.rows, "random Hadamard transform");
    }
    if (on_cuda(*input)) check_aligned(input->data, "input");
    TE_DISPATCH(
        *input, cpu::compute_amax(input->data, input->dtype, v.rows, v.cols, row, col, opt),
        cuda::compute_amax(input->data, input->dtype, v.rows, v.cols, row, col, opt, stream));
  });
}

te_status te_nvfp4_quantize(const te_tensor* input, const te_tensor* amax_rowwise,
                            te_tensor* rowwise, te_tensor* rowwise_scale,
                            const te_tensor* amax_columnwise, te_tensor* columnwise,
                            te_tensor* columnwise_scale, const te_nvfp4_options* options,
                            te_stream stream) {
  return guarded("te_nvfp4_quantize", [&] {
    Arg(input, "input").dtype_in(kHighPrecision, kHighPrecisionText);
    const MatrixView v = nvfp4_view(*input, "input");
    QuantizeArgs args{};
    args.input = input->data;
    args.input_dtype = input->dtype;
    args.rows = v.rows;
    args.cols = v.cols;
    args.options = check_options(options, *input);
    const bool row = direction_given(amax_rowwise, rowwise, rowwise_scale, "amax_rowwise",
                                     "rowwise", "rowwise_scale");
    const bool col = direction_given(amax_columnwise, columnwise, columnwise_scale,
                                     "amax_columnwise", "columnwise", "columnwise_scale");
    if (!row && !col)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "at least one direction (rowwise or columnwise) must be requested");
    if (args.options.block_2d) require_rows_multiple_of_16(v.rows, "2-D (16x16) quantization");
    if (row) {
      check_data(rowwise, "rowwise", v.rows, v.cols, *input, input);
      const ScaleShape s =
          check_scale(rowwise_scale, "rowwise_scale", v.rows, v.cols, *input, "input");
      mark_written(rowwise);
      mark_written(rowwise_scale);
      args.rowwise = Direction{static_cast<uint8_t*>(rowwise->data),
                               static_cast<uint8_t*>(rowwise_scale->data), s.rows, s.cols,
                               check_amax(amax_rowwise, "amax_rowwise", *input)};
    }
    if (col) {
      require_rows_multiple_of_16(v.rows, "columnwise quantization");
      check_data(columnwise, "columnwise", v.cols, v.rows, *input, nullptr);
      const ScaleShape s =
          check_scale(columnwise_scale, "columnwise_scale", v.cols, v.rows, *input, "input");
      mark_written(columnwise);
      mark_written(columnwise_scale);
      args.columnwise = Direction{static_cast<uint8_t*>(columnwise->data),
                                  static_cast<uint8_t*>(columnwise_scale->data), s.rows, s.cols,
                                  check_amax(amax_columnwise, "amax_columnwise", *input)};
    }
    if (on_cuda(*input)) {
      check_aligned(input->data, "input");
      if (row) check_aligned(rowwise->data, "rowwise");
      if (col) check_aligned(columnwise->data, "columnwise");
    }
    TE_DISPATCH(*input, cpu::quantize(args), cuda::quantize(args, stream));
  });
}

te_status te_nvfp4_dequantize(const te_tensor* data, const te_tensor* scale, const te_tensor* amax,
                              te_tensor* output, te_stream stream) {
  return guarded("te_nvfp4_dequantize", [&] {
    Arg(data, "data").dtype(TE_DTYPE_FLOAT4E2M1);
    const MatrixView v = nvfp4_view(*data, "data");
    const ScaleShape s = check_scale(scale, "scale", v.rows, v.cols, *data, "data");
    Arg(amax, "amax").scalar_fp32().same_device(*data, "data");
    Arg(output, "output")
        .output()
        .dtype_in(kHighPrecision, kHighPrecisionText)
        .same_shape(*data, "data")
        .same_device(*data, "data");
    if (on_cuda(*data)) {
      check_aligned(data->data, "data");
      check_aligned(output->data, "output");
    }
    const DequantizeArgs args{static_cast<const uint8_t*>(data->data),
                              static_cast<const uint8_t*>(scale->data),
                              v.rows,
                              v.cols,
                              s.cols,
                              static_cast<const float*>(amax->data),
                              output->data,
                              output->dtype};
    TE_DISPATCH(*data, cpu::dequantize(args), cuda::dequantize(args, stream));
  });
}

te_status te_nvfp4_transpose_2d(const te_tensor* rowwise, const te_tensor* rowwise_scale,
                                te_tensor* columnwise, te_tensor* columnwise_scale,
                                te_stream stream) {
  return guarded("te_nvfp4_transpose_2d", [&] {
    Arg(rowwise, "rowwise").dtype(TE_DTYPE_FLOAT4E2M1);
    const MatrixView v = nvfp4_view(*rowwise, "rowwise");
    require_rows_multiple_of_16(v.rows, "2-D (16x16) data transpose");
    const ScaleShape rs =
        check_scale(rowwise_scale, "rowwise_scale", v.rows, v.cols, *rowwise, "rowwise");
    Arg col(columnwise, "columnwise");
    col.output().dtype(TE_DTYPE_FLOAT4E2M1).same_device(*rowwise, "rowwise");
    if (columnwise->ndim != 2 || columnwise->shape[0] != v.cols || columnwise->shape[1] != v.rows)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'columnwise' must have shape [", v.cols, ", ",
           v.rows, "] (rowwise viewed as [M, K], transposed), got ", shape_string(*columnwise));
    const ScaleShape cs =
        check_scale(columnwise_scale, "columnwise_scale", v.cols, v.rows, *rowwise, "rowwise");
    mark_written(columnwise_scale);
    if (on_cuda(*rowwise)) {
      check_aligned(rowwise->data, "rowwise");
      check_aligned(columnwise->data, "columnwise");
    }
    const TransposeArgs args{static_cast<const uint8_t*>(rowwise->data),
                             static_cast<const uint8_t*>(rowwise_scale->data),
                             v.rows,
                             v.cols,
                             rs.cols,
                             static_cast<uint8_t*>(columnwise->data),
                             static_cast<uint8_t*>(columnwise_scale->data),
                             cs.rows,
                             cs.cols};
    TE_DISPATCH(*rowwise, cpu::transpose_2d(args), cuda::transpose_2d(args, stream));
  });
}

}  // extern "C"
