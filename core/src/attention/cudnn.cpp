// The cuDNN backend of the attention family (backend.h's te::attention::cudnn):
// which calls it takes, the workspace it needs, and one forward / backward
// call = the aux kernels (cudnn_aux.h) + one cached graph (cudnn_graph.h).
//
// Workspace (the caller's; sized by fwd_workspace / bwd_workspace):
//   [cuDNN's workspace][seqlen_q, seqlen_kv][5 ragged offset arrays]
//   [sink logits (off_by_one: zeros)][dsoftmax_offset partial sums (backward)]
//   [lse copy (backward)]
// each part 256-byte aligned.
#ifdef TE_WITH_CUDNN

#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "attention/backend.h"
#include "attention/cudnn_aux.h"
#include "attention/cudnn_graph.h"
#include "attention/cudnn_loader.h"
#include "runtime/cuda_check.h"
#include "runtime/status.h"

namespace te::attention::cudnn {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool padded(const Inputs& in) {
  return is_padding_mask(in.mask_type) || in.qkv_format == TE_QKV_FORMAT_THD;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// What cuDNN's SDPA (as we map it, cudnn_graph.cpp) cannot express; the
// frontend's own checks (head sizes, versions, combinations) come after.
bool expressible(const Inputs& in, std::string* why) {
  const Dims& d = in.dims;
  if (in.dtype != TE_DTYPE_BFLOAT16 && in.dtype != TE_DTYPE_FLOAT16) {
    *why = "cuDNN fused attention takes BF16 or FP16 inputs only";
  } else if (d.d > 256 || d.dv > 256 || d.d % 8 != 0 || d.dv % 8 != 0) {
    *why = concat("head sizes d=", d.d, ", dv=", d.dv, ": cuDNN needs multiples of 8, at most 256");
  } else if (in.mask_type == TE_ATTN_MASK_ARBITRARY) {
    *why = "arbitrary masks (attn_mask) are not offered to cuDNN";
  } else if (in.bias_type == TE_ATTN_BIAS_PRE_SCALE_BIAS) {
    *why = "pre_scale_bias: cuDNN adds a bias after the scale only";
  } else if (in.bias_type == TE_ATTN_BIAS_ALIBI &&
             (in.alibi_slopes != nullptr || in.mask_type != TE_ATTN_MASK_CAUSAL || d.sq != d.skv ||
              in.window_left >= 0)) {
    *why = "alibi on cuDNN: default slopes with mask causal, sq == skv and no window only";
  } else if (in.qkv_format == TE_QKV_FORMAT_THD &&
             (d.tq + 1) * d.h * (d.d > d.dv ? d.d : d.dv) > INT_MAX) {
    *why = "thd with more than 2^31 elements per tensor";
  } else if (!aligned16(in.q) || !aligned16(in.k) || !aligned16(in.v) ||
             (in.bias && !aligned16(in.bias))) {
    *why = "q, k, v and bias must be 16-byte aligned for cuDNN";
  } else {
    return true;
  }
  return false;
}

// The aux part of the workspace (after cuDNN's).
struct Aux {
  size_t lengths = 0, sink = 0, dsink = 0, lse = 0, bytes = 0;
};

Aux aux_layout(const Inputs& in, bool backward) {
  Aux a;
  const size_t b = static_cast<size_t>(in.dims.b), h = static_cast<size_t>(in.dims.h);
  size_t at = 0;
  a.lengths = at;
  at += align_up((2 * b + 5 * (b + 1)) * sizeof(int32_t));
  a.sink = at;
  at += align_up(h * sizeof(float));
  a.dsink = at;
  if (backward) at += align_up(dsink_partials(in) * sizeof(float));
  a.lse = at;
  if (backward) {
    const size_t rows = in.qkv_format == TE_QKV_FORMAT_THD ? static_cast<size_t>(in.dims.tq)
                                                           : b * static_cast<size_t>(in.dims.sq);
    at += align_up(rows * h * sizeof(float));
  }
  a.bytes = at;
  return a;
}

Lengths lengths_in(const Inputs& in, char* aux) {
  Lengths l;
  if (!padded(in)) return l;
  auto* p = reinterpret_cast<int32_t*>(aux);
  const int64_t b = in.dims.b;
  l.seqlen_q = p;
  l.seqlen_kv = p + b;
  if (in.qkv_format != TE_QKV_FORMAT_THD) return l;
  int32_t* r = p + 2 * b;
  l.ragged_q = r;
  l.ragged_k = r + (b + 1);
  l.ragged_v = r + 2 * (b + 1);
  l.ragged_o = r + 3 * (b + 1);
  l.ragged_stats = r + 4 * (b + 1);
  return l;
}

std::shared_ptr<Graph> need(std::shared_ptr<Graph> g, const std::string& why) {
  if (!g) fail(TE_ERROR_UNSUPPORTED, "cuDNN attention cannot run this call: ", why);
  return g;
}

bool learnable(const Inputs& in) { return in.softmax_type == TE_SOFTMAX_LEARNABLE; }

// Pointers shared by both passes; `aux` is the aux part of the workspace.
struct Common {
  void* ptr[kUidCount] = {};
  int64_t seed = 0, offset = 0;  // host rng values (pass-by-value)
  Lengths lengths;
};

void fill_common(const Inputs& in, char* aux, const Aux& layout, Common* c, cudaStream_t stream) {
  c->ptr[kQ] = const_cast<void*>(in.q);
  c->ptr[kK] = const_cast<void*>(in.k);
  c->ptr[kV] = const_cast<void*>(in.v);
  c->ptr[kBias] = const_cast<void*>(in.bias);
  c->lengths = lengths_in(in, aux + layout.lengths);
  const Lengths& l = c->lengths;
  if (padded(in)) compute_lengths(in, l, stream);
  c->ptr[kSeqLenQ] = l.seqlen_q;
  c->ptr[kSeqLenKv] = l.seqlen_kv;
  c->ptr[kRaggedQ] = l.ragged_q;
  c->ptr[kRaggedK] = l.ragged_k;
  c->ptr[kRaggedV] = l.ragged_v;
  c->ptr[kRaggedO] = l.ragged_o;
  c->ptr[kRaggedStats] = l.ragged_stats;
  if (in.rng_state_device != nullptr) {
    c->ptr[kSeed] = const_cast<int64_t*>(in.rng_state_device);
    c->ptr[kOffset] = const_cast<int64_t*>(in.rng_state_device + 1);
  } else {
    c->seed = static_cast<int64_t>(in.seed);
    c->offset = static_cast<int64_t>(in.offset);
    c->ptr[kSeed] = &c->seed;
    c->ptr[kOffset] = &c->offset;
  }
  if (in.softmax_type == TE_SOFTMAX_OFF_BY_ONE) {  // a zero logit per head
    c->ptr[kSink] = aux + layout.sink;
    TE_CHECK_CUDA(cudaMemsetAsync(c->ptr[kSink], 0, in.dims.h * sizeof(float), stream));
  } else if (learnable(in)) {
    c->ptr[kSink] = const_cast<float*>(in.softmax_offset);
  }
}

}  // namespace

bool supports(const Inputs& in, std::string* why) {
  std::string reason;
  const bool ok = expressible(in, &reason) && library_available(&reason) &&
                  forward_graph(in, &reason) &&
                  backward_graph(in, in.bias_type == TE_ATTN_BIAS_POST_SCALE_BIAS, &reason);
  if (!ok && why != nullptr) *why = reason;
  return ok;
}

size_t fwd_workspace(const FwdArgs& a) {
  std::string why;
  auto g = need(forward_graph(a, &why), why);
  return align_up(workspace_bytes(*g)) + aux_layout(a, false).bytes;
}

// Independent of the optional outputs (dbias): the size query does not see them.
size_t bwd_workspace(const BwdArgs& a) {
  std::string why;
  const bool bias = a.bias_type == TE_ATTN_BIAS_POST_SCALE_BIAS;
  size_t ws = workspace_bytes(*need(backward_graph(a, bias, &why), why));
  if (bias) {
    const size_t other = workspace_bytes(*need(backward_graph(a, false, &why), why));
    ws = other > ws ? other : ws;
  }
  return align_up(ws) + aux_layout(a, true).bytes;
}

void forward(const FwdArgs& a, te_stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  std::string why;
  auto g = need(forward_graph(a, &why), why);
  char* ws = static_cast<char*>(a.workspace);
  const Aux layout = aux_layout(a, false);
  char* aux = ws + align_up(workspace_bytes(*g));
  Common c;
  fill_common(a, aux, layout, &c, s);
  c.ptr[kO] = a.o;
  c.ptr[kStats] = a.lse;
  execute(*g, c.ptr, ws, s);
  if (dead_rows_possible(a)) fix_dead_rows(a, c.lengths, a.o, a.lse, s);
}

void backward(const BwdArgs& a, te_stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  std::string why;
  auto g = need(backward_graph(a, a.dbias != nullptr, &why), why);
  char* ws = static_cast<char*>(a.workspace);
  const Aux layout = aux_layout(a, true);
  // The larger of the two bias variants was sized; the aux part follows it.
  char* aux = ws + (a.workspace_bytes - layout.bytes);
  Common c;
  fill_common(a, aux, layout, &c, s);
  c.ptr[kO] = const_cast<void*>(a.o);
  c.ptr[kDO] = const_cast<void*>(a.d_o);
  c.ptr[kStats] = const_cast<float*>(a.lse);
  if (dead_rows_possible(a)) {
    auto* lse = reinterpret_cast<float*>(aux + layout.lse);
    lse_for_backward(a, a.lse, lse, s);
    c.ptr[kStats] = lse;
  }
  c.ptr[kDQ] = a.dq;
  c.ptr[kDK] = a.dk;
  c.ptr[kDV] = a.dv;
  c.ptr[kDBias] = a.dbias;
  execute(*g, c.ptr, ws, s);
  if (padded(a)) zero_dead_gradients(a, c.lengths, a.dq, a.dk, a.dv, s);
  if (a.dsoftmax_offset != nullptr)
    dsoftmax_offset(a, reinterpret_cast<float*>(aux + layout.dsink), s);
}

}  // namespace te::attention::cudnn

#endif  // TE_WITH_CUDNN
