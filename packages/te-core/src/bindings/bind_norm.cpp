#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

void bind_norm(nb::module_& m) {
  m.def(
      "layernorm_fwd",
      [](TensorDesc& x, TensorDesc& gamma, TensorDesc& beta, float eps, bool zero_centered_gamma,
         TensorDesc& y, Opt y_scale, Opt y_scale_inv, Opt y_amax, Opt mu, Opt rsigma,
         uintptr_t stream) {
        call([&] {
          const te_norm_fwd_params p{
              &x.t,         &gamma.t,         &beta.t,     eps,     zero_centered_gamma, &y.t,
              opt(y_scale), opt(y_scale_inv), opt(y_amax), opt(mu), opt(rsigma)};
          return te_layernorm_fwd(&p, as_stream(stream));
        });
      },
      nb::arg("x"), nb::arg("gamma"), nb::arg("beta"), nb::arg("eps"),
      nb::arg("zero_centered_gamma"), nb::arg("y"), nb::arg("y_scale").none(),
      nb::arg("y_scale_inv").none(), nb::arg("y_amax").none(), nb::arg("mu").none(),
      nb::arg("rsigma").none(), nb::arg("stream") = 0);

  m.def(
      "rmsnorm_fwd",
      [](TensorDesc& x, TensorDesc& gamma, float eps, bool zero_centered_gamma, TensorDesc& y,
         Opt y_scale, Opt y_scale_inv, Opt y_amax, Opt rsigma, uintptr_t stream) {
        call([&] {
          const te_norm_fwd_params p{
              &x.t,         &gamma.t,         nullptr,     eps,     zero_centered_gamma, &y.t,
              opt(y_scale), opt(y_scale_inv), opt(y_amax), nullptr, opt(rsigma)};
          return te_rmsnorm_fwd(&p, as_stream(stream));
        });
      },
      nb::arg("x"), nb::arg("gamma"), nb::arg("eps"), nb::arg("zero_centered_gamma"), nb::arg("y"),
      nb::arg("y_scale").none(), nb::arg("y_scale_inv").none(), nb::arg("y_amax").none(),
      nb::arg("rsigma").none(), nb::arg("stream") = 0);

  m.def(
      "layernorm_bwd_workspace_size",
      [](TensorDesc& x) {
        size_t bytes = 0;
        call([&] { return te_layernorm_bwd_workspace_size(&x.t, &bytes); });
        return bytes;
      },
      nb::arg("x"));

  m.def(
      "rmsnorm_bwd_workspace_size",
      [](TensorDesc& x) {
        size_t bytes = 0;
        call([&] { return te_rmsnorm_bwd_workspace_size(&x.t, &bytes); });
        return bytes;
      },
      nb::arg("x"));

  m.def(
      "layernorm_bwd",
      [](TensorDesc& dz, TensorDesc& x, TensorDesc& mu, TensorDesc& rsigma, TensorDesc& gamma,
         bool zero_centered_gamma, TensorDesc& dx, TensorDesc& dgamma, TensorDesc& dbeta,
         Opt workspace, uintptr_t stream) {
        call([&] {
          const te_norm_bwd_params p{
              &dz.t, &x.t,      &mu.t,    &rsigma.t,     &gamma.t, zero_centered_gamma,
              &dx.t, &dgamma.t, &dbeta.t, opt(workspace)};
          return te_layernorm_bwd(&p, as_stream(stream));
        });
      },
      nb::arg("dz"), nb::arg("x"), nb::arg("mu"), nb::arg("rsigma"), nb::arg("gamma"),
      nb::arg("zero_centered_gamma"), nb::arg("dx"), nb::arg("dgamma"), nb::arg("dbeta"),
      nb::arg("workspace").none(), nb::arg("stream") = 0);

  m.def(
      "rmsnorm_bwd",
      [](TensorDesc& dz, TensorDesc& x, TensorDesc& rsigma, TensorDesc& gamma,
         bool zero_centered_gamma, TensorDesc& dx, TensorDesc& dgamma, Opt workspace,
         uintptr_t stream) {
        call([&] {
          const te_norm_bwd_params p{
              &dz.t, &x.t,      nullptr, &rsigma.t,     &gamma.t, zero_centered_gamma,
              &dx.t, &dgamma.t, nullptr, opt(workspace)};
          return te_rmsnorm_bwd(&p, as_stream(stream));
        });
      },
      nb::arg("dz"), nb::arg("x"), nb::arg("rsigma"), nb::arg("gamma"),
      nb::arg("zero_centered_gamma"), nb::arg("dx"), nb::arg("dgamma"), nb::arg("workspace").none(),
      nb::arg("stream") = 0);
}

}  // namespace te_py
