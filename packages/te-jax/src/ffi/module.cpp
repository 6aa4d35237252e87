// The nanobind module transformer_engine.jax._te_jax_ffi: the FFI handlers
// as PyCapsules for jax.ffi.register_ffi_target (done in
// transformer_engine/jax/cpp_extensions/_registry.py).
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

// The handler symbols defined with TE_JAX_DEFINE_HANDLERS (cast.cpp, gemm.cpp,
// norm.cpp, activation.cpp, attention.cpp, softmax.cpp, block.cpp).
#define TE_JAX_HANDLERS(X)               \
  X(te_jax_quantize_fp8)                 \
  X(te_jax_quantize_fp8_current_scaling) \
  X(te_jax_dequantize_fp8)               \
  X(te_jax_compute_amax)                 \
  X(te_jax_delayed_scaling_update)       \
  X(te_jax_gemm)                         \
  X(te_jax_layernorm_fwd)                \
  X(te_jax_rmsnorm_fwd)                  \
  X(te_jax_layernorm_bwd)                \
  X(te_jax_rmsnorm_bwd)                  \
  X(te_jax_activation_fwd)               \
  X(te_jax_activation_bwd)               \
  X(te_jax_attention_fwd)                \
  X(te_jax_attention_bwd)                \
  X(te_jax_softmax_fwd)                  \
  X(te_jax_softmax_bwd)                  \
  X(te_jax_quantize_mxfp8)               \
  X(te_jax_quantize_fp8_block)           \
  X(te_jax_nvfp4_amax)                   \
  X(te_jax_nvfp4_quantize)               \
  X(te_jax_gemm_block)

#define TE_JAX_DECLARE(name)                                \
  extern "C" XLA_FFI_Error* name##_cpu(XLA_FFI_CallFrame*); \
  extern "C" XLA_FFI_Error* name##_cuda(XLA_FFI_CallFrame*);
TE_JAX_HANDLERS(TE_JAX_DECLARE)

namespace {

nb::capsule capsule_of(XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// {target name: {"cpu": capsule, "CUDA": capsule}}
nb::dict registrations() {
  nb::dict out;
#define TE_JAX_ENTRY(name)                       \
  {                                              \
    nb::dict platforms;                          \
    platforms["cpu"] = capsule_of(name##_cpu);   \
    platforms["CUDA"] = capsule_of(name##_cuda); \
    out[#name] = platforms;                      \
  }
  TE_JAX_HANDLERS(TE_JAX_ENTRY)
#undef TE_JAX_ENTRY
  return out;
}

}  // namespace

NB_MODULE(_te_jax_ffi, m) {
  m.doc() = "XLA FFI handlers of te-jax (CPU and CUDA), calling te-core's C API";
  m.def("registrations", &registrations,
        "{target name: {platform: PyCapsule}} for jax.ffi.register_ffi_target");
}
