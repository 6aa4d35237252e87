#include "bindings.h"

namespace te_py {

void bind_transpose(nb::module_& m) {
  m.def(
      "transpose",
      [](TensorDesc& input, TensorDesc& output, uintptr_t stream) {
        call([&] { return te_transpose(&input.t, &output.t, as_stream(stream)); });
      },
      nb::arg("input"), nb::arg("output"), nb::arg("stream") = 0);
}

}  // namespace te_py
