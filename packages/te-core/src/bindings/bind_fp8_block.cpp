// Bindings of te/fp8_block.h: one function per C entry point, GIL released.
#include <nanobind/stl/pair.h>

#include <utility>

#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

void bind_fp8_block(nb::module_& m) {
  m.def(
      "fp8_block_scale_shape",
      [](int64_t rows, int64_t cols, int block_dim, int layout, bool columnwise) {
        int64_t shape[2] = {0, 0};
        call([&] {
          return te_fp8_block_scale_shape(rows, cols, static_cast<te_fp8_block_dim>(block_dim),
                                          static_cast<te_fp8_block_layout>(layout), columnwise,
                                          shape);
        });
        return std::make_pair(shape[0], shape[1]);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("block_dim"), nb::arg("layout"),
      nb::arg("columnwise"));

  m.def(
      "fp8_block_quantize",
      [](TensorDesc& input, Opt rowwise, Opt rowwise_scale_inv, Opt columnwise,
         Opt columnwise_scale_inv, int block_dim, int layout, bool force_pow2, float epsilon,
         uintptr_t stream) {
        call([&] {
          return te_fp8_block_quantize(
              &input.t, opt(rowwise), opt(rowwise_scale_inv), opt(columnwise),
              opt(columnwise_scale_inv), static_cast<te_fp8_block_dim>(block_dim),
              static_cast<te_fp8_block_layout>(layout), force_pow2, epsilon, as_stream(stream));
        });
      },
      nb::arg("input"), nb::arg("rowwise").none(), nb::arg("rowwise_scale_inv").none(),
      nb::arg("columnwise").none(), nb::arg("columnwise_scale_inv").none(), nb::arg("block_dim"),
      nb::arg("layout") = 0, nb::arg("force_pow2_scales") = true, nb::arg("amax_epsilon") = 0.0f,
      nb::arg("stream") = 0);

  m.def(
      "fp8_block_dequantize",
      [](TensorDesc& data, TensorDesc& scale_inv, TensorDesc& output, int block_dim, int layout,
         bool columnwise, uintptr_t stream) {
        call([&] {
          return te_fp8_block_dequantize(
              &data.t, &scale_inv.t, &output.t, static_cast<te_fp8_block_dim>(block_dim),
              static_cast<te_fp8_block_layout>(layout), columnwise, as_stream(stream));
        });
      },
      nb::arg("data"), nb::arg("scale_inv"), nb::arg("output"), nb::arg("block_dim"),
      nb::arg("layout") = 0, nb::arg("columnwise") = false, nb::arg("stream") = 0);

  m.def(
      "fp8_block_transpose_2d",
      [](TensorDesc& rowwise, TensorDesc& rowwise_scale_inv, TensorDesc& columnwise,
         TensorDesc& columnwise_scale_inv, int layout, uintptr_t stream) {
        call([&] {
          return te_fp8_block_transpose_2d(
              &rowwise.t, &rowwise_scale_inv.t, &columnwise.t, &columnwise_scale_inv.t,
              static_cast<te_fp8_block_layout>(layout), as_stream(stream));
        });
      },
      nb::arg("rowwise"), nb::arg("rowwise_scale_inv"), nb::arg("columnwise"),
      nb::arg("columnwise_scale_inv"), nb::arg("layout") = 0, nb::arg("stream") = 0);
}

}  // namespace te_py
