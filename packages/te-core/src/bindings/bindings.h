// Shared pieces of the nanobind module: the tensor descriptor class and the
// status -> Python exception translation. One bind_<family>.cpp per op family.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "te/te.h"

namespace te_py {

namespace nb = nanobind;

// Python-visible descriptor: data pointer (int), dtype code, shape, device.
struct TensorDesc {
  te_tensor t{};
  TensorDesc(uintptr_t data, int dtype, const std::vector<int64_t>& shape, int device_type,
             int device_index);
};

// nullptr for None, else the descriptor's te_tensor.
inline te_tensor* opt(std::optional<TensorDesc*> d) {
  return (d.has_value() && *d != nullptr) ? &(*d)->t : nullptr;
}

inline te_stream as_stream(uintptr_t stream) { return reinterpret_cast<te_stream>(stream); }

// Raises ValueError / TypeError / NotImplementedError / RuntimeError with the
// core's message when status is not TE_SUCCESS.
void check(te_status status);

// Calls the C function with the GIL released, then checks its status.
template <class F>
void call(F&& f) {
  te_status status;
  {
    nb::gil_scoped_release release;
    status = f();
  }
  check(status);
}

void bind_cast(nb::module_& m);
void bind_transpose(nb::module_& m);
void bind_recipe(nb::module_& m);
void bind_gemm(nb::module_& m);
void bind_norm(nb::module_& m);
void bind_fp8_block(nb::module_& m);
void bind_nvfp4(nb::module_& m);
void bind_mxfp8(nb::module_& m);
void bind_gemm_block(nb::module_& m);
void bind_activation(nb::module_& m);
void bind_attention(nb::module_& m);

}  // namespace te_py
