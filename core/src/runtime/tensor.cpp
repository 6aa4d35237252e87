#include "runtime/tensor.h"

#include "runtime/status.h"

namespace te {

const char* dtype_name(te_dtype dtype) {
  switch (dtype) {
    case TE_DTYPE_BYTE: return "byte";
    case TE_DTYPE_INT16: return "int16";
    case TE_DTYPE_INT32: return "int32";
    case TE_DTYPE_INT64: return "int64";
    case TE_DTYPE_FLOAT32: return "float32";
    case TE_DTYPE_FLOAT16: return "float16";
    case TE_DTYPE_BFLOAT16: return "bfloat16";
    case TE_DTYPE_FLOAT8E4M3: return "float8_e4m3";
    case TE_DTYPE_FLOAT8E5M2: return "float8_e5m2";
    case TE_DTYPE_FLOAT8E8M0: return "float8_e8m0";
    case TE_DTYPE_FLOAT4E2M1: return "float4_e2m1";
  }
  return "unknown dtype";
}

bool is_fp8(te_dtype dtype) { return dtype == TE_DTYPE_FLOAT8E4M3 || dtype == TE_DTYPE_FLOAT8E5M2; }

bool is_high_precision_float(te_dtype dtype) {
  return dtype == TE_DTYPE_FLOAT32 || dtype == TE_DTYPE_BFLOAT16 || dtype == TE_DTYPE_FLOAT16;
}

int dtype_bits(te_dtype dtype) {
  switch (dtype) {
    case TE_DTYPE_BYTE: return 8;
    case TE_DTYPE_INT16: return 16;
    case TE_DTYPE_INT32: return 32;
    case TE_DTYPE_INT64: return 64;
    case TE_DTYPE_FLOAT32: return 32;
    case TE_DTYPE_FLOAT16: return 16;
    case TE_DTYPE_BFLOAT16: return 16;
    case TE_DTYPE_FLOAT8E4M3: return 8;
    case TE_DTYPE_FLOAT8E5M2: return 8;
    case TE_DTYPE_FLOAT8E8M0: return 8;
    case TE_DTYPE_FLOAT4E2M1: return 4;
  }
  return 0;
}

int64_t numel(const te_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

int64_t size_bytes(const te_tensor& t) { return (numel(t) * dtype_bits(t.dtype) + 7) / 8; }

int64_t last_dim(const te_tensor& t) { return t.ndim == 0 ? 1 : t.shape[t.ndim - 1]; }

int64_t leading_rows(const te_tensor& t) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) rows *= t.shape[i];
  return rows;
}

std::string shape_string(const te_tensor& t) {
  std::string out = "[";
  for (int i = 0; i < t.ndim; ++i) out += (i ? ", " : "") + std::to_string(t.shape[i]);
  return out + "]";
}

std::string device_string(const te_tensor& t) {
  return t.device_type == TE_DEVICE_CUDA ? concat("cuda:", t.device_index) : std::string("cpu");
}

bool on_cuda(const te_tensor& t) { return t.device_type == TE_DEVICE_CUDA; }

namespace {

// The element count, byte size and end address of a buffer must be
// representable: every backend computes offsets as int64 products of the
// dims, so a shape like [2^32, 2^32] (2^64 elements) or [3, 6148914691236517206]
// would wrap around to a small or negative count and the call would touch
// memory it was not given, or do nothing and report success. Dims of 0 make
// the count 0 whatever the others are, so they are looked for first.
void check_extent(const te_tensor& t, const char* name) {
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] == 0) return;
  int64_t count = 1;
  for (int i = 0; i < t.ndim; ++i)
    if (__builtin_mul_overflow(count, t.shape[i], &count))
      fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' of shape ", shape_string(t),
           " has more elements than a signed 64-bit count can hold");
  int64_t bits = 0;
  if (__builtin_mul_overflow(count, static_cast<int64_t>(dtype_bits(t.dtype)), &bits))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' of shape ", shape_string(t),
         " and dtype ", dtype_name(t.dtype), " has a byte size that overflows 64-bit arithmetic");
  const uint64_t bytes = (static_cast<uint64_t>(bits) + 7) / 8;
  uintptr_t end = 0;
  if (__builtin_add_overflow(reinterpret_cast<uintptr_t>(t.data), bytes, &end))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' of shape ", shape_string(t), " (", bytes,
         " bytes) extends past the end of the address space");
}

}  // namespace

void check_descriptor(const te_tensor* t, const char* name) {
  if (t == nullptr) fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' is required (got NULL)");
  if (t->ndim < 0 || t->ndim > TE_MAX_DIMS)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must have 0 to ", TE_MAX_DIMS,
         " dims, got ", t->ndim);
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] < 0)
      fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' has a negative dimension ",
           t->shape[i]);
  if (dtype_bits(t->dtype) == 0)
    fail(TE_ERROR_INVALID_DTYPE, "argument '", name, "' has an unknown dtype code ",
         static_cast<int>(t->dtype));
  if (t->device_type != TE_DEVICE_CPU && t->device_type != TE_DEVICE_CUDA)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' has an unknown device type ",
         static_cast<int>(t->device_type));
  check_extent(*t, name);
  if (t->data == nullptr && numel(*t) > 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' has a NULL data pointer");
}

Arg::Arg(const te_tensor* t, const char* name) : t_(t), name_(name) {
  check_descriptor(t, name);
  record_arg(t, name);
}

const Arg& Arg::output() const {
  mark_written(t_);
  return *this;
}

const Arg& Arg::dtype(te_dtype expected) const {
  if (t_->dtype != expected)
    fail(TE_ERROR_INVALID_DTYPE, "argument '", name_, "' must be ", dtype_name(expected), ", got ",
         dtype_name(t_->dtype));
  return *this;
}

const Arg& Arg::dtype_in(std::initializer_list<te_dtype> allowed, const char* what) const {
  for (te_dtype d : allowed)
    if (t_->dtype == d) return *this;
  fail(TE_ERROR_INVALID_DTYPE, "argument '", name_, "' must be ", what, ", got ",
       dtype_name(t_->dtype));
}

const Arg& Arg::numel(int64_t expected) const {
  if (te::numel(*t_) != expected)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name_, "' must have ", expected,
         " element(s), got shape ", shape_string(*t_));
  return *this;
}

const Arg& Arg::scalar_fp32() const {
  dtype(TE_DTYPE_FLOAT32);
  return numel(1);
}

const Arg& Arg::same_shape(const te_tensor& other, const char* other_name) const {
  bool same = t_->ndim == other.ndim;
  for (int i = 0; same && i < t_->ndim; ++i) same = t_->shape[i] == other.shape[i];
  if (!same)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name_, "' must have the shape of '", other_name,
         "' ", shape_string(other), ", got ", shape_string(*t_));
  return *this;
}

const Arg& Arg::same_device(const te_tensor& other, const char* other_name) const {
  if (t_->device_type != other.device_type ||
      (on_cuda(other) && t_->device_index != other.device_index))
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name_, "' must be on the device of '", other_name,
         "' (", device_string(other), "), got ", device_string(*t_));
  return *this;
}

const Arg& Arg::shape2d(int64_t rows, int64_t cols) const {
  if (leading_rows(*t_) != rows || last_dim(*t_) != cols || t_->ndim == 0)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name_, "' must be a [", rows, ", ", cols,
         "] matrix, got shape ", shape_string(*t_));
  return *this;
}

float* optional_fp32_scalar(te_tensor* t, const char* name, const te_tensor& input) {
  if (t == nullptr) return nullptr;
  Arg(t, name).output().scalar_fp32().same_device(input, "input");
  return static_cast<float*>(t->data);
}

void require_null(const te_tensor* t, const char* name, const char* why) {
  if (t != nullptr) fail(TE_ERROR_INVALID_ARGUMENT, "argument '", name, "' must be NULL: ", why);
}

}  // namespace te
