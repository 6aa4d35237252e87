// cudnn-frontend SDPA graphs of the attention family (cudnn_graph.cpp, the
// only translation unit that includes the frontend). TE_WITH_CUDNN builds only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "attention/backend.h"

namespace te::attention::cudnn {

// Tensor ids of the graphs' variant packs: execute() takes an array indexed by
// these (null where the graph has no such tensor).
enum Uid : int {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,     // FP32 lse: [b, h, sq] (bshd/sbhd) or [tq, h] (thd)
  kBias,      // post_scale_bias
  kSeqLenQ,   // INT32 [b]: per-sequence lengths (padding masks, thd)
  kSeqLenKv,  // INT32 [b]
  kRaggedQ,   // thd: INT32 [b + 1] element offsets of each sequence in q / dq
  kRaggedK,   // ... in k / dk
  kRaggedV,   // ... in v / dv
  kRaggedO,   // ... in o / d_o
  kRaggedStats,
  kSeed,    // dropout: INT64, host value or device pointer (rng_state_device)
  kOffset,  // dropout
  kSink,    // off_by_one / learnable: FP32 [h] sink logits
  kDO,
  kDQ,
  kDK,
  kDV,
  kDBias,
  kUidCount
};

// Dead rows (no visible key, or past a sequence) are possible for this
// configuration: the forward then zeroes O / writes lse = -inf there, and the
// backward hands cuDNN a corrected lse (cudnn_aux.h).
bool dead_rows_possible(const Inputs& in);

struct Graph;  // a built cudnn_frontend graph, its workspace size and a lock

// The graph of one pass for one configuration, built on first use and cached
// (per device, thread-safe). Null with the reason in *why when cuDNN has no
// engine for it. backward: dbias says whether that output is wanted.
std::shared_ptr<Graph> forward_graph(const Inputs& in, std::string* why);
std::shared_ptr<Graph> backward_graph(const Inputs& in, bool dbias, std::string* why);

size_t workspace_bytes(const Graph& graph);

// Runs the graph on `stream` with this thread's cuDNN handle for the current
// device. No allocation, no synchronization.
void execute(Graph& graph, void* const (&pointers)[kUidCount], void* workspace,
             cudaStream_t stream);

}  // namespace te::attention::cudnn
