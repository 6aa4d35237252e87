// The _te_core extension module: a thin nanobind layer over the C API.
#include <stdexcept>
#include <string>

#include "bindings.h"

namespace te_py {

TensorDesc::TensorDesc(uintptr_t data, int dtype, const std::vector<int64_t>& shape,
                       int device_type, int device_index) {
  if (shape.size() > TE_MAX_DIMS)
    throw nb::value_error(("tensors have at most " + std::to_string(TE_MAX_DIMS) + " dims, got " +
                           std::to_string(shape.size()))
                              .c_str());
  t.data = reinterpret_cast<void*>(data);
  t.dtype = static_cast<te_dtype>(dtype);
  t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  t.device_type = static_cast<te_device_type>(device_type);
  t.device_index = device_index;
}

void check(te_status status) {
  if (status == TE_SUCCESS) return;
  const std::string message = te_last_error_message();
  switch (status) {
    case TE_ERROR_INVALID_ARGUMENT: throw nb::value_error(message.c_str());
    case TE_ERROR_INVALID_DTYPE: throw nb::type_error(message.c_str());
    case TE_ERROR_UNSUPPORTED:
      PyErr_SetString(PyExc_NotImplementedError, message.c_str());
      throw nb::python_error();
    default: throw std::runtime_error(message);
  }
}

}  // namespace te_py

NB_MODULE(_te_core, m) {
  using namespace te_py;
  m.doc() = "Transformer Engine core bindings (one function per C entry point).";
  // te-pytorch caches descriptors of long-lived tensors (quantizer scales,
  // amax histories, workspaces) in Python objects that may outlive the module
  // at interpreter exit; nanobind would report those as leaks.
  nb::set_leak_warnings(false);

  nb::class_<TensorDesc>(m, "TensorDesc")
      .def(nb::init<uintptr_t, int, const std::vector<int64_t>&, int, int>(), nb::arg("data"),
           nb::arg("dtype"), nb::arg("shape"), nb::arg("device_type") = 0,
           nb::arg("device_index") = 0)
      .def_prop_ro("data",
                   [](const TensorDesc& d) { return reinterpret_cast<uintptr_t>(d.t.data); })
      .def_prop_ro("dtype", [](const TensorDesc& d) { return static_cast<int>(d.t.dtype); })
      .def_prop_ro(
          "shape",
          [](const TensorDesc& d) { return std::vector<int64_t>(d.t.shape, d.t.shape + d.t.ndim); })
      .def_prop_ro("device_type",
                   [](const TensorDesc& d) { return static_cast<int>(d.t.device_type); })
      .def_prop_ro("device_index", [](const TensorDesc& d) { return d.t.device_index; });

  m.def("version", &te_version);
  m.def("built_with_cuda", [] { return te_built_with_cuda() != 0; });
  m.def("cuda_device_count", &te_cuda_device_count);

  bind_cast(m);
  bind_transpose(m);
  bind_recipe(m);
  bind_gemm(m);
  bind_norm(m);
  bind_fp8_block(m);
  bind_nvfp4(m);
  bind_mxfp8(m);
  bind_gemm_block(m);
  bind_activation(m);
  bind_attention(m);
}
