#include "runtime/device.h"
#include "runtime/tensor.h"
#include "te/transpose.h"
#include "transpose/backend.h"

using namespace te;

extern "C" te_status te_transpose(const te_tensor* input, te_tensor* output, te_stream stream) {
  return guarded("te_transpose", [&] {
    Arg in(input, "input");
    const int bits = dtype_bits(input->dtype);
    if (bits != 8 && bits != 16 && bits != 32 && bits != 64)
      fail(TE_ERROR_INVALID_DTYPE, "argument 'input' must have 1-, 2-, 4- or 8-byte elements, got ",
           dtype_name(input->dtype), " (packed FP4 data cannot be transposed element-wise)");
    const int64_t rows = leading_rows(*input), cols = last_dim(*input);
    Arg out(output, "output");
    out.output().dtype(input->dtype).same_device(*input, "input");
    if (output->ndim != 2 || output->shape[0] != cols || output->shape[1] != rows)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument 'output' must have shape [", cols, ", ", rows,
           "], got ", shape_string(*output));
    TE_DISPATCH(
        *input, transpose::cpu::transpose(input->data, output->data, rows, cols, bits / 8),
        transpose::cuda::transpose(input->data, output->data, rows, cols, bits / 8, stream));
  });
}
