#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

namespace {

// Everything of te_gemm_params but the workspace.
struct GemmInputs {
  TensorDesc* a;
  TensorDesc* b;
  TensorDesc* d;
  Opt a_scale_inv, b_scale_inv, c, d_scale, d_amax, bias, pre_gelu_out, bias_grad;
  float alpha, beta;
  bool transa, transb, use_split_accumulator;

  te_gemm_params params() const {
    te_gemm_params p{};
    p.a = &a->t;
    p.a_scale_inv = opt(a_scale_inv);
    p.transa = transa;
    p.b = &b->t;
    p.b_scale_inv = opt(b_scale_inv);
    p.transb = transb;
    p.c = opt(c);
    p.d = &d->t;
    p.d_scale = opt(d_scale);
    p.d_amax = opt(d_amax);
    p.bias = opt(bias);
    p.pre_gelu_out = opt(pre_gelu_out);
    p.bias_grad = opt(bias_grad);
    p.alpha = alpha;
    p.beta = beta;
    p.use_split_accumulator = use_split_accumulator;
    return p;
  }
};

}  // namespace

void bind_gemm(nb::module_& m) {
  m.def(
      "gemm",
      [](TensorDesc& a, TensorDesc& b, TensorDesc& d, Opt a_scale_inv, Opt b_scale_inv, Opt c,
         Opt d_scale, Opt d_amax, Opt bias, Opt pre_gelu_out, Opt bias_grad, Opt workspace,
         float alpha, float beta, bool transa, bool transb, bool use_split_accumulator,
         uintptr_t stream) {
        const GemmInputs in{&a,      &b,     &d,     a_scale_inv,          b_scale_inv, c,
                            d_scale, d_amax, bias,   pre_gelu_out,         bias_grad,   alpha,
                            beta,    transa, transb, use_split_accumulator};
        te_gemm_params p = in.params();
        p.workspace = opt(workspace);
        call([&] { return te_gemm(&p, as_stream(stream)); });
      },
      nb::arg("a"), nb::arg("b"), nb::arg("d"), nb::arg("a_scale_inv").none() = nb::none(),
      nb::arg("b_scale_inv").none() = nb::none(), nb::arg("c").none() = nb::none(),
      nb::arg("d_scale").none() = nb::none(), nb::arg("d_amax").none() = nb::none(),
      nb::arg("bias").none() = nb::none(), nb::arg("pre_gelu_out").none() = nb::none(),
      nb::arg("bias_grad").none() = nb::none(), nb::arg("workspace").none() = nb::none(),
      nb::arg("alpha") = 1.0f, nb::arg("beta") = 0.0f, nb::arg("transa") = false,
      nb::arg("transb") = false, nb::arg("use_split_accumulator") = true, nb::arg("stream") = 0,
      "D = alpha * op(A) op(B) + beta * C with the epilogues of te/gemm.h (te_gemm).");

  m.def(
      "gemm_workspace_size",
      [](TensorDesc& a, TensorDesc& b, TensorDesc& d, Opt a_scale_inv, Opt b_scale_inv, Opt c,
         Opt d_scale, Opt d_amax, Opt bias, Opt pre_gelu_out, Opt bias_grad, float alpha,
         float beta, bool transa, bool transb, bool use_split_accumulator) {
        const GemmInputs in{&a,      &b,     &d,     a_scale_inv,          b_scale_inv, c,
                            d_scale, d_amax, bias,   pre_gelu_out,         bias_grad,   alpha,
                            beta,    transa, transb, use_split_accumulator};
        const te_gemm_params p = in.params();
        size_t bytes = 0;
        call([&] { return te_gemm_workspace_size(&p, &bytes); });
        return bytes;
      },
      nb::arg("a"), nb::arg("b"), nb::arg("d"), nb::arg("a_scale_inv").none() = nb::none(),
      nb::arg("b_scale_inv").none() = nb::none(), nb::arg("c").none() = nb::none(),
      nb::arg("d_scale").none() = nb::none(), nb::arg("d_amax").none() = nb::none(),
      nb::arg("bias").none() = nb::none(), nb::arg("pre_gelu_out").none() = nb::none(),
      nb::arg("bias_grad").none() = nb::none(), nb::arg("alpha") = 1.0f, nb::arg("beta") = 0.0f,
      nb::arg("transa") = false, nb::arg("transb") = false, nb::arg("use_split_accumulator") = true,
      "Bytes of workspace te_gemm needs for these arguments (data pointers are not read).");
}

}  // namespace te_py
