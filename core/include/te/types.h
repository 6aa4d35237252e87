/* Transformer Engine core: shared types of the plain C API.
 *
 * Every entry point takes plain tensor descriptors (te_tensor) and an explicit
 * stream, returns a te_status and leaves a thread-local message readable with
 * te_last_error_message() when it fails. The caller allocates every output and
 * workspace; the core never allocates device memory and never synchronizes.
 */
#ifndef TE_TYPES_H_
#define TE_TYPES_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define TE_API __declspec(dllexport)
#else
#define TE_API __attribute__((visibility("default")))
#endif

/* Marks a declaration deprecated (a compiler warning at each use), e.g. the
 * old names kept as aliases for one release after a rename. */
#if defined(__GNUC__) || defined(__clang__)
#define TE_DEPRECATED(msg) __attribute__((deprecated(msg)))
#elif defined(_MSC_VER)
#define TE_DEPRECATED(msg) __declspec(deprecated(msg))
#else
#define TE_DEPRECATED(msg)
#endif

/* Every enum of the API is an int32_t. C gives enums the size of int; in C++ the
 * fixed underlying type also makes any int32_t a valid value of the type, so
 * that a bad code from a caller (a dtype of 99, a device of 77) is an input the
 * core refuses with a message, never undefined behaviour in reading it. */
#ifdef __cplusplus
#define TE_ENUM_BASE : int32_t
#else
#define TE_ENUM_BASE
#endif

/* Status of a call. Anything but TE_SUCCESS leaves a message (te_last_error_message). */
typedef enum TE_ENUM_BASE {
  TE_SUCCESS = 0,
  TE_ERROR_INVALID_ARGUMENT = 1, /* wrong dtype, shape, device, null pointer, size */
  TE_ERROR_UNSUPPORTED = 2,      /* valid request this build or device cannot run */
  TE_ERROR_CUDA = 3,             /* a CUDA runtime call failed */
  TE_ERROR_CUBLAS = 4,           /* a cuBLASLt call failed */
  TE_ERROR_INTERNAL = 5,         /* a bug in the core */
  TE_ERROR_INVALID_DTYPE = 6     /* an argument has the wrong element type */
} te_status;

/* Element types. The numbering follows the reference library's NVTEDType. */
typedef enum TE_ENUM_BASE {
  TE_DTYPE_BYTE = 0,
  TE_DTYPE_INT16 = 1,
  TE_DTYPE_INT32 = 2,
  TE_DTYPE_INT64 = 3,
  TE_DTYPE_FLOAT32 = 4,
  TE_DTYPE_FLOAT16 = 5,
  TE_DTYPE_BFLOAT16 = 6,
  TE_DTYPE_FLOAT8E4M3 = 7, /* float8_e4m3fn: max 448, no inf, one NaN pattern */
  TE_DTYPE_FLOAT8E5M2 = 8, /* float8_e5m2: max 57344 */
  TE_DTYPE_FLOAT8E8M0 = 9, /* float8_e8m0fnu: power-of-two block scales */
  TE_DTYPE_FLOAT4E2M1 = 10 /* float4_e2m1fn, packed two per byte */
} te_dtype;

typedef enum TE_ENUM_BASE { TE_DEVICE_CPU = 0, TE_DEVICE_CUDA = 1 } te_device_type;

#define TE_MAX_DIMS 8

/* A non-owning view of a dense, row-major (C-contiguous) buffer.
 * ndim == 0 is a scalar (one element). Packed FP4 tensors give their logical
 * shape; the buffer holds ceil(numel / 2) bytes. */
typedef struct {
  void* data;
  te_dtype dtype;
  int32_t ndim;
  int64_t shape[TE_MAX_DIMS];
  te_device_type device_type;
  int32_t device_index;
} te_tensor;

/* A cudaStream_t, or NULL for the default stream. Ignored by the CPU backend. */
typedef void* te_stream;

/* The message of the last failed call on this thread ("" when none). */
TE_API const char* te_last_error_message(void);

/* Library version string, e.g. "2.20.0.1" (<reference API level>.<our release>). */
TE_API const char* te_version(void);

/* 1 when this build has the CUDA backend, else 0. */
TE_API int te_built_with_cuda(void);

/* Number of CUDA devices usable by this build (0 without CUDA or devices). */
TE_API int te_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif /* TE_TYPES_H_ */
