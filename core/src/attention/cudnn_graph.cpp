// cuDNN SDPA forward / backward graphs through cudnn-frontend: built once per
// configuration (every field of Inputs that shapes the graph, the device, the
// pass and its optional outputs) and cached, so a call only looks the graph up
// and executes it: no rebuild, no allocation, no synchronization (CUDA-graph
// capturable; the workspace is the caller's).
//
// Mapping of our semantics (te/attention.h) onto cuDNN's SDPA attributes:
//   scale -> attn_scale; post_scale_bias -> bias (+ dbias); alibi -> alibi_mask
//   (cuDNN's default slopes equal ours; it adds slope * (j - i), which is ours
//   when the diagonal is at i = j, so only causal with sq == skv is offered);
//   window (left, right) about the diagonal -> diagonal band bounds: cuDNN keeps
//   j > i + off - left_bound, so left_bound = window_left + 1, and
//   j <= i + off + right_bound; off = 0 is TOP_LEFT alignment, skv - sq (per
//   sequence) BOTTOM_RIGHT; padding masks and thd -> padding_mask with seq_len
//   tensors; thd -> ragged offsets (element offsets of each sequence); dropout
//   -> Philox seed / offset tensors (cuDNN's own generator); off_by_one /
//   learnable -> a sink token per head (logit 0 or softmax_offset); its
//   gradient dsoftmax_offset is ours (cudnn_aux.h), not the graph's.
//   Stats = lse (natural log, FP32), sink included.
#ifdef TE_WITH_CUDNN

#include "attention/cudnn_graph.h"

#include <cudnn_frontend.h>

#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/status.h"

namespace te::attention::cudnn {

namespace fe = cudnn_frontend;
using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

struct Graph {
  fe::graph::Graph graph;
  std::vector<int> uids;  // the variant pack's tensors
  size_t workspace = 0;
  std::mutex exec;  // execute() of one graph object is not re-entrant
};

namespace {

int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) fail(TE_ERROR_CUDA, "cudaGetDevice failed");
  return device;
}

// One cuDNN handle per thread and device (never destroyed: no teardown-order
// issues at exit); the stream is set at each call.
cudnnHandle_t handle_for(int device) {
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = cudnnCreate(&handle);
  if (status != CUDNN_STATUS_SUCCESS)
    fail(TE_ERROR_CUDA, "cudnnCreate failed: ", cudnnGetErrorString(status));
  handles.emplace(device, handle);
  return handle;
}

int64_t bits(float v) {
  int32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

using Key = std::vector<int64_t>;

Key key_of(const Inputs& in, int pass, bool dbias) {
  const Dims& d = in.dims;
  return {pass,
          current_device(),
          dbias,
          in.dtype,
          in.qkv_format,
          in.mask_type,
          in.bias_type,
          in.softmax_type,
          bits(in.scale),
          bits(in.dropout),
          in.window_left,
          in.window_right,
          in.deterministic,
          d.b,
          d.sq,
          d.skv,
          d.h,
          d.hk,
          d.d,
          d.dv,
          d.tq,
          d.tkv,
          in.bias_b,
          in.bias_h,
          in.rng_state_device != nullptr};
}

bool thd(const Inputs& in) { return in.qkv_format == TE_QKV_FORMAT_THD; }

// Strides of a [b, heads, s, d] view of q / k / v / o in the layout.
std::vector<int64_t> strides(const Inputs& in, int64_t heads, int64_t s, int64_t d) {
  if (in.qkv_format == TE_QKV_FORMAT_SBHD) return {heads * d, d, in.dims.b * heads * d, 1};
  return {s * heads * d, d, heads * d, 1};  // bshd, and thd within a sequence
}

// Builds the tensors of one graph; records the uids it creates.
struct Builder {
  const Inputs& in;
  Graph& out;

  Tensor tensor(Uid uid, const char* name, std::vector<int64_t> dim, std::vector<int64_t> stride,
                fe::DataType_t type = fe::DataType_t::NOT_SET) {
    fe::graph::Tensor_attributes a;
    a.set_name(name).set_uid(uid).set_dim(std::move(dim)).set_stride(std::move(stride));
    if (type != fe::DataType_t::NOT_SET) a.set_data_type(type);
    out.uids.push_back(uid);
    return out.graph.tensor(a);
  }

  Tensor index(Uid uid, const char* name, int64_t n) {
    return tensor(uid, name, {n, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT32);
  }

  // q / k / v / o / d_o style input of `heads` x `s` x `d` (thd: ragged).
  Tensor input(Uid uid, const char* name, int64_t heads, int64_t s, int64_t d, Uid ragged) {
    fe::graph::Tensor_attributes a;
    a.set_name(name)
        .set_uid(uid)
        .set_dim({in.dims.b, heads, s, d})
        .set_stride(strides(in, heads, s, d));
    if (thd(in)) a.set_ragged_offset(ragged_tensor(ragged));
    out.uids.push_back(uid);
    return out.graph.tensor(a);
  }

  // Gives a graph output (o, dq, ...) its uid, layout and ragged offsets.
  void output(const Tensor& t, Uid uid, int64_t heads, int64_t s, int64_t d, Uid ragged) {
    t->set_output(true)
        .set_uid(uid)
        .set_dim({in.dims.b, heads, s, d})
        .set_stride(strides(in, heads, s, d));
    if (thd(in)) t->set_ragged_offset(ragged_tensor(ragged));
    out.uids.push_back(uid);
  }

  // lse: [b, h, sq] or, for thd, [tq, h] (row stride h, ragged by sequence).
  std::vector<int64_t> stats_dim() const { return {in.dims.b, in.dims.h, in.dims.sq, 1}; }
  std::vector<int64_t> stats_stride() const {
    const int64_t h = in.dims.h, sq = in.dims.sq;
    if (thd(in)) return {h * sq, 1, h, 1};
    return {h * sq, sq, 1, 1};
  }

  std::map<int, Tensor> ragged_cache;
  Tensor ragged_tensor(Uid uid) {
    auto it = ragged_cache.find(uid);
    if (it != ragged_cache.end()) return it->second;
    return ragged_cache[uid] = index(uid, "ragged_offset", in.dims.b + 1);
  }

  Tensor per_head(Uid uid, const char* name) {
    return tensor(uid, name, {1, in.dims.h, 1, 1}, {in.dims.h, 1, 1, 1}, fe::DataType_t::FLOAT);
  }

  Tensor bias() {
    const int64_t sq = in.dims.sq, skv = in.dims.skv;
    return tensor(kBias, "bias", {in.bias_b, in.bias_h, sq, skv},
                  {in.bias_h * sq * skv, sq * skv, skv, 1});
  }

  Tensor rng(Uid uid, const char* name) {
    fe::graph::Tensor_attributes a;
    a.set_name(name)
        .set_uid(uid)
        .set_dim({1, 1, 1, 1})
        .set_stride({1, 1, 1, 1})
        .set_data_type(fe::DataType_t::INT64);
    if (in.rng_state_device == nullptr) a.set_is_pass_by_value(true);
    out.uids.push_back(uid);
    return out.graph.tensor(a);
  }
};

// The options forward and backward share (masks, window, bias, dropout, sink).
template <class Options>
void common_options(Builder& b, Options& o) {
  const Inputs& in = b.in;
  o.set_attn_scale(in.scale);
  if (is_padding_mask(in.mask_type) || thd(in)) {
    o.set_padding_mask(true)
        .set_seq_len_q(b.index(kSeqLenQ, "seq_len_q", in.dims.b))
        .set_seq_len_kv(b.index(kSeqLenKv, "seq_len_kv", in.dims.b));
  }
  if (in.window_left >= 0 || in.window_right >= 0) {
    const bool top_left = in.mask_type == TE_ATTN_MASK_CAUSAL ||
                          in.mask_type == TE_ATTN_MASK_PADDING_CAUSAL ||
                          (in.dims.sq == in.dims.skv && !is_padding_mask(in.mask_type) && !thd(in));
    o.set_diagonal_alignment(top_left ? fe::DiagonalAlignment_t::TOP_LEFT
                                      : fe::DiagonalAlignment_t::BOTTOM_RIGHT);
    if (in.window_right >= 0) o.set_diagonal_band_right_bound(static_cast<int>(in.window_right));
    if (in.window_left >= 0) o.set_diagonal_band_left_bound(static_cast<int>(in.window_left + 1));
  }
  if (in.bias_type == TE_ATTN_BIAS_ALIBI) o.set_alibi_mask(true);
  if (in.dropout > 0.0f) o.set_dropout(in.dropout, b.rng(kSeed, "seed"), b.rng(kOffset, "offset"));
  if (in.softmax_type != TE_SOFTMAX_VANILLA) o.set_sink_token(b.per_head(kSink, "sink"));
  if (thd(in)) {
    o.set_max_total_seq_len_q(in.dims.tq);
    o.set_max_total_seq_len_kv(in.dims.tkv);
  }
}

void start_graph(const Inputs& in, fe::graph::Graph& g) {
  g.set_io_data_type(in.dtype == TE_DTYPE_BFLOAT16 ? fe::DataType_t::BFLOAT16
                                                   : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
}

void build_forward(const Inputs& in, Graph& out) {
  Builder b{in, out, {}};
  const Dims& d = in.dims;
  start_graph(in, out.graph);
  Tensor q = b.input(kQ, "q", d.h, d.sq, d.d, kRaggedQ);
  Tensor k = b.input(kK, "k", d.hk, d.skv, d.d, kRaggedK);
  Tensor v = b.input(kV, "v", d.hk, d.skv, d.dv, kRaggedV);
  fe::graph::SDPA_attributes o;
  o.set_name("sdpa_fwd").set_generate_stats(true);
  common_options(b, o);
  if (in.bias_type == TE_ATTN_BIAS_POST_SCALE_BIAS) o.set_bias(b.bias());
  auto [out_o, stats] = out.graph.sdpa(q, k, v, o);
  b.output(out_o, kO, d.h, d.sq, d.dv, kRaggedO);
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(b.stats_dim())
      .set_stride(b.stats_stride());
  if (thd(in)) stats->set_ragged_offset(b.ragged_tensor(kRaggedStats));
  out.uids.push_back(kStats);
}

void build_backward(const Inputs& in, bool dbias, Graph& out) {
  Builder b{in, out, {}};
  const Dims& d = in.dims;
  start_graph(in, out.graph);
  Tensor q = b.input(kQ, "q", d.h, d.sq, d.d, kRaggedQ);
  Tensor k = b.input(kK, "k", d.hk, d.skv, d.d, kRaggedK);
  Tensor v = b.input(kV, "v", d.hk, d.skv, d.dv, kRaggedV);
  Tensor o = b.input(kO, "o", d.h, d.sq, d.dv, kRaggedO);
  Tensor d_o = b.input(kDO, "d_o", d.h, d.sq, d.dv, kRaggedO);
  fe::graph::Tensor_attributes sa;
  sa.set_name("stats")
      .set_uid(kStats)
      .set_dim(b.stats_dim())
      .set_stride(b.stats_stride())
      .set_data_type(fe::DataType_t::FLOAT);
  if (thd(in)) sa.set_ragged_offset(b.ragged_tensor(kRaggedStats));
  out.uids.push_back(kStats);
  Tensor stats = out.graph.tensor(sa);
  fe::graph::SDPA_backward_attributes opt;
  opt.set_name("sdpa_bwd").set_deterministic_algorithm(in.deterministic);
  common_options(b, opt);
  if (in.bias_type == TE_ATTN_BIAS_POST_SCALE_BIAS) {
    opt.set_bias(b.bias());
    if (dbias) {
      const int64_t sq = d.sq, skv = d.skv;
      auto t = out.graph.tensor(fe::graph::Tensor_attributes()
                                    .set_name("dbias")
                                    .set_uid(kDBias)
                                    .set_dim({in.bias_b, in.bias_h, sq, skv})
                                    .set_stride({in.bias_h * sq * skv, sq * skv, skv, 1}));
      out.uids.push_back(kDBias);
      opt.set_dbias(t);
    }
  }
  auto [dq, dk, dv] = out.graph.sdpa_backward(q, k, v, o, d_o, stats, opt);
  b.output(dq, kDQ, d.h, d.sq, d.d, kRaggedQ);
  b.output(dk, kDK, d.hk, d.skv, d.d, kRaggedK);
  b.output(dv, kDV, d.hk, d.skv, d.dv, kRaggedV);
}

// validate -> operation graph -> heuristics -> support -> plans; the first
// failing step's message goes to *why.
bool finish(Graph& g, std::string* why) {
  cudnnHandle_t handle = handle_for(current_device());
  auto step = [&](const char* what, fe::error_t e) {
    if (e.is_good()) return true;
    *why = std::string("cuDNN ") + what + ": " + e.get_message();
    return false;
  };
  if (!step("validate", g.graph.validate()) ||
      !step("operation graph", g.graph.build_operation_graph(handle)) ||
      !step("heuristics", g.graph.create_execution_plans({fe::HeurMode_t::A})) ||
      !step("support check", g.graph.check_support(handle)) ||
      !step("plan build", g.graph.build_plans(handle)))
    return false;
  int64_t ws = 0;
  if (!step("workspace size", g.graph.get_workspace_size(ws))) return false;
  g.workspace = static_cast<size_t>(ws);
  return true;
}

struct Entry {
  std::shared_ptr<Graph> graph;  // null: unsupported
  std::string why;
};

template <class Build>
std::shared_ptr<Graph> cached(const Key& key, std::string* why, Build build) {
  static std::mutex mutex;
  static std::map<Key, Entry> cache;  // never destroyed: graphs outlive static teardown
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    Entry e;
    auto g = std::make_shared<Graph>();
    try {
      build(*g);
      if (finish(*g, &e.why)) e.graph = std::move(g);
    } catch (const std::exception& ex) {  // the frontend throws on some errors
      e.why = std::string("cuDNN graph build: ") + ex.what();
    }
    it = cache.emplace(key, std::move(e)).first;
  }
  if (!it->second.graph && why != nullptr) *why = it->second.why;
  return it->second.graph;
}

}  // namespace

bool dead_rows_possible(const Inputs& in) {
  if (is_padding_mask(in.mask_type) || thd(in) || in.window_left >= 0) return true;
  // Only a right bound is left: row i sees key 0 iff 0 <= i + off + right,
  // true for every row when off >= 0.
  const bool top_left = in.mask_type == TE_ATTN_MASK_CAUSAL;
  return in.window_right >= 0 && !top_left && in.dims.sq > in.dims.skv;
}

std::shared_ptr<Graph> forward_graph(const Inputs& in, std::string* why) {
  return cached(key_of(in, 0, false), why, [&](Graph& g) { build_forward(in, g); });
}

std::shared_ptr<Graph> backward_graph(const Inputs& in, bool dbias, std::string* why) {
  return cached(key_of(in, 1, dbias), why, [&](Graph& g) { build_backward(in, dbias, g); });
}

size_t workspace_bytes(const Graph& graph) { return graph.workspace; }

void execute(Graph& graph, void* const (&pointers)[kUidCount], void* workspace,
             cudaStream_t stream) {
  std::unordered_map<int64_t, void*> pack;
  for (int uid : graph.uids) {
    if (pointers[uid] == nullptr)
      fail(TE_ERROR_INTERNAL, "cuDNN attention: no pointer for tensor ", uid);
    pack.emplace(uid, pointers[uid]);
  }
  cudnnHandle_t handle = handle_for(current_device());
  std::lock_guard<std::mutex> lock(graph.exec);
  const cudnnStatus_t status = cudnnSetStream(handle, stream);
  if (status != CUDNN_STATUS_SUCCESS)
    fail(TE_ERROR_CUDA, "cudnnSetStream failed: ", cudnnGetErrorString(status));
  fe::error_t e = graph.graph.execute(handle, pack, workspace);
  if (e.is_bad()) fail(TE_ERROR_CUDA, "cuDNN attention execute: ", e.get_message());
}

}  // namespace te::attention::cudnn

#endif  // TE_WITH_CUDNN
