// C entry points of the swizzle family: validate once, then run the backend of
// the input's device.
#include "runtime/device.h"
#include "runtime/tensor.h"
#include "swizzle/backend.h"
#include "swizzle/layout.h"
#include "te/swizzle.h"

namespace te::swizzle {
namespace {

SwizzleArgs check_swizzle(const te_tensor* input, te_tensor* output, int columnwise,
                          bool unswizzle) {
  Arg in(input, "input");
  in.dtype_in({TE_DTYPE_BYTE, TE_DTYPE_FLOAT8E4M3, TE_DTYPE_FLOAT8E5M2, TE_DTYPE_FLOAT8E8M0},
              "a one-byte type (byte, float8_e4m3, float8_e5m2 or float8_e8m0)");
  if (input->ndim != 2)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'input' must be a 2-D scale matrix, got shape ",
         shape_string(*input));
  const int64_t rows = input->shape[0], cols = input->shape[1];
  const int64_t row_multiple = columnwise ? kTileCols : kTileRows;
  const int64_t col_multiple = columnwise ? kTileRows : kTileCols;
  if (rows % row_multiple != 0 || cols % col_multiple != 0)
    fail(TE_ERROR_INVALID_ARGUMENT, columnwise ? "columnwise" : "rowwise",
         " block scales must be padded to rows % ", row_multiple, " == 0 and columns % ",
         col_multiple, " == 0, got argument 'input' of shape ", shape_string(*input));
  Arg(output, "output")
      .output()
      .dtype(input->dtype)
      .same_shape(*input, "input")
      .same_device(*input, "input");
  const auto* in_bytes = static_cast<const uint8_t*>(input->data);
  auto* out_bytes = static_cast<uint8_t*>(output->data);
  // (That 'output' does not overlap 'input' is the shared rule: TE_DISPATCH.)
  return SwizzleArgs{in_bytes, out_bytes, rows, cols, columnwise != 0, unswizzle};
}

te_status run(const char* name, const te_tensor* input, te_tensor* output, int columnwise,
              bool unswizzle, te_stream stream) {
  return guarded(name, [&] {
    const SwizzleArgs args = check_swizzle(input, output, columnwise, unswizzle);
    if (args.rows * args.cols == 0) return;
    TE_DISPATCH(*input, cpu::swizzle(args), cuda::swizzle(args, stream));
  });
}

}  // namespace
}  // namespace te::swizzle

extern "C" {

te_status te_swizzle_block_scales(const te_tensor* input, te_tensor* output, int columnwise,
                                  te_stream stream) {
  return te::swizzle::run("te_swizzle_block_scales", input, output, columnwise, false, stream);
}

te_status te_swizzle_block_scales_inverse(const te_tensor* input, te_tensor* output, int columnwise,
                                          te_stream stream) {
  return te::swizzle::run("te_swizzle_block_scales_inverse", input, output, columnwise, true,
                          stream);
}

// Deprecated aliases (te/swizzle.h): forward to the new names.
te_status te_unswizzle_block_scales(const te_tensor* input, te_tensor* output, int columnwise,
                                    te_stream stream) {
  return te_swizzle_block_scales_inverse(input, output, columnwise, stream);
}
}  // extern "C"
