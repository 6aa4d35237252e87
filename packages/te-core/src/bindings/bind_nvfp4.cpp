#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

namespace {

te_nvfp4_options make_options(bool block_2d, bool stochastic_rounding, bool random_hadamard,
                              uint32_t rht_sign_mask, Opt rng_state) {
  te_nvfp4_options o{};
  o.block_2d = block_2d;
  o.stochastic_rounding = stochastic_rounding;
  o.random_hadamard = random_hadamard;
  o.rht_sign_mask = rht_sign_mask;
  o.rng_state = opt(rng_state);
  return o;
}

}  // namespace

void bind_nvfp4(nb::module_& m) {
  m.def(
      "nvfp4_compute_amax",
      [](TensorDesc& input, Opt amax_rowwise, Opt amax_columnwise, bool random_hadamard,
         uint32_t rht_sign_mask, uintptr_t stream) {
        const te_nvfp4_options o = make_options(false, false, random_hadamard, rht_sign_mask, {});
        call([&] {
          return te_nvfp4_compute_amax(&input.t, opt(amax_rowwise), opt(amax_columnwise), &o,
                                       as_stream(stream));
        });
      },
      nb::arg("input"), nb::arg("amax_rowwise").none(), nb::arg("amax_columnwise").none(),
      nb::arg("random_hadamard") = false, nb::arg("rht_sign_mask") = 0, nb::arg("stream") = 0);

  m.def(
      "nvfp4_quantize",
      [](TensorDesc& input, Opt amax_rowwise, Opt rowwise, Opt rowwise_scale, Opt amax_columnwise,
         Opt columnwise, Opt columnwise_scale, bool block_2d, bool stochastic_rounding,
         bool random_hadamard, uint32_t rht_sign_mask, Opt rng_state, uintptr_t stream) {
        const te_nvfp4_options o =
            make_options(block_2d, stochastic_rounding, random_hadamard, rht_sign_mask, rng_state);
        call([&] {
          return te_nvfp4_quantize(&input.t, opt(amax_rowwise), opt(rowwise), opt(rowwise_scale),
                                   opt(amax_columnwise), opt(columnwise), opt(columnwise_scale), &o,
                                   as_stream(stream));
        });
      },
      nb::arg("input"), nb::arg("amax_rowwise").none(), nb::arg("rowwise").none(),
      nb::arg("rowwise_scale").none(), nb::arg("amax_columnwise").none(),
      nb::arg("columnwise").none(), nb::arg("columnwise_scale").none(), nb::arg("block_2d") = false,
      nb::arg("stochastic_rounding") = false, nb::arg("random_hadamard") = false,
      nb::arg("rht_sign_mask") = 0, nb::arg("rng_state").none() = nb::none(),
      nb::arg("stream") = 0);

  m.def(
      "nvfp4_dequantize",
      [](TensorDesc& data, TensorDesc& scale, TensorDesc& amax, TensorDesc& output,
         uintptr_t stream) {
        call([&] {
          return te_nvfp4_dequantize(&data.t, &scale.t, &amax.t, &output.t, as_stream(stream));
        });
      },
      nb::arg("data"), nb::arg("scale"), nb::arg("amax"), nb::arg("output"), nb::arg("stream") = 0);

  m.def(
      "nvfp4_transpose_2d",
      [](TensorDesc& rowwise, TensorDesc& rowwise_scale, TensorDesc& columnwise,
         TensorDesc& columnwise_scale, uintptr_t stream) {
        call([&] {
          return te_nvfp4_transpose_2d(&rowwise.t, &rowwise_scale.t, &columnwise.t,
                                       &columnwise_scale.t, as_stream(stream));
        });
      },
      nb::arg("rowwise"), nb::arg("rowwise_scale"), nb::arg("columnwise"),
      nb::arg("columnwise_scale"), nb::arg("stream") = 0);
}

}  // namespace te_py
