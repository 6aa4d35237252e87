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
    call.a_scale = g.b.scale_inv;  // cuBLASLt's A is our B
    call.b_scale = g.a.scale_inv;
    call.fast_accum = !g.use_split_accumulator;
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
       ", D ", dtype_name(g.d_dtype), ", cuBLASLt output ", dtype_name(call.d_dtype),
       ", epilogue ", epilogue_name(call.epilogue));
}

}  // namespace

void gemm(const GemmArgs& g, te_stream stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  char* ws = aligned_base(g.workspace);
  CudaPlan plan = make_cuda_plan(g, /*allow_fusion=*/true);

  // Choose the algorithm before enqueuing anything, so that a fused
  // configuration cuBLASLt rejects can still switch to the unfused plan.
  LtCall call;
  cublasLtMatmulAlgo_t algo{};
  if (plan.run_matmul) {
    call = make_call(g, plan, ws);
    cublasStatus_t status = find_lt_algo(call, &algo);
    if (status != CUBLAS_STATUS_SUCCESS) {
      const CudaPlan unfused = make_cuda_plan(g, /*allow_fusion=*/false);
      const bool differs = unfused.lt_epilogue != plan.lt_epilogue ||
                           unfused.matmul_out_dtype != plan.matmul_out_dtype ||
                           unfused.lt_fp8_output != plan.lt_fp8_output;
      if (!differs) fail_no_algo(g, call, status);
      if (unfused.total_bytes > g.workspace_bytes)
        fail(TE_ERROR_CUBLAS, "cuBLASLt rejects the fused epilogue of this GEMM (",
             cublasLtGetStatusName(status), ", epilogue ", epilogue_name(plan.lt_epilogue),
             ") and the unfused fallback needs ", unfused.total_bytes,
             " bytes of workspace, got ", g.workspace_bytes);
      plan = unfused;
      call = make_call(g, plan, ws);
      status = find_lt_algo(call, &algo);
      if (status != CUBLAS_STATUS_SUCCESS) fail_no_algo(g, call, status);
    }
  }

  if (plan.transpose_a)  // A stored [K, M] -> [M, K]
    kernels::transpose_bytes(static_cast<const uint8_t*>(g.a.data),
                             reinterpret_cast<uint8_t*>(ws + plan.a_t_offset), g.k, g.m, stream);
  if (plan.transpose_b)  // B stored [K, N] -> [N, K]
    kernels::transpose_bytes(static_cast<const uint8_t*>(g.b.data),
                             reinterpret_cast<uint8_t*>(ws + plan.b_t_offset), g.k, g.n, stream);
  if (plan.run_matmul) run_lt_matmul(call, algo, stream);
  if (plan.amax_combine)
    kernels::amax_combine(g.d_amax, reinterpret_cast<const float*>(ws + plan.amax_offset),
                          stream);
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

}  // namespace te::gemm::cuda
