// The native path of te/gemm_block.h: cuBLASLt's block-scaled kernels, run
// through te_gemm's CUDA plan (gemm/cuda.cu) with the operands' block scale
// modes. The block scales go to cuBLASLt as stored:
//   FP8 block (Hopper)   VEC128_32F: FP32 [cdiv(K,128), rows] with the rows
//                        contiguous; BLK128x128_32F: FP32 [cdiv(rows,128),
//                        pad4(cdiv(K,128))] with the K-blocks contiguous. These
//                        are the GEMM-ready layouts of te/fp8_block.h (pad4(rows)
//                        == rows, since native needs rows % 16 == 0).
//   MXFP8 / NVFP4 (10.x) VEC32_UE8M0 / VEC16_UE4M3 in the swizzled 128x4-tile
//                        layout; NVFP4's two global decode scales multiply
//                        alpha, which a one-thread kernel writes to the
//                        workspace for cuBLASLt's device pointer mode.
// te_gemm's plan keeps the Linear-layer epilogues (bias, C) and its fallback
// to an unfused epilogue; the plan never transposes block-scaled operands.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "gemm_block/backend.h"
#include "nvfp4/formulas.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"

namespace te::gemm_block::native {
namespace {

constexpr size_t kFp8BlockMinLt = 120900;      // cuBLASLt 12.9: VEC128_32F, BLK128x128_32F
constexpr size_t kMicroscalingMinLt = 120800;  // cuBLASLt 12.8: VEC32_UE8M0, VEC16_UE4M3

gemm::ScaleMode scale_mode(te_scaling_mode s) {
  switch (s) {
    case TE_SCALING_FP8_BLOCK_1D: return gemm::ScaleMode::kVec128Fp32;
    case TE_SCALING_FP8_BLOCK_2D: return gemm::ScaleMode::kBlock128Fp32;
    case TE_SCALING_MXFP8: return gemm::ScaleMode::kVec32Ue8m0;
    default: return gemm::ScaleMode::kVec16Ue4m3;
  }
}

int compute_capability_major(int device) {
  int major = 0;
  TE_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

bool is_nvfp4(const BlockGemm& g) { return g.a.scaling == TE_SCALING_NVFP4; }

// The NVFP4 workspace starts with {alpha * S_dec(a) * S_dec(b), beta, 0}.
constexpr size_t kAlphaSlot = kAlignment;

// te_gemm's arguments with the stored operands and their block scales.
gemm::GemmArgs native_args(const BlockGemm& g, const float* device_alpha_beta) {
  gemm::GemmArgs d = g.dense;
  d.a = gemm::Operand{g.a.data,  g.a.dtype, nullptr, g.dense.a.trans, scale_mode(g.a.scaling),
                      g.a.scales};
  d.b = gemm::Operand{g.b.data,  g.b.dtype, nullptr, g.dense.b.trans, scale_mode(g.b.scaling),
                      g.b.scales};
  d.use_split_accumulator = true;  // block-scaled kernels have no fast-accumulation mode
  d.device_alpha_beta = device_alpha_beta;
  return d;
}

// S_dec = 1 / S_enc(amax) of each operand, exactly as NVFP4 dequantization
// computes them (te/nvfp4.h); alpha * S_dec(a) * S_dec(b) in that order.
__global__ void nvfp4_alpha_beta_kernel(float* out, const float* amax_a, const float* amax_b,
                                        float alpha, float beta) {
  const float dec_a = nvfp4::global_decode_scale(nvfp4::global_encode_scale(*amax_a));
  const float dec_b = nvfp4::global_decode_scale(nvfp4::global_encode_scale(*amax_b));
  out[0] = __fmul_rn(__fmul_rn(alpha, dec_a), dec_b);
  out[1] = beta;
  out[2] = 0.0f;
}

}  // namespace

bool eligible(const BlockGemm& g) {
  if (!g.block || !g.on_cuda || g.force_emulation) return false;
  const int64_t m = g.dense.m, n = g.dense.n, k = g.dense.k;
  if (m <= 0 || n <= 0 || k <= 0 || m % 16 != 0 || n % 16 != 0) return false;
  const bool both_e5m2 = g.a.dtype == TE_DTYPE_FLOAT8E5M2 && g.b.dtype == TE_DTYPE_FLOAT8E5M2;
  if (both_e5m2) return false;
  const int major = compute_capability_major(g.dense.device_index);
  const size_t lt = cublasLtGetVersion();
  switch (g.a.scaling) {
    case TE_SCALING_FP8_BLOCK_1D:
    case TE_SCALING_FP8_BLOCK_2D: {
      // cuBLASLt pairs 1-D x 1-D, 1-D x 2-D and 2-D x 1-D, on Hopper only. Whole
      // blocks only (the reference library's shape rule): no block cut by K, and
      // no 128x128 tile cut by its operand's rows.
      const bool a_2d = g.a.scaling == TE_SCALING_FP8_BLOCK_2D;
      const bool b_2d = g.b.scaling == TE_SCALING_FP8_BLOCK_2D;
      return major == 9 && lt >= kFp8BlockMinLt && !(a_2d && b_2d) && k % 128 == 0 &&
             (!a_2d || m % 128 == 0) && (!b_2d || n % 128 == 0);
    }
    case TE_SCALING_MXFP8:
      return major == 10 && lt >= kMicroscalingMinLt && g.a.swizzled && g.b.swizzled;
    case TE_SCALING_NVFP4:
      return major == 10 && lt >= kMicroscalingMinLt && g.a.swizzled && g.b.swizzled && k % 32 == 0;
    default: return false;
  }
}

bool supported(const BlockGemm& g, size_t* workspace_bytes) {
  // The alpha pointer's value does not matter to the heuristic, only the mode.
  static const float kHeuristicOnly[3] = {};
  gemm::GemmArgs d = native_args(g, is_nvfp4(g) ? kHeuristicOnly : nullptr);
  d.workspace = nullptr;
  size_t lt_bytes = 0;
  const bool ok = gemm::cuda::lt_supported(d, &lt_bytes);
  *workspace_bytes = kAlignment + (is_nvfp4(g) ? kAlphaSlot : 0) + lt_bytes;
  return ok;
}

void run(const BlockGemm& g, void* workspace, size_t workspace_bytes, te_stream stream) {
  char* base = align_up(workspace);
  const float* alpha_beta = nullptr;
  if (is_nvfp4(g)) {
    float* slot = reinterpret_cast<float*>(base);
    nvfp4_alpha_beta_kernel<<<1, 1, 0, cuda_stream(stream)>>>(slot, g.a.amax, g.b.amax,
                                                              g.dense.alpha, g.dense.beta);
    TE_CHECK_LAUNCH();
    alpha_beta = slot;
    base += kAlphaSlot;
  }
  gemm::GemmArgs d = native_args(g, alpha_beta);
  d.workspace = base;
  d.workspace_bytes = workspace_bytes - static_cast<size_t>(base - static_cast<char*>(workspace));
  gemm::cuda::gemm(d, stream);
}

}  // namespace te::gemm_block::native
