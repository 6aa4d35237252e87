#include "bindings.h"

namespace te_py {

void bind_recipe(nb::module_& m) {
  nb::enum_<te_amax_compute_algo>(m, "AmaxComputeAlgo")
      .value("MAX", TE_AMAX_COMPUTE_MAX)
      .value("MOST_RECENT", TE_AMAX_COMPUTE_MOST_RECENT);

  m.def(
      "delayed_scaling_update",
      [](std::optional<TensorDesc*> reduction_buffer, std::vector<TensorDesc*> histories,
         std::vector<TensorDesc*> scales, std::optional<std::vector<TensorDesc*>> scale_invs,
         te_amax_compute_algo algo, int fp8_dtype, float margin, uintptr_t stream) {
        if (scales.size() != histories.size() ||
            (scale_invs && scale_invs->size() != histories.size()))
          throw nb::value_error(
              "'amax_histories', 'scales' and 'scale_invs' must have the same length");
        std::vector<te_tensor*> h, s, inv;
        for (auto* d : histories) h.push_back(&d->t);
        for (auto* d : scales) s.push_back(&d->t);
        if (scale_invs)
          for (auto* d : *scale_invs) inv.push_back(&d->t);
        call([&] {
          return te_recipe_delayed_scaling_update(
              opt(reduction_buffer), h.data(), s.data(), scale_invs ? inv.data() : nullptr,
              h.size(), algo, static_cast<te_dtype>(fp8_dtype), margin, as_stream(stream));
        });
      },
      nb::arg("amax_reduction_buffer").none(), nb::arg("amax_histories"), nb::arg("scales"),
      nb::arg("scale_invs").none(), nb::arg("algo"), nb::arg("fp8_dtype"), nb::arg("margin") = 0.0f,
      nb::arg("stream") = 0);
}

}  // namespace te_py
