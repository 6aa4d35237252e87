#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

void bind_activation(nb::module_& m) {
  m.def(
      "activation_fwd",
      [](int kind, TensorDesc& input, Opt output, Opt columnwise, Opt scale, Opt scale_inv,
         Opt amax, float limit, float alpha, float glu_linear_offset, uintptr_t stream) {
        const te_activation_params params{limit, alpha, glu_linear_offset};
        call([&] {
          return te_activation_fwd(static_cast<te_activation>(kind), &params, &input.t, opt(output),
                                   opt(columnwise), opt(scale), opt(scale_inv), opt(amax),
                                   as_stream(stream));
        });
      },
      nb::arg("kind"), nb::arg("input"), nb::arg("output").none() = nb::none(),
      nb::arg("columnwise").none() = nb::none(), nb::arg("scale").none() = nb::none(),
      nb::arg("scale_inv").none() = nb::none(), nb::arg("amax").none() = nb::none(),
      nb::arg("limit") = 7.0f, nb::arg("alpha") = 1.702f, nb::arg("glu_linear_offset") = 1.0f,
      nb::arg("stream") = 0);

  m.def(
      "activation_bwd",
      [](int kind, TensorDesc& grad, TensorDesc& input, Opt grad_input, Opt columnwise, Opt scale,
         Opt scale_inv, Opt amax, Opt dbias, Opt workspace, float limit, float alpha,
         float glu_linear_offset, uintptr_t stream) {
        const te_activation_params params{limit, alpha, glu_linear_offset};
        call([&] {
          return te_activation_bwd(static_cast<te_activation>(kind), &params, &grad.t, &input.t,
                                   opt(grad_input), opt(columnwise), opt(scale), opt(scale_inv),
                                   opt(amax), opt(dbias), opt(workspace), as_stream(stream));
        });
      },
      nb::arg("kind"), nb::arg("grad"), nb::arg("input"), nb::arg("grad_input").none() = nb::none(),
      nb::arg("columnwise").none() = nb::none(), nb::arg("scale").none() = nb::none(),
      nb::arg("scale_inv").none() = nb::none(), nb::arg("amax").none() = nb::none(),
      nb::arg("dbias").none() = nb::none(), nb::arg("workspace").none() = nb::none(),
      nb::arg("limit") = 7.0f, nb::arg("alpha") = 1.702f, nb::arg("glu_linear_offset") = 1.0f,
      nb::arg("stream") = 0);

  m.def(
      "activation_bwd_with_fwd_columnwise",
      [](int kind, TensorDesc& grad, TensorDesc& input, Opt grad_input, Opt columnwise, Opt scale,
         Opt scale_inv, Opt amax, Opt dbias, Opt workspace, Opt fwd_columnwise, Opt fwd_scale,
         Opt fwd_scale_inv, int fwd_values_dtype, float limit, float alpha, float glu_linear_offset,
         uintptr_t stream) {
        const te_activation_params params{limit, alpha, glu_linear_offset};
        call([&] {
          return te_activation_bwd_with_fwd_columnwise(
              static_cast<te_activation>(kind), &params, &grad.t, &input.t, opt(grad_input),
              opt(columnwise), opt(scale), opt(scale_inv), opt(amax), opt(dbias), opt(workspace),
              opt(fwd_columnwise), opt(fwd_scale), opt(fwd_scale_inv),
              static_cast<te_dtype>(fwd_values_dtype), as_stream(stream));
        });
      },
      nb::arg("kind"), nb::arg("grad"), nb::arg("input"), nb::arg("grad_input").none() = nb::none(),
      nb::arg("columnwise").none() = nb::none(), nb::arg("scale").none() = nb::none(),
      nb::arg("scale_inv").none() = nb::none(), nb::arg("amax").none() = nb::none(),
      nb::arg("dbias").none() = nb::none(), nb::arg("workspace").none() = nb::none(),
      nb::arg("fwd_columnwise").none() = nb::none(), nb::arg("fwd_scale").none() = nb::none(),
      nb::arg("fwd_scale_inv").none() = nb::none(),
      nb::arg("fwd_values_dtype") = static_cast<int>(TE_DTYPE_FLOAT32), nb::arg("limit") = 7.0f,
      nb::arg("alpha") = 1.702f, nb::arg("glu_linear_offset") = 1.0f, nb::arg("stream") = 0);

  m.def(
      "activation_bwd_workspace_size",
      [](TensorDesc& input, bool with_dbias) {
        size_t bytes = 0;
        call([&] { return te_activation_bwd_workspace_size(&input.t, with_dbias, &bytes); });
        return bytes;
      },
      nb::arg("input"), nb::arg("with_dbias"));
}

}  // namespace te_py
