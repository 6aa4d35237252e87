// Backends of the GEMM family (see te/gemm.h for the math). api.cpp validates
// every argument, then hands the backends one GemmArgs with consistent types,
// shapes and non-null pointers for everything that is present.
#pragma once

#include <cstddef>
#include <cstdint>

#include "te/types.h"

namespace te::gemm {

// One input matrix. op(A) is [m, k] and op(B) is [k, n]; `trans` says that
// the operand is stored transposed (A as [k, m], B as [n, k]), row-major.
struct Operand {
  const void* data;
  te_dtype dtype;          // FP32, BF16, FP16, E4M3 or E5M2
  const float* scale_inv;  // FP8 only (else null): element = float(q) * *scale_inv
  bool trans;
};

// An optional tensor: data == nullptr when absent.
struct Optional {
  const void* data = nullptr;
  te_dtype dtype = TE_DTYPE_FLOAT32;
  bool present() const { return data != nullptr; }
};

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  Operand a{}, b{};
  float alpha = 1.0f;
  float beta = 0.0f;  // 0 whenever c is absent; c is dropped by api.cpp when beta == 0
  Optional c;         // [m, n], may alias d
  void* d = nullptr;  // [m, n]
  te_dtype d_dtype = TE_DTYPE_FLOAT32;
  const float* d_scale = nullptr;  // FP8 D only
  float* d_amax = nullptr;         // FP8 D only, optional: max-accumulated
  Optional bias;                   // [n]
  Optional pre_gelu_out;           // [m, n]: present = GELU epilogue on
  Optional bias_grad;              // [m]
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool use_split_accumulator = true;
  int device_index = 0;

  bool fp8_inputs() const {
    return a.dtype == TE_DTYPE_FLOAT8E4M3 || a.dtype == TE_DTYPE_FLOAT8E5M2;
  }
  bool fp8_output() const {
    return d_dtype == TE_DTYPE_FLOAT8E4M3 || d_dtype == TE_DTYPE_FLOAT8E5M2;
  }
};

namespace cpu {
// Needs no workspace: host scratch is allocated internally.
void gemm(const GemmArgs& args);
}  // namespace cpu

// Bytes of device workspace the CUDA backend needs (pointers are not read).
// Pure host logic, available in every build (see cuda_plan.h).
size_t cuda_workspace_size(const GemmArgs& args);

#ifdef TE_WITH_CUDA
namespace cuda {
void gemm(const GemmArgs& args, te_stream stream);
}  // namespace cuda
#endif

}  // namespace te::gemm
