#include "common.h"

#include <optional>

#include "te/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace te_jax {

#if defined(__x86_64__) || defined(__i386__)
namespace {
constexpr unsigned kFlushToZero = 1u << 15;      // MXCSR.FTZ: denormal results -> 0
constexpr unsigned kDenormalsAreZero = 1u << 6;  // MXCSR.DAZ: denormal inputs read as 0
}  // namespace

IeeeDenormals::IeeeDenormals() : saved_(_mm_getcsr()) {
  _mm_setcsr(static_cast<unsigned>(saved_) & ~(kFlushToZero | kDenormalsAreZero));
}
IeeeDenormals::~IeeeDenormals() { _mm_setcsr(static_cast<unsigned>(saved_)); }
#elif defined(__aarch64__)
namespace {
constexpr uint64_t kFlushToZero = uint64_t{1} << 24;  // FPCR.FZ
}  // namespace

IeeeDenormals::IeeeDenormals() {
  asm volatile("mrs %0, fpcr" : "=r"(saved_));
  asm volatile("msr fpcr, %0" : : "r"(saved_ & ~kFlushToZero));
}
IeeeDenormals::~IeeeDenormals() { asm volatile("msr fpcr, %0" : : "r"(saved_)); }
#else
IeeeDenormals::IeeeDenormals() = default;  // (no flush modes known on other targets)
IeeeDenormals::~IeeeDenormals() = default;
#endif

bool te_dtype_of(ffi::DataType type, te_dtype* out) {
  switch (type) {
    case ffi::DataType::F32: *out = TE_DTYPE_FLOAT32; return true;
    case ffi::DataType::F16: *out = TE_DTYPE_FLOAT16; return true;
    case ffi::DataType::BF16: *out = TE_DTYPE_BFLOAT16; return true;
    case ffi::DataType::F8E4M3FN: *out = TE_DTYPE_FLOAT8E4M3; return true;
    case ffi::DataType::F8E5M2: *out = TE_DTYPE_FLOAT8E5M2; return true;
    case ffi::DataType::F8E8M0FNU: *out = TE_DTYPE_FLOAT8E8M0; return true;
    case ffi::DataType::U8: *out = TE_DTYPE_BYTE; return true;
    case ffi::DataType::S32: *out = TE_DTYPE_INT32; return true;
    case ffi::DataType::S64: *out = TE_DTYPE_INT64; return true;
    default: return false;
  }
}

ffi::Error describe(const ffi::AnyBuffer& b, const Device& device, const char* name,
                    te_tensor* out) {
  te_tensor t{};
  if (!te_dtype_of(b.element_type(), &t.dtype))
    return ffi::Error::InvalidArgument(std::string("argument '") + name +
                                       "' has an element type te-core does not take");
  const auto dims = b.dimensions();
  if (dims.size() > TE_MAX_DIMS)
    return ffi::Error::InvalidArgument(std::string("argument '") + name + "' has more than " +
                                       std::to_string(TE_MAX_DIMS) + " dimensions");
  t.data = b.untyped_data();
  t.ndim = static_cast<int32_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) t.shape[i] = dims[i];
  t.device_type = device.type;
  t.device_index = device.index;
  *out = t;
  return ffi::Error::Success();
}

ffi::Error describe_optional(const ffi::AnyBuffer& b, const Device& device, const char* name,
                             te_tensor* storage, te_tensor** out) {
  *out = nullptr;
  if (is_placeholder(b)) return ffi::Error::Success();
  if (ffi::Error e = describe(b, device, name, storage); e.failure()) return e;
  *out = storage;
  return ffi::Error::Success();
}

ffi::Error describe_all(const Device& device, std::initializer_list<Named> buffers) {
  for (const Named& n : buffers) {
    ffi::Error e = n.present ? describe_optional(n.buffer, device, n.name, n.storage, n.present)
                             : describe(n.buffer, device, n.name, n.storage);
    if (e.failure()) return e;
  }
  return ffi::Error::Success();
}

ffi::Error describe_scaling(const Device& device, const ffi::AnyBuffer& scale,
                            const ffi::AnyBuffer& scale_inv, const ffi::AnyBuffer& amax,
                            Scaling* out, const ScalingNames& names) {
  return describe_all(device, {{scale, names.scale, &out->scale, &out->scale_ptr},
                               {scale_inv, names.scale_inv, &out->scale_inv, &out->scale_inv_ptr},
                               {amax, names.amax, &out->amax, &out->amax_ptr}});
}

ffi::Error allocate_workspace(const Device& device, size_t bytes, const char* what,
                              std::vector<unsigned char>* host, te_tensor* storage,
                              te_tensor** out) {
  *out = nullptr;
  if (bytes == 0) return ffi::Error::Success();
  void* ptr = nullptr;
  if (device.scratch != nullptr) {
    // (XLA aligns scratch to at most 16 bytes; te-core's workspace sizes
    // include the slack to round the pointer up to the alignment it wants.)
    std::optional<void*> got = device.scratch->Allocate(bytes, 16);
    if (!got.has_value())
      return ffi::Error::Internal(std::string(what) + ": XLA could not allocate the workspace");
    ptr = *got;
  } else {
    host->resize(bytes + 256);  // (the CPU backend asks for none today)
    ptr = host->data();
  }
  te_tensor t{};
  t.data = ptr;
  t.dtype = TE_DTYPE_BYTE;
  t.ndim = 1;
  t.shape[0] = static_cast<int64_t>(bytes);
  t.device_type = device.type;
  t.device_index = device.index;
  *storage = t;
  *out = storage;
  return ffi::Error::Success();
}

ffi::Error from_status(te_status status) {
  if (status == TE_SUCCESS) return ffi::Error::Success();
  const std::string message = te_last_error_message();
  if (status == TE_ERROR_INVALID_ARGUMENT || status == TE_ERROR_INVALID_DTYPE)
    return ffi::Error::InvalidArgument(message);
  return ffi::Error::Internal(message);
}

}  // namespace te_jax
