// The block-scaled GEMM family (te/gemm_block.h). api.cpp validates every
// argument once and builds one BlockGemm; the paths below run it:
//   dense     NONE / TENSOR operands: te_gemm's backends as they are;
//   emulated  each operand dequantized (CPU: FP32 host scratch; CUDA: BF16 in
//             the workspace), then te_gemm's backends (emulate.cpp);
//   native    cuBLASLt's block-scaled kernels through te_gemm's CUDA plan with
//             block scale modes (native.cu, CUDA builds only).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gemm/backend.h"
#include "te/fp8_block.h"
#include "te/gemm_block.h"

namespace te::gemm_block {

// One block-scaled operand as stored, viewed as the matrix [rows, cols]
// (cols = the stored last dim; logical elements for FP4).
struct BlockOperand {
  te_scaling_mode scaling = TE_SCALING_NONE;
  const void* data = nullptr;
  te_dtype dtype = TE_DTYPE_FLOAT32;
  int64_t rows = 0, cols = 0;
  const void* scales = nullptr;            // FP32 (FP8 block), E8M0 (MXFP8) or E4M3 (NVFP4)
  int64_t scale_rows = 0, scale_cols = 0;  // the scale array's matrix shape
  const float* amax = nullptr;             // NVFP4: the global amax of this copy
  bool swizzled = false;                   // MXFP8 / NVFP4 scales in the swizzled layout
  bool columnwise = false;                 // MXFP8: 32x1 blocks down the stored columns
};

struct BlockGemm {
  // te_gemm's arguments with the epilogue (C, D, bias, alpha, beta) validated
  // by te_gemm's own rules; for block formats its operands are placeholders
  // that the paths fill in (dequantized buffers or the FP8/FP4 data).
  gemm::GemmArgs dense;
  bool block = false;  // false: NONE / TENSOR, run `dense` as it is
  BlockOperand a, b;   // block formats only
  bool force_emulation = false;
  bool on_cuda = false;
};

// Where the operand family lives: the FP8 block modes share one family.
inline bool is_fp8_block(te_scaling_mode s) {
  return s == TE_SCALING_FP8_BLOCK_1D || s == TE_SCALING_FP8_BLOCK_2D;
}

constexpr size_t kAlignment = 256;
inline size_t align_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
inline char* align_up(void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<char*>((v + kAlignment - 1) / kAlignment * kAlignment);
}

// Checks every argument (validate.cpp). size_only: the data pointers are not
// read (the plan queries); they may be NULL.
BlockGemm validate(const te_gemm_block_params* params, bool size_only);

// Emulated path (emulate.cpp).
namespace emulated {
// Workspace bytes on CUDA (the dequantized BF16 operands, unswizzled NVFP4
// scales and te_gemm's own workspace); the CPU needs none.
size_t cuda_workspace_size(const BlockGemm& g);
void run_cpu(const BlockGemm& g);
#ifdef TE_WITH_CUDA
void run_cuda(const BlockGemm& g, void* workspace, size_t workspace_bytes, te_stream stream);
#endif
}  // namespace emulated

#ifdef TE_WITH_CUDA
// Native path (native.cu, CUDA builds only).
namespace native {
// The device, library and shape conditions of te/gemm_block.h (not the heuristic).
bool eligible(const BlockGemm& g);
// Whether cuBLASLt's heuristic has a kernel, and the workspace bytes it takes.
bool supported(const BlockGemm& g, size_t* workspace_bytes);
void run(const BlockGemm& g, void* workspace, size_t workspace_bytes, te_stream stream);
}  // namespace native
#endif

}  // namespace te::gemm_block
