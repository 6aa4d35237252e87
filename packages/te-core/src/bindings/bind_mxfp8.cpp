// Bindings of the MXFP8 family (te/mxfp8.h) and of the block-scale swizzle
// (te/swizzle.h) it uses, which NVFP4 shares.
#include <utility>

#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

void bind_mxfp8(nb::module_& m) {
  m.def(
      "quantize_mxfp8",
      [](TensorDesc& input, Opt rowwise, Opt rowwise_scale_inv, Opt columnwise,
         Opt columnwise_scale_inv, bool use_2d_blocks, bool swizzled_scales, uintptr_t stream) {
        call([&] {
          return te_mxfp8_quantize(&input.t, opt(rowwise), opt(rowwise_scale_inv), opt(columnwise),
                                   opt(columnwise_scale_inv), use_2d_blocks, swizzled_scales,
                                   as_stream(stream));
        });
      },
      nb::arg("input"), nb::arg("rowwise").none(), nb::arg("rowwise_scale_inv").none(),
      nb::arg("columnwise").none(), nb::arg("columnwise_scale_inv").none(),
      nb::arg("use_2d_blocks") = false, nb::arg("swizzled_scales") = false, nb::arg("stream") = 0);

  m.def(
      "dequantize_mxfp8",
      [](TensorDesc& input, TensorDesc& scale_inv, TensorDesc& output, bool columnwise,
         bool swizzled_scales, uintptr_t stream) {
        call([&] {
          return te_mxfp8_dequantize(&input.t, &scale_inv.t, &output.t, columnwise, swizzled_scales,
                                     as_stream(stream));
        });
      },
      nb::arg("input"), nb::arg("scale_inv"), nb::arg("output"), nb::arg("columnwise") = false,
      nb::arg("swizzled_scales") = false, nb::arg("stream") = 0);

  // swizzle_block_scales and its inverse share one signature.
  using SwizzleFn = te_status (*)(const te_tensor*, te_tensor*, int, te_stream);
  const std::pair<const char*, SwizzleFn> swizzles[] = {
      {"swizzle_block_scales", &te_swizzle_block_scales},
      {"unswizzle_block_scales", &te_swizzle_block_scales_inverse}};
  for (const auto& [name, fn] : swizzles) {
    m.def(
        name,
        [fn](TensorDesc& input, TensorDesc& output, bool columnwise, uintptr_t stream) {
          call([&] { return fn(&input.t, &output.t, columnwise, as_stream(stream)); });
        },
        nb::arg("input"), nb::arg("output"), nb::arg("columnwise") = false, nb::arg("stream") = 0);
  }
}

}  // namespace te_py
