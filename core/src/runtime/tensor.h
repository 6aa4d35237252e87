// Validation of te_tensor arguments. Each check names the argument and the
// rule it broke, so users read "argument 'scale' must be float32, got bfloat16".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "runtime/status.h"
#include "te/types.h"

namespace te {

const char* dtype_name(te_dtype dtype);
bool is_fp8(te_dtype dtype);
bool is_high_precision_float(te_dtype dtype);  // FP32, BF16, FP16
// Bits per element (4 for FP4).
int dtype_bits(te_dtype dtype);

int64_t numel(const te_tensor& t);
// Bytes the buffer holds (packed FP4 rounds up).
int64_t size_bytes(const te_tensor& t);
// Last dimension (1 for a scalar) and the product of the others.
int64_t last_dim(const te_tensor& t);
int64_t leading_rows(const te_tensor& t);
std::string shape_string(const te_tensor& t);
std::string device_string(const te_tensor& t);
bool on_cuda(const te_tensor& t);

// Fluent checks on one argument; each failing check throws te::Error.
class Arg {
 public:
  // A required argument: null pointer or null data fails.
  Arg(const te_tensor* t, const char* name);
  const te_tensor& get() const { return *t_; }

  const Arg& dtype(te_dtype expected) const;
  const Arg& dtype_in(std::initializer_list<te_dtype> allowed, const char* what) const;
  const Arg& numel(int64_t expected) const;
  const Arg& scalar_fp32() const;  // one FP32 element
  const Arg& same_shape(const te_tensor& other, const char* other_name) const;
  const Arg& same_device(const te_tensor& other, const char* other_name) const;
  const Arg& shape2d(int64_t rows, int64_t cols) const;  // matrix view [rows, cols]
  // Marks the argument as written by the call (an output, in-place state or a
  // workspace): TE_DISPATCH then refuses it when its bytes overlap those of any
  // other argument the call checked, unless allow_alias() permits that pair.
  const Arg& output() const;

 private:
  const te_tensor* t_;
  const char* name_;
};

// Permits the documented in-place forms, e.g. GEMM's C == D: `written` may be
// `read` itself (same data pointer and byte size), never a partial overlap.
void allow_alias(const te_tensor* written, const te_tensor* read);

// Refuses a call whose written arguments overlap another argument in memory
// (on the same device); run by TE_DISPATCH before any backend touches memory.
void check_aliasing();
// The frame's bookkeeping behind Arg (runtime/aliasing.cpp).
void record_arg(const te_tensor* t, const char* name);
void mark_written(const te_tensor* t);
// Drops the records of a stand-in descriptor that is no argument of the call.
void forget_arg(const te_tensor* t);

// The dtype sets most entry points accept, with the words their messages use.
constexpr std::initializer_list<te_dtype> kHighPrecision = {TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16,
                                                            TE_DTYPE_FLOAT16};
constexpr const char* kHighPrecisionText = "float32, bfloat16 or float16";
constexpr std::initializer_list<te_dtype> kFp8 = {TE_DTYPE_FLOAT8E4M3, TE_DTYPE_FLOAT8E5M2};
constexpr const char* kFp8Text = "float8_e4m3 or float8_e5m2";

// Validates the descriptor fields themselves: rank, non-negative dims, known
// dtype and device, and an element count, byte size and end address that fit
// 64-bit arithmetic (no wrap-around); every Arg starts with it.
void check_descriptor(const te_tensor* t, const char* name);

// An optional FP32 scalar output (scale_inv, amax): nullptr when t is NULL,
// else t checked (one FP32 element on the device of the argument 'input') and
// its data.
float* optional_fp32_scalar(te_tensor* t, const char* name, const te_tensor& input);

// The params struct of an entry point that takes one; NULL fails.
template <class Params>
const Params& required_params(const Params* params) {
  if (params == nullptr)
    fail(TE_ERROR_INVALID_ARGUMENT, "argument 'params' is required (got NULL)");
  return *params;
}

// A field of a shared params struct that this entry point does not take
// (RMSNorm's beta) must be NULL; `why` completes the message.
void require_null(const te_tensor* t, const char* name, const char* why);

}  // namespace te
