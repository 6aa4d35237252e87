// CUDA backend of te_gemm: one cublasLtMatmul, plus our small kernels where
// cuBLASLt cannot do the work (see cuda_plan.h for the rules and kernels.h
// for the kernels). No device allocation (the caller's workspace only), no
// synchronization; everything is enqueued on the caller's stream.
//
// Row-major D [M, N] is column-major D^T [N, M], and D^T = op(B)^T op(A)^T: the
// cuBLASLt call takes our B as its first operand and our A as its second, with
// m = N, n = M. A row-major matrix stored [r, c] is a column-major [c, r]
// matrix with leading dimension c, which fixes every layout below.
#include <cstdint>

#include "gemm/backend.h"
#include "gemm/cublas_check.h"
#include "gemm/cublaslt.h"
#include "gemm/cuda_plan.h"
#include "gemm/kernels.h"
#include "runtime/tensor.h"

namespace te::gemm::cuda {
namespace {

char* aligned_base(void* workspace) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(workspace);
  return reinterpret_cast<char*>((p + kWorkspaceAlignment - 1) / kWorkspaceAlignment *
                                 kWorkspaceAlignment);
}

// A cuBLASLt operand whose op() is p x q (column-major), from a row-major
// buffer stored [p, q] (= column-major [q, p], so op = T) or [q, p] (op = N).
LtMatrix lt_operand(const void* data, te_dtype dtype, int64_t p, int64_t q, bool stored_pq) {
  LtMatrix x;
  x.data = data;
  x.dtype = dtype;
  x.trans = stored_pq;
  x.rows = static_cast<uint64_t>(stored_pq ? q : p);
  x.cols = static_cast<uint64_t>(stored_pq ? p : q);
  x.ld = stored_pq ? q : p;
  return x;
}

LtCall make_call(const GemmArgs& g, const CudaPlan& plan, char* ws) {
  LtCall call;
  call.device = g.device_index;
  call.m = static_cast<uint64_t>(g.n);
  call.n = static_cast<uint64_t>(g.m);
  call.k = static_cast<uint64_t>(g.k);
  // First operand: our B, op = [N, K]; stored [N, K] with transb or as the FP8 copy.
  call.a = lt_operand(plan.transpose_b ? ws + plan.b_t_offset : g.b.data, g.b.dtype, g.n, g.k,
                      g.b.trans || plan.transpose_b);
  // Second operand: our A, op = [K, M]; stored [K, M] with transa unless copied to [M, K].
  call.b = lt_operand(plan.transpose_a ? ws + plan.a_t_offset : g.a.data, g.a.dtype, g.k, g.m,
                      g.a.trans && !plan.transpose_a);
  call.d = plan.matmul_into_tmp ? static_cast<void*>(ws + plan.tmp_offset) : g.d;
  call.d_dtype = plan.matmul_out_dtype;
  call.alpha = g.alpha;
  if (plan.matmul_applies_c && g.c.present()) {
    call.c = g.c.data;
    call.beta = g.beta;
  } else {
    // beta = 0: C is not read. A high-precision D doubles as C (same layout);
    // an FP8 D has a C layout of another type, so no C pointer at all.
    call.c = plan.lt_fp8_output ? nullptr : call.d;
    call.beta = 0.0f;
  }
  call.c_dtype = plan.c_layout_dtype;
  call.epilogue = plan.lt_epilogue;
  call.bias_dtype = plan.lt_bias_dtype;
  switch (plan.lt_epilogue) {
    case LtEpilogue::kBias:
    case LtEpilogue::kGeluAuxBias:
      call.bias = g.bias.data;
      // FP8 kernels need the bias type spelled out; otherwise it is D's type
      // (the plan only fuses that case), so leave cuBLASLt's default.
      call.set_bias_dtype = g.fp8_inputs();
      break;
    default: break;
  }
  if (plan.lt_epilogue == LtEpilogue::kGeluAux || plan.lt_epilogue == LtEpilogue::kGeluAuxBias)
    call.aux = const_cast<void*>(g.pre_gelu_out.data);
  if (g.fp8_inputs()) {
    call.fp8 = true;
    // cuBLASLt's A is our B.
    call.a_scale = g.block_scaled() ? g.b.block_scales : static_cast<const void*>(g.b.scale_inv);
    call.b_scale = g.block_scaled() ? g.a.block_scales : static_cast<const void*>(g.a.scale_inv);
    call.a_scale_mode = g.b.scale_mode;
    call.b_scale_mode = g.a.scale_mode;
    call.fast_accum = !g.use_split_accumulator && !g.block_scaled();
  }
  if (g.device_alpha_beta) {  // {alpha, beta, 0}: beta, or 0 when C is not applied here
    call.device_alpha = g.device_alpha_beta;
    call.device_beta = g.device_alpha_beta + (call.beta != 0.0f ? 1 : 2);
  }
  if (plan.lt_fp8_output) {
    call.d_scale = g.d_scale;
    if (plan.lt_amax) call.d_amax = reinterpret_cast<float*>(ws + plan.amax_offset);
  }
  call.workspace = ws + plan.lt_workspace_offset;
  call.workspace_bytes = plan.lt_workspace_bytes;
  return call;
}

const char* epilogue_name(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::kBias: return "BIAS";
    case LtEpilogue::kGeluAux: return "GELU_AUX";
    case LtEpilogue::kGeluAuxBias: return "GELU_AUX_BIAS";
    default: return "DEFAULT";
  }
}

[[noreturn]] void fail_no_algo(const GemmArgs& g, const LtCall& call, cublasStatus_t status) {
  fail(TE_ERROR_CUBLAS, "cuBLASLt has no kernel for this GEMM (", cublasLtGetStatusName(status),
       "): M=", g.m, " N=", g.n, " K=", g.k, ", A ", dtype_name(g.a.dtype),
       g.a.trans ? " (transa)" : "", ", B ", dtype_name(g.b.dtype), g.b.trans ? " (transb)" : "",
       ", D ", dtype_name(g.d_dtype), ", cuBLASLt output ", dtype_name(call.d_dtype), ", epilogue ",
       epilogue_name(call.epilogue));
}

// cuBLASLt needs 16-byte aligned scale pointers; a misaligned one is copied
// (4 bytes, on the stream) into its workspace slot first.
const void* aligned_scale(const void* scale, char* slot, cudaStream_t stream) {
  if (scale == nullptr || reinterpret_cast<uintptr_t>(scale) % kScaleSlotBytes == 0) return scale;
  const cudaError_t err =
      cudaMemcpyAsync(slot, scale, sizeof(float), cudaMemcpyDeviceToDevice, stream);
  if (err != cudaSuccess)
    fail(TE_ERROR_CUDA, "copying an FP8 scale to an aligned slot: ", cudaGetErrorString(err));
  return slot;
}

// The plan and cuBLASLt algorithm of a GEMM: the fused plan, else (when the
// heuristic rejects a fused configuration) the unfused one if it fits in
// `available` workspace bytes. status is the heuristic's; no_room: only the
// unfused plan could run and it needs more than `available`.
struct Choice {
  CudaPlan plan;
  LtCall call;
  cublasLtMatmulAlgo_t algo{};
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  cublasStatus_t fused_status = CUBLAS_STATUS_SUCCESS;
  bool no_room = false;
  bool ok() const { return status == CUBLAS_STATUS_SUCCESS && !no_room; }
};

// Chooses before enqueuing anything, so that a fused configuration cuBLASLt
// rejects can still switch to the unfused plan. With `tune_stream`, a large
// high-precision GEMM seen for the first time times its candidates there.
Choice choose(const GemmArgs& g, char* ws, size_t available,
              const cudaStream_t* tune_stream = nullptr) {
  Choice c;
  c.plan = make_cuda_plan(g, /*allow_fusion=*/true);
  if (!c.plan.run_matmul) return c;
  c.call = make_call(g, c.plan, ws);
  c.status = find_lt_algo(c.call, &c.algo, tune_stream);
  if (c.status == CUBLAS_STATUS_SUCCESS) return c;
  const CudaPlan unfused = make_cuda_plan(g, /*allow_fusion=*/false);
  const bool differs = unfused.lt_epilogue != c.plan.lt_epilogue ||
                       unfused.matmul_out_dtype != c.plan.matmul_out_dtype ||
                       unfused.lt_fp8_output != c.plan.lt_fp8_output;
  if (!differs) return c;
  c.fused_status = c.status;
  if (unfused.total_bytes > available) {
    c.no_room = true;
    c.plan = unfused;
    return c;
  }
  c.plan = unfused;
  c.call = make_call(g, c.plan, ws);
  c.status = find_lt_algo(c.call, &c.algo, tune_stream);
  return c;
}

void enqueue(const GemmArgs& g, const Choice& choice, char* ws, cudaStream_t stream) {
  const CudaPlan& plan = choice.plan;
  const LtCall& call = choice.call;
  if (plan.transpose_a)  // A stored [K, M] -> [M, K]
    kernels::transpose_bytes(static_cast<const uint8_t*>(g.a.data),
                             reinterpret_cast<uint8_t*>(ws + plan.a_t_offset), g.k, g.m, stream);
  if (plan.transpose_b)  // B stored [K, N] -> [N, K]
    kernels::transpose_bytes(static_cast<const uint8_t*>(g.b.data),
                             reinterpret_cast<uint8_t*>(ws + plan.b_t_offset), g.k, g.n, stream);
  if (plan.run_matmul) {
    LtCall staged = call;
    if (staged.fp8 || plan.lt_fp8_output) {  // per-tensor scales only: block scales are arrays
      char* slots = ws + plan.scale_slots_offset;
      if (staged.a_scale_mode == ScaleMode::kScalar)
        staged.a_scale = aligned_scale(staged.a_scale, slots, stream);
      if (staged.b_scale_mode == ScaleMode::kScalar)
        staged.b_scale = aligned_scale(staged.b_scale, slots + kScaleSlotBytes, stream);
      staged.d_scale = static_cast<const float*>(
          aligned_scale(staged.d_scale, slots + 2 * kScaleSlotBytes, stream));
    }
    run_lt_matmul(staged, choice.algo, stream);
  }
  if (plan.amax_combine)
    kernels::amax_combine(g.d_amax, reinterpret_cast<const float*>(ws + plan.amax_offset), stream);
  if (plan.epilogue_kernel) {
    kernels::EpilogueArgs e;
    e.m = g.m;
    e.n = g.n;
    if (plan.run_matmul) e.acc = static_cast<const float*>(call.d);  // tmp, or FP32 D in place
    if (!plan.matmul_applies_c && g.c.present()) {
      e.c = g.c.data;
      e.c_dtype = g.c.dtype;
      e.beta = g.beta;
    }
    e.bias = g.bias.data;
    e.bias_dtype = g.bias.dtype;
    e.pre_gelu_out = const_cast<void*>(g.pre_gelu_out.data);
    e.pre_gelu_dtype = g.pre_gelu_out.dtype;
    e.d = g.d;
    e.d_dtype = g.d_dtype;
    e.d_scale = g.d_scale;
    e.d_amax = g.d_amax;
    kernels::epilogue(e, stream);
  }
  if (plan.bias_grad_kernel) {
    kernels::BiasGradArgs b;
    b.m = g.m;
    b.k = g.k;
    b.a = g.a.data;
    b.a_dtype = g.a.dtype;
    b.scale_inv = g.a.scale_inv;
    b.trans = g.a.trans;
    b.splits = plan.bias_grad_splits;
    if (plan.bias_grad_splits > 1)
      b.partials = reinterpret_cast<float*>(ws + plan.bias_grad_offset);
    b.out = const_cast<void*>(g.bias_grad.data);
    b.out_dtype = g.bias_grad.dtype;
    kernels::bias_grad(b, stream);
  }
}

}  // namespace

void gemm(const GemmArgs& g, te_stream stream_handle) {
  char* ws = aligned_base(g.workspace);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const Choice choice = choose(g, ws, g.workspace_bytes, &stream);
  if (choice.no_room)
    fail(TE_ERROR_CUBLAS, "cuBLASLt rejects the fused epilogue of this GEMM (",
         cublasLtGetStatusName(choice.fused_status), ", epilogue ",
         epilogue_name(make_cuda_plan(g, true).lt_epilogue), ") and the unfused fallback needs ",
         choice.plan.total_bytes, " bytes of workspace, got ", g.workspace_bytes);
  if (choice.status != CUBLAS_STATUS_SUCCESS) fail_no_algo(g, choice.call, choice.status);
  enqueue(g, choice, ws, stream);
}

bool lt_supported(const GemmArgs& g, size_t* workspace_bytes) {
  const Choice choice = choose(g, aligned_base(g.workspace), SIZE_MAX);
  *workspace_bytes = choice.plan.total_bytes;
  return choice.ok();
}

}  // namespace te::gemm::cuda
