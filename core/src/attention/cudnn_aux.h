// Small kernels around the cuDNN graphs (cudnn_aux.cu): the sequence-length
// and ragged-offset tensors cuDNN reads, derived on the GPU from cu_seqlens
// (no host sync), and the fix-ups that give rows without a visible key (and
// rows past a sequence, which cuDNN leaves untouched) our convention: O = 0,
// lse = -inf, zero gradients. TE_WITH_CUDNN builds only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/backend.h"

namespace te::attention::cudnn {

// INT32 arrays in the workspace: lengths [b] and (thd) element offsets [b + 1].
struct Lengths {
  int32_t* seqlen_q = nullptr;
  int32_t* seqlen_kv = nullptr;
  int32_t* ragged_q = nullptr;      // cu_q_padded * h * d
  int32_t* ragged_k = nullptr;      // cu_kv_padded * hk * d
  int32_t* ragged_v = nullptr;      // cu_kv_padded * hk * dv
  int32_t* ragged_o = nullptr;      // cu_q_padded * h * dv
  int32_t* ragged_stats = nullptr;  // cu_q_padded * h
};

// Fills the arrays that are not null.
void compute_lengths(const Inputs& in, const Lengths& out, cudaStream_t stream);

// Forward: rows with no visible key get O = 0 and lse = -inf (all heads).
void fix_dead_rows(const Inputs& in, const Lengths& lengths, void* o, float* lse,
                   cudaStream_t stream);

// Backward's lse for cuDNN: -inf (a dead row) becomes +inf, so that cuDNN's
// P = exp(S - lse) is 0 there and the row adds nothing to any gradient.
void lse_for_backward(const Inputs& in, const float* lse, float* out, cudaStream_t stream);

// Backward: zeroes dq rows of dead query rows and dk / dv rows past their
// sequence (cuDNN does not write rows outside a sequence).
void zero_dead_gradients(const Inputs& in, const Lengths& lengths, void* dq, void* dk, void* dv,
                         cudaStream_t stream);

// learnable: dsoftmax_offset_h = -sum over live rows (b, i) of
// exp(alpha_h - lse) * (dO . O), deterministic (fixed-order two-stage sums;
// `partial` holds dsink_partials(in) floats of the workspace).
size_t dsink_partials(const Inputs& in);
void dsoftmax_offset(const BwdArgs& a, float* partial, cudaStream_t stream);

}  // namespace te::attention::cudnn
