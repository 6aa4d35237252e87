#include "bindings.h"

namespace te_py {

namespace {

using Fwd = te_status (*)(const te_tensor*, float, te_tensor*, te_stream);
using Bwd = te_status (*)(const te_tensor*, const te_tensor*, float, te_tensor*, te_stream);

// One Python function per C entry point, all of one signature per direction.
void def_fwd(nb::module_& m, const char* name, Fwd f) {
  m.def(
      name,
      [f](TensorDesc& x, float scale, TensorDesc& y, uintptr_t stream) {
        call([&] { return f(&x.t, scale, &y.t, as_stream(stream)); });
      },
      nb::arg("x"), nb::arg("scale"), nb::arg("y"), nb::arg("stream") = 0);
}

void def_bwd(nb::module_& m, const char* name, Bwd f) {
  m.def(
      name,
      [f](TensorDesc& dy, TensorDesc& y, float scale, TensorDesc& dx, uintptr_t stream) {
        call([&] { return f(&dy.t, &y.t, scale, &dx.t, as_stream(stream)); });
      },
      nb::arg("dy"), nb::arg("y"), nb::arg("scale"), nb::arg("dx"), nb::arg("stream") = 0);
}

}  // namespace

void bind_softmax(nb::module_& m) {
  def_fwd(m, "scaled_softmax_fwd", te_softmax_scaled_softmax_fwd);
  def_bwd(m, "scaled_softmax_bwd", te_softmax_scaled_softmax_bwd);
  m.def(
      "scaled_masked_softmax_fwd",
      [](TensorDesc& x, TensorDesc& mask, float scale, TensorDesc& y, uintptr_t stream) {
        call([&] {
          return te_softmax_scaled_masked_softmax_fwd(&x.t, &mask.t, scale, &y.t,
                                                      as_stream(stream));
        });
      },
      nb::arg("x"), nb::arg("mask"), nb::arg("scale"), nb::arg("y"), nb::arg("stream") = 0);
  def_bwd(m, "scaled_masked_softmax_bwd", te_softmax_scaled_masked_softmax_bwd);
  def_fwd(m, "scaled_upper_triang_masked_softmax_fwd",
          te_softmax_scaled_upper_triang_masked_softmax_fwd);
  def_bwd(m, "scaled_upper_triang_masked_softmax_bwd",
          te_softmax_scaled_upper_triang_masked_softmax_bwd);
  def_fwd(m, "scaled_aligned_causal_masked_softmax_fwd",
          te_softmax_scaled_aligned_causal_masked_softmax_fwd);
  def_bwd(m, "scaled_aligned_causal_masked_softmax_bwd",
          te_softmax_scaled_aligned_causal_masked_softmax_bwd);
}

}  // namespace te_py
