// Backends of the GEMM family (see te/gemm.h for the math). api.cpp validates
// every argument, then hands the backends one GemmArgs with consistent types,
// shapes and non-null pointers for everything that is present.
#pragma once

#include <cstddef>
#include <cstdint>

#include "te/gemm.h"
#include "te/types.h"

namespace te::gemm {

// How cuBLASLt reads an operand's scales. kScalar is te_gemm's per-tensor
// scale_inv; the others are block scales, used only by the native paths of
// te/gemm_block.h (CUDA backend; the CPU backend never sees them).
enum class ScaleMode { kScalar, kVec128Fp32, kBlock128Fp32, kVec32Ue8m0, kVec16Ue4m3 };

// One input matrix. op(A) is [m, k] and op(B) is [k, n]; `trans` says that
// the operand is stored transposed (A as [k, m], B as [n, k]), row-major.
struct Operand {
  const void* data;
  te_dtype dtype;          // FP32, BF16, FP16, E4M3 or E5M2 (te_gemm); FP4 (block-scaled)
  const float* scale_inv;  // FP8 only (else null): element = float(q) * *scale_inv
  bool trans;
  ScaleMode scale_mode = ScaleMode::kScalar;
  const void* block_scales = nullptr;  // the scale array, when scale_mode is not kScalar
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
  // CUDA, NVFP4 native path only: {alpha, beta, 0} on the device, read by
  // cuBLASLt in device pointer mode (the global scales fold into alpha there).
  const float* device_alpha_beta = nullptr;

  // FP8 or (block-scaled only) FP4: the narrow tensor-core inputs, which share
  // cuBLASLt's scale-pointer, bias-type and output rules.
  bool fp8_inputs() const {
    return a.dtype == TE_DTYPE_FLOAT8E4M3 || a.dtype == TE_DTYPE_FLOAT8E5M2 ||
           a.dtype == TE_DTYPE_FLOAT4E2M1;
  }
  bool block_scaled() const { return a.scale_mode != ScaleMode::kScalar; }
  bool fp8_output() const {
    return d_dtype == TE_DTYPE_FLOAT8E4M3 || d_dtype == TE_DTYPE_FLOAT8E5M2;
  }
};

// te_gemm's validation (gemm/api.cpp), shared with te/gemm_block.h: every
// argument but the workspace. size_only: NULL data pointers are allowed (the
// workspace-size queries).
GemmArgs check_params(const te_gemm_params* params, bool size_only);

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
// Whether cuBLASLt has a kernel for this GEMM (its fused plan, else the
// unfused one) and the workspace bytes that plan takes; reads no data.
bool lt_supported(const GemmArgs& args, size_t* workspace_bytes);
}  // namespace cuda
#endif

}  // namespace te::gemm
