// Shared pieces of te-jax's XLA FFI handlers: XLA buffers -> te-core
// descriptors, te-core statuses -> XLA errors, and one macro that defines an
// op's CPU and CUDA handlers from one implementation.
//
// An implementation is `ffi::Error impl(const Device&, <args...>)`. The CPU
// handler passes the CPU device; the CUDA handler decodes XLA's stream and
// device ordinal first and passes them on, so te-core's CUDA backend runs on
// XLA's stream and orders with XLA's own kernels.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "te/types.h"
#include "xla/ffi/api/ffi.h"

namespace te_jax {

namespace ffi = xla::ffi;

struct Device {
  te_device_type type = TE_DEVICE_CPU;
  int32_t index = 0;
  te_stream stream = nullptr;
  // XLA's stream-ordered scratch memory (CUDA handlers): GEMM workspaces.
  ffi::ScratchAllocator* scratch = nullptr;
};

inline Device cpu_device() { return Device{}; }
inline Device cuda_device(void* stream, int32_t ordinal, ffi::ScratchAllocator* scratch) {
  return Device{TE_DEVICE_CUDA, ordinal, stream, scratch};
}

// XLA's CPU runtime computes with denormals flushed (x86: FTZ and DAZ set in
// MXCSR; AArch64: FPCR.FZ), and its threads call the CPU handlers in that
// mode. te-core's CPU backend is specified with IEEE denormals (its bytes
// match the CUDA backend and the NumPy oracle), so each CPU handler clears
// the flush modes for the call and restores XLA's afterwards. (Worker
// threads te-core starts inherit the cleared mode.)
class IeeeDenormals {
 public:
  IeeeDenormals();
  ~IeeeDenormals();
  IeeeDenormals(const IeeeDenormals&) = delete;
  IeeeDenormals& operator=(const IeeeDenormals&) = delete;

 private:
  uint64_t saved_ = 0;
};

// te-core's element type of an XLA one; false when te-core has none.
bool te_dtype_of(ffi::DataType type, te_dtype* out);

// The descriptor of buffer `b` on `device` with te-core's counterpart of its
// element type (InvalidArgument naming `name` when there is none).
ffi::Error describe(const ffi::AnyBuffer& b, const Device& device, const char* name,
                    te_tensor* out);

// Success, or te-core's message of the failed call as an XLA error.
ffi::Error from_status(te_status status);

// A result buffer that stands for "not asked" (the Python side passes a
// zero-element placeholder: XLA FFI has no optional buffers).
inline bool is_placeholder(const ffi::AnyBuffer& b) {
  return b.element_count() == 0 && b.dimensions().size() == 1;
}

// An optional buffer: *out = nullptr for a placeholder, else `storage`
// described (as `describe` does) and *out pointing at it.
ffi::Error describe_optional(const ffi::AnyBuffer& b, const Device& device, const char* name,
                             te_tensor* storage, te_tensor** out);

// One buffer of a handler, for describe_all: described into `storage`. With
// `present` given it is optional, as in describe_optional (*present = nullptr
// for a placeholder, else `storage`).
struct Named {
  const ffi::AnyBuffer& buffer;
  const char* name;
  te_tensor* storage;
  te_tensor** present = nullptr;
};

// Describes the buffers in order; the first failure is returned.
ffi::Error describe_all(const Device& device, std::initializer_list<Named> buffers);

// The scaling buffers of an output, the same in every handler: scale (an
// input with delayed scaling, a result with current scaling), scale_inv and
// amax (results; an amax that is max-accumulated aliases its input). Each may
// be a placeholder for "not used" (a high-precision output has no scale or
// scale_inv; an amax not asked for); its pointer is then nullptr, which is how
// te-core's entry points take an absent one.
struct Scaling {
  te_tensor scale{}, scale_inv{}, amax{};
  te_tensor *scale_ptr = nullptr, *scale_inv_ptr = nullptr, *amax_ptr = nullptr;
};

// The argument names the errors use (te-core's parameter names).
struct ScalingNames {
  const char* scale = "scale";
  const char* scale_inv = "scale_inv";
  const char* amax = "amax";
};

// Describes scale, scale_inv and amax in that order into *out.
ffi::Error describe_scaling(const Device& device, const ffi::AnyBuffer& scale,
                            const ffi::AnyBuffer& scale_inv, const ffi::AnyBuffer& amax,
                            Scaling* out, const ScalingNames& names = {});

// A te-core workspace of `bytes` on `device`: XLA's scratch memory for the
// CUDA handlers (stream-ordered, freed after the call), `host` otherwise.
// *out = nullptr when bytes is 0 (te-core takes NULL then). `what` names the
// op in the error when XLA cannot allocate.
ffi::Error allocate_workspace(const Device& device, size_t bytes, const char* what,
                              std::vector<unsigned char>* host, te_tensor* storage,
                              te_tensor** out);

}  // namespace te_jax

// Defines the handler symbols <name>_cpu and <name>_cuda. `args` is a
// function-like macro taking a binding and appending the op's arguments,
// attributes and results to it.
#define TE_JAX_DEFINE_HANDLERS(name, impl, args)                                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name##_cpu, ([](auto... a) {                                \
                                  const ::te_jax::IeeeDenormals ieee;                       \
                                  return impl(::te_jax::cpu_device(), a...);                \
                                }),                                                         \
                                args(::xla::ffi::Ffi::Bind()));                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                            \
      name##_cuda,                                                                          \
      ([](void* stream, int32_t ordinal, ::xla::ffi::ScratchAllocator scratch, auto... a) { \
        return impl(::te_jax::cuda_device(stream, ordinal, &scratch), a...);                \
      }),                                                                                   \
      args(::xla::ffi::Ffi::Bind()                                                          \
               .Ctx<::xla::ffi::PlatformStream<void*>>()                                    \
               .Ctx<::xla::ffi::DeviceOrdinal>()                                            \
               .Ctx<::xla::ffi::ScratchAllocator>()))
