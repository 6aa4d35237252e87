// Status checks of the GEMM family's CUDA code: a failing cuBLASLt call
// becomes te::Error(TE_ERROR_CUBLAS), a failing CUDA runtime call or kernel
// launch te::Error(TE_ERROR_CUDA), each with the call's text and the library's
// message. (Local to gemm/, named so as not to clash with runtime helpers.)
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "runtime/status.h"

#define TE_GEMM_CHECK_CUBLAS(expr)                                                                 \
  do {                                                                                             \
    const cublasStatus_t te_gemm_status_ = (expr);                                                 \
    if (te_gemm_status_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::te::fail(TE_ERROR_CUBLAS, #expr " failed: ", cublasLtGetStatusName(te_gemm_status_), " (", \
                 cublasLtGetStatusString(te_gemm_status_), ")");                                   \
  } while (0)

#define TE_GEMM_CHECK_CUDA(expr)                                                           \
  do {                                                                                     \
    const cudaError_t te_gemm_error_ = (expr);                                             \
    if (te_gemm_error_ != cudaSuccess)                                                     \
      ::te::fail(TE_ERROR_CUDA, #expr " failed: ", cudaGetErrorName(te_gemm_error_), " (", \
                 cudaGetErrorString(te_gemm_error_), ")");                                 \
  } while (0)

// After a kernel launch: reports launch-configuration errors (not asynchronous
// faults, which surface at the caller's next synchronization).
#define TE_GEMM_CHECK_LAUNCH() TE_GEMM_CHECK_CUDA(cudaGetLastError())
