#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

void bind_rope(nb::module_& m) {
  m.def(
      "rope_fwd",
      [](TensorDesc& t, TensorDesc& freqs, Opt cu_seqlens, Opt start_positions, int tensor_format,
         bool interleaved, int cp_size, int cp_rank, TensorDesc& out, uintptr_t stream) {
        call([&] {
          return te_rope_fwd(&t.t, &freqs.t, opt(cu_seqlens), opt(start_positions), tensor_format,
                             interleaved, cp_size, cp_rank, &out.t, as_stream(stream));
        });
      },
      nb::arg("t"), nb::arg("freqs"), nb::arg("cu_seqlens").none(),
      nb::arg("start_positions").none(), nb::arg("tensor_format"), nb::arg("interleaved"),
      nb::arg("cp_size"), nb::arg("cp_rank"), nb::arg("out"), nb::arg("stream") = 0);

  m.def(
      "rope_bwd",
      [](TensorDesc& d_out, TensorDesc& freqs, Opt cu_seqlens, Opt start_positions,
         int tensor_format, bool interleaved, int cp_size, int cp_rank, TensorDesc& d_t,
         uintptr_t stream) {
        call([&] {
          return te_rope_bwd(&d_out.t, &freqs.t, opt(cu_seqlens), opt(start_positions),
                             tensor_format, interleaved, cp_size, cp_rank, &d_t.t,
                             as_stream(stream));
        });
      },
      nb::arg("d_out"), nb::arg("freqs"), nb::arg("cu_seqlens").none(),
      nb::arg("start_positions").none(), nb::arg("tensor_format"), nb::arg("interleaved"),
      nb::arg("cp_size"), nb::arg("cp_rank"), nb::arg("d_t"), nb::arg("stream") = 0);
}

}  // namespace te_py
