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
//     bias' type). With a BF16/FP16 D the fused epilogue may round the product
//     to D's type before adding the bias (up to 2 roundings of D's type instead
//     of 1; measured on H200 + cuBLASLt 13.1, modelled in docs/numerics.md and
//     tests/gemm_reference.py). We keep it: every Linear with a bias uses it,
//     the alternative costs an FP32 [M, N] round trip, and rounding the
//     product to D's type then adding the bias in our kernel is no better;
//   - GELU_AUX(_BIAS): non-FP8 only, D and pre_gelu_out FP32, N % 8 == 0 (the
//     aux leading dimension must be a multiple of 8). With BF16/FP16 outputs
//     cuBLASLt's GELU epilogue was measured (H200, cuBLASLt 13.1) beyond one
//     rounding of the output type on both pre_gelu_out (0.9 ulp without a
//     bias, 1.14 with one) and D, and no documentation says what it does, so
//     16-bit GELU runs unfused: FP32 product, then our epilogue kernel (cost:
//     an extra FP32 [M, N] write + read, ~20% of a BF16 FC1 GEMM's time);
//   - bias_grad is never fused (BGRADA/BGRADB): with an FP16 output cuBLASLt
//     13.1 was measured 2.9 ulp off, and a gradient deserves FP32 sums. Our
//     row-sum kernels read op(A) once more (memory-bound: about 5% of a BF16
//     wgrad GEMM at training sizes) and write [splits, M] FP32 partials to the
//     workspace, reduced in a fixed order (deterministic).
// Unfused epilogues use an FP32 intermediate: D itself when D is FP32, else a
// [M, N] FP32 buffer in the workspace.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gemm/backend.h"

namespace te::gemm {

enum class LtEpilogue { kDefault, kBias, kGeluAux, kGeluAuxBias };

struct CudaPlan {
  bool run_matmul = false;       // false when M, N or K is 0
  bool transpose_a = false;      // FP8 A stored [K, M]: copy it to [M, K] in the workspace
  bool transpose_b = false;      // FP8 B stored [K, N]: copy it to [N, K] in the workspace
  bool matmul_into_tmp = false;  // cuBLASLt writes the FP32 buffer, not D
  te_dtype matmul_out_dtype = TE_DTYPE_FLOAT32;
  bool matmul_applies_c = false;  // else the epilogue kernel adds beta * C
  te_dtype c_layout_dtype = TE_DTYPE_FLOAT32;
  LtEpilogue lt_epilogue = LtEpilogue::kDefault;
  te_dtype lt_bias_dtype = TE_DTYPE_FLOAT32;  // type of BIAS_POINTER
  bool lt_fp8_output = false;                 // D_SCALE_POINTER (+ AMAX_D_POINTER) through cuBLASLt
  bool lt_amax = false;                       // cuBLASLt writes amax to the workspace slot
  bool epilogue_kernel = false;   // our kernel: C, bias, GELU, conversion of the FP32 values
  bool bias_grad_kernel = false;  // our row-sum kernels for bias_grad
  int64_t bias_grad_splits = 1;   // K is cut into this many parts (> 1: partials in workspace)
  bool amax_combine = false;      // d_amax = max(d_amax, workspace slot)

  // Workspace layout: byte offsets from the caller's pointer rounded up to 256.
  size_t lt_workspace_offset = 0, lt_workspace_bytes = 0;
  size_t a_t_offset = 0, b_t_offset = 0, tmp_offset = 0, amax_offset = 0;
  size_t bias_grad_offset = 0;  // [bias_grad_splits, M] FP32 partial sums
  // Three 16-byte slots for the FP8 scale pointers (A, B, D): cuBLASLt rejects
  // (CUBLAS_STATUS_NOT_SUPPORTED at launch) scale pointers that are not 16-byte
  // aligned, e.g. a scale_inv that is element 1 of a small stats tensor.
  size_t scale_slots_offset = 0;
  size_t total_bytes = 0;  // what te_gemm_workspace_size reports (0 = none needed)
};

// cuBLASLt workspace reserved in every plan that calls cuBLASLt: what Hopper
// heuristics use for their best kernels (NVIDIA's cublasSetWorkspace advice;
// torch sets the same 32 MiB for cuBLAS on sm90).
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
constexpr size_t kWorkspaceAlignment = 256;
constexpr size_t kScaleSlotBytes = 16;

// allow_fusion = false gives the plan with every epilogue unfused: the fallback
// when cuBLASLt's heuristic rejects a fused configuration.
CudaPlan make_cuda_plan(const GemmArgs& args, bool allow_fusion);

// How the bias_grad kernels cut K (a function of the shape only, so that the
// workspace size never depends on pointers): enough (row, part) or
// (column block, part) work items to fill the GPU, at most 128 parts and at
// most 8 MiB of partial sums. K elements per part: ceil(K / splits), rounded
// up to a multiple of 16 when A is stored [M, K] (whole 16-byte vectors).
int64_t bias_grad_splits(int64_t m, int64_t k, bool a_stored_k_by_m);

}  // namespace te::gemm
