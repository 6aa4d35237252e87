// C entry points of the attention family: validate once (validate.cpp), then
// run the CPU backend for host tensors; on CUDA, cuDNN's fused attention when
// this build has it (TE_WITH_CUDNN) and it supports the combination, else the
// core's own CUDA kernel (TE_ATTENTION_FALLBACK). Both passes of a training
// step make the same choice: it depends on the shared Inputs only.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "attention/backend.h"
#include "attention/validate.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "te/attention.h"

namespace te::attention {
namespace {

InputTensors shared_tensors(const te_attention_fwd_params& p) {
  return {p.q,
          p.k,
          p.v,
          p.bias,
          p.alibi_slopes,
          p.cu_seqlens_q,
          p.cu_seqlens_kv,
          p.cu_seqlens_q_padded,
          p.cu_seqlens_kv_padded,
          p.attn_mask,
          p.softmax_offset,
          p.rng_state,
          p.q_scale_inv,
          p.k_scale_inv,
          p.v_scale_inv};
}

InputTensors shared_tensors(const te_attention_bwd_params& p) {
  return {p.q,
          p.k,
          p.v,
          p.bias,
          p.alibi_slopes,
          p.cu_seqlens_q,
          p.cu_seqlens_kv,
          p.cu_seqlens_q_padded,
          p.cu_seqlens_kv_padded,
          p.attn_mask,
          p.softmax_offset,
          p.rng_state,
          nullptr,
          nullptr,
          nullptr};
}

template <class Params>
const Params& require(const Params* p) {
  if (p == nullptr) fail(TE_ERROR_INVALID_ARGUMENT, "argument 'params' is required (got NULL)");
  return *p;
}

// NVTE_FUSED_ATTN=0 (the reference's switch) turns cuDNN's fused attention
// off; the core's own CUDA kernel runs instead. Read at every call (cheap),
// so tests can flip it.
[[maybe_unused]] bool fused_attention_disabled() {
  const char* v = std::getenv("NVTE_FUSED_ATTN");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

#if defined(TE_WITH_CUDNN) && defined(TE_ATTENTION_FALLBACK)
// One line on stderr per combination that falls back (the issue: "warned
// once, naming the combination").
void warn_fallback_once(const Inputs& in, const std::string& why) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  const std::string key =
      concat("format ", in.qkv_format, ", mask ", in.mask_type, ", bias ", in.bias_type,
             ", softmax ", in.softmax_type, ", dtype ", dtype_name(in.dtype), ", d ", in.dims.d,
             ", dv ", in.dims.dv, ", dropout ", in.dropout > 0 ? 1 : 0);
  std::lock_guard<std::mutex> lock(mutex);
  if (!seen.insert(key).second) return;
  std::fprintf(stderr,
               "transformer_engine: attention (%s) runs on the core's CUDA kernel, not cuDNN: %s\n",
               key.c_str(), why.c_str());
}
#endif

// The backend for validated inputs on q's device.
te_attention_backend_kind choose(const Inputs& in, const te_tensor& q) {
  if (!on_cuda(q)) return TE_ATTENTION_BACKEND_CPU;
#if !defined(TE_WITH_CUDA)
  fail_no_cuda();
#else
  std::string why = "NVTE_FUSED_ATTN=0";
#if defined(TE_WITH_CUDNN)
  const bool forced = fused_attention_disabled();
  if (!forced) {
    why.clear();
    if (cudnn::supports(in, &why)) return TE_ATTENTION_BACKEND_CUDNN;
  }
#endif
#if defined(TE_ATTENTION_FALLBACK)
#if defined(TE_WITH_CUDNN)
  if (!forced) warn_fallback_once(in, why);  // asked for, not fallen back to: no warning
#endif
  return TE_ATTENTION_BACKEND_CUDA_FALLBACK;
#else
  fail(TE_ERROR_UNSUPPORTED,
       "attention on CUDA needs cuDNN's fused attention (a TE_WITH_CUDNN build) or the core's "
       "CUDA attention kernel (a TE_ATTENTION_FALLBACK build); this build ",
#if defined(TE_WITH_CUDNN)
       "has no fallback kernel and cuDNN cannot run this call: ", why
#else
       "has neither (pass CPU tensors)"
#endif
  );
#endif
#endif
}

// Forward arguments: everything validated, workspace sized for the backend.
FwdArgs check_args(const te_attention_fwd_params& p, te_attention_backend_kind* backend,
                   bool with_outputs) {
  FwdArgs a{};
  static_cast<Inputs&>(a) = check_inputs(p.config, shared_tensors(p));
  if (on_cuda(*p.q)) use_cuda_device(p.q->device_index);
  *backend = choose(a, *p.q);
  if (!with_outputs) return a;
  check_output(p.o, "o", a, *p.q);
  a.o = p.o->data;
  a.lse = check_lse(p.softmax_lse, "softmax_lse", a, *p.q);
  mark_written(p.o);
  mark_written(p.softmax_lse);
  return a;
}

BwdArgs check_args(const te_attention_bwd_params& p, te_attention_backend_kind* backend,
                   bool with_outputs) {
  BwdArgs a{};
  static_cast<Inputs&>(a) = check_inputs(p.config, shared_tensors(p));
  if (on_cuda(*p.q)) use_cuda_device(p.q->device_index);
  *backend = choose(a, *p.q);
  if (!with_outputs) return a;
  check_output(p.o, "o", a, *p.q);
  check_output(p.d_o, "d_o", a, *p.q);
  a.o = p.o->data;
  a.d_o = p.d_o->data;
  a.lse = check_lse(p.softmax_lse, "softmax_lse", a, *p.q);
  check_like(p.dq, "dq", *p.q, "q", a.dtype);
  check_like(p.dk, "dk", *p.k, "k", a.dtype);
  check_like(p.dv, "dv", *p.v, "v", a.dtype);
  a.dq = p.dq->data;
  a.dk = p.dk->data;
  a.dv = p.dv->data;
  if (p.dbias) {
    if (a.bias == nullptr)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "argument 'dbias' is only for bias_type pre_scale_bias or post_scale_bias (pass NULL)");
    check_like(p.dbias, "dbias", *p.bias, "bias", a.dtype);
    a.dbias = p.dbias->data;
  }
  if (p.dsoftmax_offset) {
    if (a.softmax_type != TE_SOFTMAX_LEARNABLE)
      fail(TE_ERROR_INVALID_ARGUMENT,
           "argument 'dsoftmax_offset' is only for softmax_type learnable (pass NULL)");
    a.dsoftmax_offset = check_per_head(p.dsoftmax_offset, "dsoftmax_offset", a, *p.q);
  }
  for (const te_tensor* out : {p.dq, p.dk, p.dv, p.dbias, p.dsoftmax_offset}) mark_written(out);
  return a;
}

void write_size(size_t* out, size_t bytes) {
  if (out == nullptr) fail(TE_ERROR_INVALID_ARGUMENT, "argument 'workspace_bytes' is required");
  *out = bytes;
}

// Runs the call of the chosen backend; a backend this build lacks is never
// chosen (choose() fails first), so its case is compiled out.
#if defined(TE_WITH_CUDNN)
#define TE_ATTN_CUDNN_CASE(call) \
  case TE_ATTENTION_BACKEND_CUDNN: return call;
#else
#define TE_ATTN_CUDNN_CASE(call)
#endif
#if defined(TE_ATTENTION_FALLBACK)
#define TE_ATTN_FALLBACK_CASE(call) \
  case TE_ATTENTION_BACKEND_CUDA_FALLBACK: return call;
#else
#define TE_ATTN_FALLBACK_CASE(call)
#endif
#define TE_ATTN_SWITCH(backend, cudnn_call, fallback_call, cpu_call) \
  switch (backend) {                                                 \
    TE_ATTN_CUDNN_CASE(cudnn_call)                                   \
    TE_ATTN_FALLBACK_CASE(fallback_call)                             \
    default: return cpu_call;                                        \
  }

// Workspace bytes; the CPU backend allocates its own host scratch.
size_t workspace_bytes(const FwdArgs& a, te_attention_backend_kind backend) {
  TE_ATTN_SWITCH(backend, cudnn::fwd_workspace(a), cuda_fallback::fwd_workspace(a), size_t{0});
}

size_t workspace_bytes(const BwdArgs& a, te_attention_backend_kind backend) {
  TE_ATTN_SWITCH(backend, cudnn::bwd_workspace(a), cuda_fallback::bwd_workspace(a), size_t{0});
}

void run(const FwdArgs& a, te_attention_backend_kind backend, te_stream stream) {
  TE_ATTN_SWITCH(backend, cudnn::forward(a, stream), cuda_fallback::forward(a, stream),
                 cpu::forward(a));
}

void run(const BwdArgs& a, te_attention_backend_kind backend, te_stream stream) {
  TE_ATTN_SWITCH(backend, cudnn::backward(a, stream), cuda_fallback::backward(a, stream),
                 cpu::backward(a));
}

// What the two passes' entry points share (check_args, workspace_bytes and
// run are overloaded on the pass).
template <class Params>
size_t query_workspace(const Params* params) {
  te_attention_backend_kind backend;
  const auto a = check_args(require(params), &backend, false);
  return workspace_bytes(a, backend);
}

template <class Params>
void validate_and_run(const Params* params, te_stream stream) {
  te_attention_backend_kind backend;
  auto a = check_args(require(params), &backend, true);
  a.workspace_bytes = workspace_bytes(a, backend);
  a.workspace = check_workspace(params->workspace, a.workspace_bytes, *params->q);
  run(a, backend, stream);
}

}  // namespace
}  // namespace te::attention

using namespace te;
using namespace te::attention;

extern "C" {

te_status te_attention_fwd_workspace_size(const te_attention_fwd_params* params,
                                          size_t* workspace_bytes) {
  return guarded("te_attention_fwd_workspace_size",
                 [&] { write_size(workspace_bytes, query_workspace(params)); });
}

te_status te_attention_fwd(const te_attention_fwd_params* params, te_stream stream) {
  return guarded("te_attention_fwd", [&] { validate_and_run(params, stream); });
}

te_status te_attention_bwd_workspace_size(const te_attention_bwd_params* params,
                                          size_t* workspace_bytes) {
  return guarded("te_attention_bwd_workspace_size",
                 [&] { write_size(workspace_bytes, query_workspace(params)); });
}

te_status te_attention_bwd(const te_attention_bwd_params* params, te_stream stream) {
  return guarded("te_attention_bwd", [&] { validate_and_run(params, stream); });
}

te_status te_attention_backend(const te_attention_fwd_params* params, int* backend) {
  return guarded("te_attention_backend", [&] {
    if (backend == nullptr) fail(TE_ERROR_INVALID_ARGUMENT, "argument 'backend' is required");
    te_attention_backend_kind kind;
    check_args(require(params), &kind, false);
    *backend = kind;
  });
}

}  // extern "C"
