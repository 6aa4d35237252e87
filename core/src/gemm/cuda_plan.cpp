// The CUDA backend's plan (see cuda_plan.h for the fusion rules and why).
#include "gemm/cuda_plan.h"

#include <algorithm>

namespace te::gemm {
namespace {

bool is_half_type(te_dtype t) { return t == TE_DTYPE_BFLOAT16 || t == TE_DTYPE_FLOAT16; }

size_t align_up(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// Can cuBLASLt write D's type directly?
bool native_output(const GemmArgs& a) {
  if (!a.fp8_inputs()) return a.d_dtype == a.a.dtype || a.d_dtype == TE_DTYPE_FLOAT32;
  if (a.d_dtype == TE_DTYPE_FLOAT8E5M2)
    return a.a.dtype == TE_DTYPE_FLOAT8E5M2 || a.b.dtype == TE_DTYPE_FLOAT8E5M2;
  return true;  // FP32, BF16, FP16, E4M3
}

// The C layout type cuBLASLt wants with an FP8 D (C itself is never passed
// then): the bias' type, else BF16.
te_dtype fp8_output_c_type(const GemmArgs& a) {
  if (a.bias.present() && is_half_type(a.bias.dtype)) return a.bias.dtype;
  return TE_DTYPE_BFLOAT16;
}

// beta * C inside cuBLASLt: only with C of D's type (high-precision D). With an
// FP8 D the reference library never accumulates either; our kernel adds C.
bool native_c(const GemmArgs& a) {
  if (!a.c.present()) return true;
  return !a.fp8_output() && a.c.dtype == a.d_dtype;
}

// BIAS is fused with 16-bit outputs too, where it may round the product to D's
// type before adding the bias (cuda_plan.h says why we accept that).
bool fusable_bias(const GemmArgs& a) {
  if (!a.bias.present()) return true;
  if (!a.fp8_inputs()) return a.bias.dtype == a.d_dtype;
  switch (a.d_dtype) {
    case TE_DTYPE_FLOAT32: return a.bias.dtype == TE_DTYPE_BFLOAT16;
    case TE_DTYPE_BFLOAT16:
    case TE_DTYPE_FLOAT16: return a.bias.dtype == a.d_dtype;
    default: return a.bias.dtype == fp8_output_c_type(a);  // FP8 D: bias has C's type
  }
}

// GELU_AUX only where its results are FP32 values: its 16-bit outputs were
// measured beyond one rounding (cuda_plan.h).
bool fusable_gelu(const GemmArgs& a) {
  if (!a.pre_gelu_out.present()) return true;
  return !a.fp8_inputs() && a.d_dtype == TE_DTYPE_FLOAT32 &&
         a.pre_gelu_out.dtype == TE_DTYPE_FLOAT32 && a.n % 8 == 0;
}

// The cuBLASLt call and the epilogue around it (M, N, K all > 0).
void plan_matmul(const GemmArgs& args, bool allow_fusion, CudaPlan& p) {
  p.run_matmul = true;
  if (args.fp8_inputs() && !args.block_scaled()) {
    // Hopper FP8 kernels are "TN" only: cuBLASLt's first operand (our B) must be
    // transposed, i.e. B stored [N, K], and the second (our A) not: A stored [M, K].
    // (Block-scaled operands arrive in a layout their kernels take, with scales
    // that a byte transpose would not move: te/gemm_block.h.)
    p.transpose_a = args.a.trans;
    p.transpose_b = !args.b.trans;
  }
  const bool fused = allow_fusion && native_output(args) && native_c(args) && fusable_bias(args) &&
                     fusable_gelu(args);
  if (fused) {
    p.matmul_out_dtype = args.d_dtype;
    p.matmul_applies_c = true;
    p.c_layout_dtype = args.fp8_output() ? fp8_output_c_type(args) : args.d_dtype;
    const bool bias = args.bias.present(), gelu = args.pre_gelu_out.present();
    if (gelu) {
      p.lt_epilogue = bias ? LtEpilogue::kGeluAuxBias : LtEpilogue::kGeluAux;
    } else if (bias) {
      p.lt_epilogue = LtEpilogue::kBias;
    }
    if (bias) p.lt_bias_dtype = args.bias.dtype;
    if (args.fp8_output()) {
      p.lt_fp8_output = true;
      // cuBLASLt overwrites its amax; te_gemm max-accumulates into d_amax.
      p.lt_amax = p.amax_combine = args.d_amax != nullptr;
    }
  } else {
    p.matmul_out_dtype = TE_DTYPE_FLOAT32;
    p.matmul_into_tmp = args.d_dtype != TE_DTYPE_FLOAT32;
    // C has D's type when D is FP32, so cuBLASLt can add it in place.
    p.matmul_applies_c = !p.matmul_into_tmp;
    p.c_layout_dtype = TE_DTYPE_FLOAT32;
    p.epilogue_kernel = p.matmul_into_tmp || args.bias.present() || args.pre_gelu_out.present();
  }
}

}  // namespace

int64_t bias_grad_splits(int64_t m, int64_t k, bool a_stored_k_by_m) {
  constexpr int64_t kMaxSplits = 128;
  constexpr int64_t kMaxPartialBytes = int64_t(8) << 20;
  // [K, M]: a block of 256 threads sums 128 rows of up to 512 columns;
  // [M, K]: a warp sums 4096 elements of one row.
  const int64_t per_split = a_stored_k_by_m ? 128 : 4096;
  int64_t splits = (k + per_split - 1) / per_split;
  splits = std::min(splits, kMaxSplits);
  splits = std::min(splits, kMaxPartialBytes / (int64_t(sizeof(float)) * std::max<int64_t>(m, 1)));
  return std::max<int64_t>(splits, 1);
}

CudaPlan make_cuda_plan(const GemmArgs& args, bool allow_fusion) {
  CudaPlan p;
  if (args.bias_grad.present() && args.m > 0) {  // needs K only, whatever N is
    p.bias_grad_kernel = true;
    p.bias_grad_splits = bias_grad_splits(args.m, args.k, args.a.trans);
  }
  if (args.m > 0 && args.n > 0) {
    if (args.k == 0) {
      // op(A) op(B) is 0: D = epilogue(beta * C + bias), all in our kernel.
      p.epilogue_kernel = true;
    } else {
      plan_matmul(args, allow_fusion, p);
    }
  }

  // Workspace layout.
  size_t offset = 0;
  auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset += align_up(bytes);
    return at;
  };
  const size_t m = static_cast<size_t>(args.m), n = static_cast<size_t>(args.n),
               k = static_cast<size_t>(args.k);
  if (p.run_matmul) {
    p.lt_workspace_bytes = kLtWorkspaceBytes;
    p.lt_workspace_offset = take(p.lt_workspace_bytes);
  }
  if (p.transpose_a) p.a_t_offset = take(m * k);
  if (p.transpose_b) p.b_t_offset = take(n * k);
  if (p.matmul_into_tmp) p.tmp_offset = take(m * n * sizeof(float));
  if (p.lt_amax) p.amax_offset = take(sizeof(float));
  if (p.run_matmul && (args.fp8_inputs() || p.lt_fp8_output))
    p.scale_slots_offset = take(3 * kScaleSlotBytes);
  if (p.bias_grad_kernel && p.bias_grad_splits > 1)
    p.bias_grad_offset = take(static_cast<size_t>(p.bias_grad_splits) * m * sizeof(float));
  // + slack so that any caller pointer can be rounded up to the alignment.
  p.total_bytes = offset == 0 ? 0 : offset + kWorkspaceAlignment;
  return p;
}

size_t cuda_workspace_size(const GemmArgs& args) {
  return make_cuda_plan(args, /*allow_fusion=*/true).total_bytes;
}

}  // namespace te::gemm
