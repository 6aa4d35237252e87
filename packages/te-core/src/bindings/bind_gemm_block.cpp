// Bindings of te/gemm_block.h. Two descriptor classes hold copies of the
// tensor descriptors (so the C structs' pointers stay valid for the call):
//   GemmOperandDesc(data, scaling, scale_inv=None, amax=None, swizzled_scales=False)
//   GemmBlockParams(a, b, d, c=None, bias=None, alpha=1, beta=0, transa=False,
//                   transb=True, use_split_accumulator=True, force_emulation=False)
// Paths come back as ints: 0 = native, 1 = emulated (te_gemm_path). GIL released.
#include <nanobind/stl/pair.h>

#include <utility>

#include "bindings.h"

namespace te_py {

using Opt = std::optional<TensorDesc*>;

namespace {

// A descriptor copy that is absent (NULL) when not given.
struct OptionalTensor {
  te_tensor t{};
  bool present = false;
  explicit OptionalTensor(Opt d = std::nullopt) {
    if (d.has_value() && *d != nullptr) {
      t = (*d)->t;
      present = true;
    }
  }
  const te_tensor* get() const { return present ? &t : nullptr; }
};

struct OperandDesc {
  te_tensor data{};
  int scaling = TE_SCALING_NONE;
  OptionalTensor scale_inv, amax;
  bool swizzled = false;

  te_gemm_operand view() const {
    return te_gemm_operand{&data, static_cast<te_scaling_mode>(scaling), scale_inv.get(),
                           amax.get(), swizzled ? 1 : 0};
  }
};

struct ParamsDesc {
  OperandDesc a, b;
  te_tensor d{};
  OptionalTensor c, bias;
  float alpha = 1.0f, beta = 0.0f;
  bool transa = false, transb = true, split = true, force = false;

  te_gemm_block_params view() {
    te_gemm_block_params p{};
    p.a = a.view();
    p.transa = transa;
    p.b = b.view();
    p.transb = transb;
    p.c = c.get();
    p.d = &d;
    p.bias = bias.get();
    p.alpha = alpha;
    p.beta = beta;
    p.use_split_accumulator = split;
    p.force_emulation = force;
    return p;
  }
};

std::vector<te_gemm_block_params> views(const std::vector<ParamsDesc*>& groups) {
  std::vector<te_gemm_block_params> out;
  out.reserve(groups.size());
  for (ParamsDesc* g : groups) {
    if (g == nullptr) throw nb::value_error("groups must not contain None");
    out.push_back(g->view());
  }
  return out;
}

}  // namespace

void bind_gemm_block(nb::module_& m) {
  nb::class_<OperandDesc>(m, "GemmOperandDesc")
      .def(
          "__init__",
          [](OperandDesc* self, TensorDesc& data, int scaling, Opt scale_inv, Opt amax,
             bool swizzled) {
            new (self) OperandDesc{data.t, scaling, OptionalTensor(scale_inv), OptionalTensor(amax),
                                   swizzled};
          },
          nb::arg("data"), nb::arg("scaling"), nb::arg("scale_inv").none() = nb::none(),
          nb::arg("amax").none() = nb::none(), nb::arg("swizzled_scales") = false);

  nb::class_<ParamsDesc>(m, "GemmBlockParams")
      .def(
          "__init__",
          [](ParamsDesc* self, OperandDesc& a, OperandDesc& b, TensorDesc& d, Opt c, Opt bias,
             float alpha, float beta, bool transa, bool transb, bool split, bool force) {
            new (self) ParamsDesc{
                a,      b,     d.t,  OptionalTensor(c), OptionalTensor(bias), alpha, beta, transa,
                transb, split, force};
          },
          nb::arg("a"), nb::arg("b"), nb::arg("d"), nb::arg("c").none() = nb::none(),
          nb::arg("bias").none() = nb::none(), nb::arg("alpha") = 1.0f, nb::arg("beta") = 0.0f,
          nb::arg("transa") = false, nb::arg("transb") = true,
          nb::arg("use_split_accumulator") = true, nb::arg("force_emulation") = false);

  m.def(
      "gemm_block_plan",
      [](ParamsDesc& params) {
        const te_gemm_block_params p = params.view();
        te_gemm_path path = TE_GEMM_PATH_NATIVE;
        size_t bytes = 0;
        call([&] { return te_gemm_block_plan(&p, &path, &bytes); });
        return std::make_pair(static_cast<int>(path), bytes);
      },
      nb::arg("params"), "(path, workspace bytes) of te_gemm_block for these parameters.");

  m.def(
      "gemm_block",
      [](ParamsDesc& params, Opt workspace, uintptr_t stream) {
        const te_gemm_block_params p = params.view();
        te_gemm_path path = TE_GEMM_PATH_NATIVE;
        call([&] { return te_gemm_block(&p, opt(workspace), &path, as_stream(stream)); });
        return static_cast<int>(path);
      },
      nb::arg("params"), nb::arg("workspace").none() = nb::none(), nb::arg("stream") = 0,
      "One block-scaled GEMM (te_gemm_block); returns the path taken.");

  m.def(
      "gemm_block_grouped_plan",
      [](const std::vector<ParamsDesc*>& groups) {
        const std::vector<te_gemm_block_params> p = views(groups);
        std::vector<te_gemm_path> paths(p.size());
        size_t bytes = 0;
        call([&] {
          return te_gemm_block_grouped_plan(p.data(), static_cast<int>(p.size()), paths.data(),
                                            &bytes);
        });
        return std::make_pair(std::vector<int>(paths.begin(), paths.end()), bytes);
      },
      nb::arg("groups"), "(paths, workspace bytes) of te_gemm_block_grouped.");

  m.def(
      "gemm_block_grouped",
      [](const std::vector<ParamsDesc*>& groups, Opt workspace, uintptr_t stream) {
        const std::vector<te_gemm_block_params> p = views(groups);
        std::vector<te_gemm_path> paths(p.size());
        call([&] {
          return te_gemm_block_grouped(p.data(), static_cast<int>(p.size()), opt(workspace),
                                       paths.data(), as_stream(stream));
        });
        return std::vector<int>(paths.begin(), paths.end());
      },
      nb::arg("groups"), nb::arg("workspace").none() = nb::none(), nb::arg("stream") = 0,
      "Independent GEMMs back to back (te_gemm_block_grouped); returns each group's path.");
}

}  // namespace te_py
