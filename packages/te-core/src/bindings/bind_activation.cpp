#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

namespace {

// The table TE_ACTIVATION_KINDS (te/activation.h) as Python data: one dict per
// kind in code order, {"name", "code", "gated", "params"}; "params" holds the
// default te_activation_params of a kind that reads them, else it is empty.
nb::list activation_kinds() {
  nb::list kinds;
  auto add = [&](const char* name, int code, bool gated, bool takes_params) {
    nb::dict params;
    if (takes_params) {
      params["limit"] = TE_ACTIVATION_DEFAULT_LIMIT;
      params["alpha"] = TE_ACTIVATION_DEFAULT_ALPHA;
      params["glu_linear_offset"] = TE_ACTIVATION_DEFAULT_GLU_LINEAR_OFFSET;
    }
    nb::dict kind;
    kind["name"] = name;
    kind["code"] = code;
    kind["gated"] = gated;
    kind["params"] = params;
    kinds.append(kind);
  };
#define TE_PY_ACTIVATION_KIND_(ID, name, code, gated, functor, params) \
  add(#name, code, (gated) != 0, (params) != 0);
  TE_ACTIVATION_KINDS(TE_PY_ACTIVATION_KIND_)
#undef TE_PY_ACTIVATION_KIND_
  return kinds;
}

// The te_activation_bwd_params of both backward bindings' arguments.
te_activation_bwd_params bwd_params(int kind, const te_activation_params& params, TensorDesc& grad,
                                    TensorDesc& input, Opt grad_input, Opt columnwise, Opt scale,
                                    Opt scale_inv, Opt amax, Opt dbias, Opt workspace) {
  return {static_cast<te_activation>(kind),
          &params,
          &grad.t,
          &input.t,
          opt(grad_input),
          opt(columnwise),
          opt(scale),
          opt(scale_inv),
          opt(amax),
          opt(dbias),
          opt(workspace)};
}

}  // namespace

void bind_activation(nb::module_& m) {
  m.def("activation_kinds", &activation_kinds,
        "The activation kinds of te/activation.h's table: [{name, code, gated, params}] in code "
        "order (params: a kind's default te_activation_params, empty when it reads none).");
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
      nb::arg("limit") = TE_ACTIVATION_DEFAULT_LIMIT,
      nb::arg("alpha") = TE_ACTIVATION_DEFAULT_ALPHA,
      nb::arg("glu_linear_offset") = TE_ACTIVATION_DEFAULT_GLU_LINEAR_OFFSET,
      nb::arg("stream") = 0);

  m.def(
      "activation_bwd",
      [](int kind, TensorDesc& grad, TensorDesc& input, Opt grad_input, Opt columnwise, Opt scale,
         Opt scale_inv, Opt amax, Opt dbias, Opt workspace, float limit, float alpha,
         float glu_linear_offset, uintptr_t stream) {
        const te_activation_params params{limit, alpha, glu_linear_offset};
        call([&] {
          const te_activation_bwd_params p =
              bwd_params(kind, params, grad, input, grad_input, columnwise, scale, scale_inv, amax,
                         dbias, workspace);
          return te_activation_bwd(&p, as_stream(stream));
        });
      },
      nb::arg("kind"), nb::arg("grad"), nb::arg("input"), nb::arg("grad_input").none() = nb::none(),
      nb::arg("columnwise").none() = nb::none(), nb::arg("scale").none() = nb::none(),
      nb::arg("scale_inv").none() = nb::none(), nb::arg("amax").none() = nb::none(),
      nb::arg("dbias").none() = nb::none(), nb::arg("workspace").none() = nb::none(),
      nb::arg("limit") = TE_ACTIVATION_DEFAULT_LIMIT,
      nb::arg("alpha") = TE_ACTIVATION_DEFAULT_ALPHA,
      nb::arg("glu_linear_offset") = TE_ACTIVATION_DEFAULT_GLU_LINEAR_OFFSET,
      nb::arg("stream") = 0);

  m.def(
      "activation_bwd_with_fwd_columnwise",
      [](int kind, TensorDesc& grad, TensorDesc& input, Opt grad_input, Opt columnwise, Opt scale,
         Opt scale_inv, Opt amax, Opt dbias, Opt workspace, Opt fwd_columnwise, Opt fwd_scale,
         Opt fwd_scale_inv, int fwd_values_dtype, float limit, float alpha, float glu_linear_offset,
         uintptr_t stream) {
        const te_activation_params params{limit, alpha, glu_linear_offset};
        call([&] {
          const te_activation_bwd_params p =
              bwd_params(kind, params, grad, input, grad_input, columnwise, scale, scale_inv, amax,
                         dbias, workspace);
          return te_activation_bwd_with_fwd_columnwise(
              &p, opt(fwd_columnwise), opt(fwd_scale), opt(fwd_scale_inv),
              static_cast<te_dtype>(fwd_values_dtype), as_stream(stream));
        });
      },
      nb::arg("kind"), nb::arg("grad"), nb::arg("input"), nb::arg("grad_input").none() = nb::none(),
      nb::arg("columnwise").none() = nb::none(), nb::arg("scale").none() = nb::none(),
      nb::arg("scale_inv").none() = nb::none(), nb::arg("amax").none() = nb::none(),
      nb::arg("dbias").none() = nb::none(), nb::arg("workspace").none() = nb::none(),
      nb::arg("fwd_columnwise").none() = nb::none(), nb::arg("fwd_scale").none() = nb::none(),
      nb::arg("fwd_scale_inv").none() = nb::none(),
      nb::arg("fwd_values_dtype") = static_cast<int>(TE_DTYPE_FLOAT32),
      nb::arg("limit") = TE_ACTIVATION_DEFAULT_LIMIT,
      nb::arg("alpha") = TE_ACTIVATION_DEFAULT_ALPHA,
      nb::arg("glu_linear_offset") = TE_ACTIVATION_DEFAULT_GLU_LINEAR_OFFSET,
      nb::arg("stream") = 0);

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
