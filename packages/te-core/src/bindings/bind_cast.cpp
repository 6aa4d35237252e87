#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

void bind_cast(nb::module_& m) {
  m.def(
      "quantize_fp8",
      [](TensorDesc& input, TensorDesc& scale, Opt rowwise, Opt columnwise, Opt scale_inv, Opt amax,
         uintptr_t stream) {
        call([&] {
          return te_cast_quantize_fp8(&input.t, &scale.t, opt(rowwise), opt(columnwise),
                                      opt(scale_inv), opt(amax), as_stream(stream));
        });
      },
      nb::arg("input"), nb::arg("scale"), nb::arg("rowwise").none(), nb::arg("columnwise").none(),
      nb::arg("scale_inv").none(), nb::arg("amax").none(), nb::arg("stream") = 0);

  m.def(
      "compute_amax",
      [](TensorDesc& input, TensorDesc& amax, uintptr_t stream) {
        call([&] { return te_cast_compute_amax(&input.t, &amax.t, as_stream(stream)); });
      },
      nb::arg("input"), nb::arg("amax"), nb::arg("stream") = 0);

  m.def(
      "compute_scale_from_amax",
      [](TensorDesc& amax, TensorDesc& scale, Opt scale_inv, int fp8_dtype, bool force_pow2,
         float epsilon, uintptr_t stream) {
        call([&] {
          return te_cast_compute_scale_from_amax(&amax.t, &scale.t, opt(scale_inv),
                                                 static_cast<te_dtype>(fp8_dtype), force_pow2,
                                                 epsilon, as_stream(stream));
        });
      },
      nb::arg("amax"), nb::arg("scale"), nb::arg("scale_inv").none(), nb::arg("fp8_dtype"),
      nb::arg("force_pow2_scales") = false, nb::arg("amax_epsilon") = 0.0f, nb::arg("stream") = 0);

  m.def(
      "quantize_fp8_current_scaling",
      [](TensorDesc& input, Opt rowwise, Opt columnwise, TensorDesc& scale, TensorDesc& scale_inv,
         TensorDesc& amax, bool force_pow2, float epsilon, uintptr_t stream) {
        call([&] {
          return te_cast_quantize_fp8_current_scaling(&input.t, opt(rowwise), opt(columnwise),
                                                      &scale.t, &scale_inv.t, &amax.t, force_pow2,
                                                      epsilon, as_stream(stream));
        });
      },
      nb::arg("input"), nb::arg("rowwise").none(), nb::arg("columnwise").none(), nb::arg("scale"),
      nb::arg("scale_inv"), nb::arg("amax"), nb::arg("force_pow2_scales") = false,
      nb::arg("amax_epsilon") = 0.0f, nb::arg("stream") = 0);

  m.def(
      "dequantize_fp8",
      [](TensorDesc& input, TensorDesc& scale_inv, TensorDesc& output, uintptr_t stream) {
        call([&] {
          return te_cast_dequantize_fp8(&input.t, &scale_inv.t, &output.t, as_stream(stream));
        });
      },
      nb::arg("input"), nb::arg("scale_inv"), nb::arg("output"), nb::arg("stream") = 0);
}

}  // namespace te_py
