// How the CUDA backend runs one te_gemm call: what cuBLASLt fuses, which
// small kernels of ours run around it, and where each piece of the caller's
// workspace goes. Pure host logic (no CUDA headers), so te_gemm_workspace_size
// and the backend agree by construction.
//
// cuBLASLt is column-major; a row-major [M, N] D is a column-major [N, M]
// matrix, so the call computes D^T = op(B)^T op(A)^T: cuBLASLt's first operand
// is our B and its second is our A (transa/transb swap roles accordingly).
//
// What is fused (everything else falls back to our kernels, see cuda.cu):
//   - output types cuBLASLt writes: non-FP8 T x T -> T or FP32; FP8 -> FP32,
//     BF16, FP16, E4M3, and E5M2 only when an input is E5M2;
//   - C: D's type (high-precision D); not with an FP8 D;
//   - bias: D's type (non-FP8); for FP8 inputs BF16 with FP32/BF16 D, FP16 with
//     FP16 D, and BF16/FP16 with FP8 D (cuBLASLt's C layout then takes the
//     bias' type);
//   - GELU_AUX(_BIAS): non-FP8 only, pre_gelu_out of D's type, N % 8 == 0
//     (the aux leading dimension must be a multiple of 8);
//   - BGRADB (bias_grad): non-FP8, D, inputs and bias_grad of one type, no
//     bias/GELU, A stored transposed (the wgrad GEMM layout).
// Unfused epilogues use an FP32 intermediate: D itself when D is FP32, else a
// [M, N] FP32 buffer in the workspace.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gemm/backend.h"

namespace te::gemm {

enum class LtEpilogue { kDefault, kBias, kGeluAux, kGeluAuxBias, kBgradB };

struct CudaPlan {
  bool run_matmul = false;   // false when M, N or K is 0
  bool transpose_a = false;  // FP8 A stored [K, M]: copy it to [M, K] in the workspace
  bool transpose_b = false;  // FP8 B stored [K, N]: copy it to [N, K] in the workspace
  bool matmul_into_tmp = false;  // cuBLASLt writes the FP32 buffer, not D
  te_dtype matmul_out_dtype = TE_DTYPE_FLOAT32;
  bool matmul_applies_c = false;  // else the epilogue kernel adds beta * C
  te_dtype c_layout_dtype = TE_DTYPE_FLOAT32;
  LtEpilogue lt_epilogue = LtEpilogue::kDefault;
  te_dtype lt_bias_dtype = TE_DTYPE_FLOAT32;  // type of BIAS_POINTER (bias or bias_grad)
  bool lt_fp8_output = false;  // D_SCALE_POINTER (+ AMAX_D_POINTER) through cuBLASLt
  bool lt_amax = false;        // cuBLASLt writes amax to the workspace slot
  bool epilogue_kernel = false;   // our kernel: C, bias, GELU, conversion of the FP32 values
  bool bias_grad_kernel = false;  // our row-sum kernel for bias_grad
  bool amax_combine = false;      // d_amax = max(d_amax, workspace slot)

  // Workspace layout: byte offsets from the caller's pointer rounded up to 256.
  size_t lt_workspace_offset = 0, lt_workspace_bytes = 0;
  size_t a_t_offset = 0, b_t_offset = 0, tmp_offset = 0, amax_offset = 0;
  size_t total_bytes = 0;  // what te_gemm_workspace_size reports (0 = none needed)
};

// cuBLASLt workspace reserved in every plan that calls cuBLASLt (what Hopper
// heuristics use for their best kernels).
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
constexpr size_t kWorkspaceAlignment = 256;

// allow_fusion = false gives the plan with every epilogue unfused: the fallback
// when cuBLASLt's heuristic rejects a fused configuration.
CudaPlan make_cuda_plan(const GemmArgs& args, bool allow_fusion);

}  // namespace te::gemm
