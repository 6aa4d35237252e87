// Device-side pieces of the core's own CUDA attention kernels
// (cuda_fallback.cu: forward, cuda_fallback_bwd.cu: backward). They follow
// the CPU backend (cpu_common.cpp) step by step, so the two backends compute
// the same thing in the same order:
//   - the same tiles: kBlockQ query rows x kBlockK keys, starting where the
//     CPU's key_range / query_range start them, so the online softmax
//     rescales at the same points and a tile of only masked (or NaN) logits
//     is skipped as the CPU skips it;
//   - the same logits, bit for bit: q . k in the CPU dot()'s order (eight
//     partial sums, then a fixed tree, then the tail), every operation an
//     explicit _rn intrinsic (never contracted into an FMA), the same bias,
//     ALiBi and mask rules (attention/backend.h);
//   - the same dropout bits (Philox word of the element's linear index);
//   - every sum over keys or query rows in the CPU's order.
// What differs is expf/logf (CUDA's, within 2 ulp, vs glibc's): the
// backends agree within rounding, not bit for bit.
//
// FP32 scratch per thread block: tiles of Q, K, V, dO, S and accumulators.
// A Plan places each buffer in shared memory while the opt-in limit allows,
// the rest in the block's own slice of the caller's workspace (large head
// dimensions), so no head size is refused; every kernel walks its tasks
// grid-stride, and a grid that uses workspace slices is capped at two
// blocks per SM, which bounds the workspace.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/backend.h"
#include "nvfp4/philox.h"
#include "runtime/cuda_elem.cuh"

namespace te::attention::fallback {

constexpr int kBlockQ = 32;  // query rows per tile (the CPU's cpu_detail::kBlockQ)
constexpr int kBlockK = 64;  // keys per tile (cpu_detail::kBlockK)
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// ---- Scratch placement

struct Plan {
  static constexpr int kMaxBuffers = 12;
  int64_t offset[kMaxBuffers];  // in floats, within shared memory or the block's slice
  bool shared[kMaxBuffers];
  size_t shared_bytes;
  int64_t slice_floats;  // workspace floats per block (0: all in shared memory)
  int64_t blocks;        // grid size
  int64_t tasks;
};

// Places buffers of the given float counts in order (the first ones, the
// most used, in shared memory first) for `tasks` tasks on the current device.
Plan make_plan(const int64_t* floats, int n, int64_t tasks);

// Workspace bytes a plan's slices take.
inline size_t slice_bytes(const Plan& p) {
  return static_cast<size_t>(p.blocks * p.slice_floats) * sizeof(float);
}

__device__ __forceinline__ float* buffer(const Plan& p, int i, float* shared, float* slices) {
  return (p.shared[i] ? shared : slices + blockIdx.x * p.slice_floats) + p.offset[i];
}

// Row stride of a [rows, n] FP32 tile in shared memory: odd, so that threads
// reading the same column of consecutive rows hit different banks.
__host__ __device__ __forceinline__ int64_t tile_stride(int64_t n) { return n | 1; }

// ---- Sequences and addressing (the CPU's Problem, cpu_common.cpp)

struct Seq {
  int64_t b, len_q, len_kv, diag;
};

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// Sequence b. Device-resident cu_seqlens are not checked by the validation,
// so lengths are clamped to the tensors (the CPU checks and rejects what the
// clamps would change).
__device__ inline Seq seq_of(const Inputs& in, int64_t b) {
  const Dims& d = in.dims;
  Seq s{b, d.sq, d.skv, 0};
  if (in.cu_q) s.len_q = clamp64(int64_t{in.cu_q[b + 1]} - in.cu_q[b], 0, d.sq);
  if (in.cu_kv) s.len_kv = clamp64(int64_t{in.cu_kv[b + 1]} - in.cu_kv[b], 0, d.skv);
  if (in.qkv_format == TE_QKV_FORMAT_THD) {
    s.len_q = clamp64(s.len_q, 0, d.tq - clamp64(in.cu_q_padded[b], 0, d.tq));
    s.len_kv = clamp64(s.len_kv, 0, d.tkv - clamp64(in.cu_kv_padded[b], 0, d.tkv));
  }
  s.diag = diagonal_offset(in.mask_type, s.len_q, s.len_kv);
  return s;
}

__device__ __forceinline__ int64_t q_row(const Inputs& in, int64_t b, int64_t i) {
  switch (in.qkv_format) {
    case TE_QKV_FORMAT_BSHD: return b * in.dims.sq + i;
    case TE_QKV_FORMAT_SBHD: return i * in.dims.b + b;
    default: return in.cu_q_padded[b] + i;
  }
}

__device__ __forceinline__ int64_t kv_row(const Inputs& in, int64_t b, int64_t j) {
  switch (in.qkv_format) {
    case TE_QKV_FORMAT_BSHD: return b * in.dims.skv + j;
    case TE_QKV_FORMAT_SBHD: return j * in.dims.b + b;
    default: return in.cu_kv_padded[b] + j;
  }
}

__device__ __forceinline__ int64_t lse_index(const Inputs& in, int64_t b, int64_t h, int64_t i) {
  if (in.qkv_format == TE_QKV_FORMAT_THD) return q_row(in, b, i) * in.dims.h + h;
  return (b * in.dims.h + h) * in.dims.sq + i;
}

__host__ __device__ __forceinline__ int64_t q_tokens(const Inputs& in) {
  return in.qkv_format == TE_QKV_FORMAT_THD ? in.dims.tq : in.dims.b * in.dims.sq;
}

__host__ __device__ __forceinline__ int64_t kv_tokens(const Inputs& in) {
  return in.qkv_format == TE_QKV_FORMAT_THD ? in.dims.tkv : in.dims.b * in.dims.skv;
}

// Keys [lo, hi) some query of rows [i0, i1) may see (Problem::key_range).
__device__ inline void key_range(const Inputs& in, const Seq& s, int64_t i0, int64_t i1,
                                 int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = s.len_kv;
  if (in.window_left >= 0)
    *lo = i0 + s.diag - in.window_left > 0 ? i0 + s.diag - in.window_left : 0;
  if (in.window_right >= 0) {
    const int64_t e = i1 + s.diag + in.window_right;
    *hi = s.len_kv < e ? s.len_kv : e;
  }
  if (*hi < *lo) *hi = *lo;
}

// Queries [lo, hi) that may see some key of [j0, j1) (Problem::query_range).
__device__ inline void query_range(const Inputs& in, const Seq& s, int64_t j0, int64_t j1,
                                   int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = s.len_q;
  if (in.window_right >= 0) {
    const int64_t e = j0 - s.diag - in.window_right;
    *lo = e > 0 ? e : 0;
  }
  if (in.window_left >= 0) {
    const int64_t e = j1 + in.window_left - s.diag;
    *hi = s.len_q < e ? s.len_q : e;
  }
  if (*hi < *lo) *hi = *lo;
}

// ---- Logits

// sum_k a[k] b[k] in the CPU dot()'s order.
__device__ __forceinline__ float dot_cpu_order(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[l] = __fadd_rn(acc[l], __fmul_rn(a[k + l], b[k + l]));
  }
  float tail = 0.0f;
  for (; k < n; ++k) tail = __fadd_rn(tail, __fmul_rn(a[k], b[k]));
  const float left = __fadd_rn(__fadd_rn(acc[0], acc[1]), __fadd_rn(acc[2], acc[3]));
  const float right = __fadd_rn(__fadd_rn(acc[4], acc[5]), __fadd_rn(acc[6], acc[7]));
  return __fadd_rn(__fadd_rn(left, right), tail);
}

// What the logits of one (sequence, head) read besides q and k.
template <class T>
struct HeadTerms {
  const uint8_t* mask;  // the [sq, skv] plane, or null
  const T* bias;        // the [sq, skv] plane, or null
  float slope;          // ALiBi
};

template <class T>
__device__ inline HeadTerms<T> head_terms(const Inputs& in, int64_t b, int64_t h) {
  const Dims& d = in.dims;
  const int64_t plane = d.sq * d.skv;
  HeadTerms<T> t{nullptr, nullptr, 0.0f};
  if (in.mask)
    t.mask = in.mask + ((in.mask_b == 1 ? 0 : b) * in.mask_h + (in.mask_h == 1 ? 0 : h)) * plane;
  if (in.bias)
    t.bias = static_cast<const T*>(in.bias) +
             ((in.bias_b == 1 ? 0 : b) * in.bias_h + (in.bias_h == 1 ? 0 : h)) * plane;
  if (in.bias_type == TE_ATTN_BIAS_ALIBI)
    t.slope = in.alibi_slopes ? in.alibi_slopes[in.alibi_per_batch ? b * d.h + h : h]
                              : alibi_default_slope(h, d.h);
  return t;
}

// S[i, j] (Problem::logits), -inf where masked.
template <class T>
__device__ inline float logit(const Inputs& in, const Seq& s, const HeadTerms<T>& t, int64_t i,
                              int64_t j, const float* q, const float* k) {
  const float ninf = __int_as_float(0xFF800000u);
  const int64_t skv = in.dims.skv;
  if (j >= s.len_kv || !in_window(i, j, s.diag, in.window_left, in.window_right) ||
      (t.mask && t.mask[i * skv + j] != 0))
    return ninf;
  const float qk = dot_cpu_order(q, k, in.dims.d);
  switch (in.bias_type) {
    case TE_ATTN_BIAS_PRE_SCALE_BIAS:
      return __fmul_rn(in.scale, __fadd_rn(qk, cuda_elem::to_float(t.bias[i * skv + j])));
    case TE_ATTN_BIAS_POST_SCALE_BIAS:
      return __fadd_rn(__fmul_rn(in.scale, qk), cuda_elem::to_float(t.bias[i * skv + j]));
    case TE_ATTN_BIAS_ALIBI:
      return __fadd_rn(__fmul_rn(in.scale, qk), alibi_bias(t.slope, i, j, s.len_q, s.len_kv));
    default: return __fmul_rn(in.scale, qk);
  }
}

// ---- Dropout (Problem::keep_row)

struct Dropout {
  nvfp4::RandomStream stream;
  uint32_t threshold;
  float keep_scale;  // 1 / (1 - p)
  bool on;
};

__device__ inline Dropout dropout_of(const Inputs& in) {
  Dropout r{{in.seed, in.offset}, dropout_threshold(in.dropout), 1.0f, in.dropout > 0.0f};
  if (r.on) r.keep_scale = __fdiv_rn(1.0f, __fsub_rn(1.0f, in.dropout));
  if (r.on && in.rng_state_device) {
    r.stream.seed = static_cast<uint64_t>(in.rng_state_device[0]);
    r.stream.offset = static_cast<uint64_t>(in.rng_state_device[1]);
  }
  return r;
}

// keep[b, h, i, j] / (1 - p), or 1 without dropout.
__device__ __forceinline__ float keep_factor(const Inputs& in, const Dropout& r, int64_t b,
                                             int64_t h, int64_t i, int64_t j) {
  if (!r.on) return 1.0f;
  return r.stream.word(dropout_index(in.dims, b, h, i, j)) >= r.threshold ? r.keep_scale : 0.0f;
}

// The sink logit of head h (off_by_one: 0, learnable: alpha_h).
__device__ __forceinline__ float sink_logit(const Inputs& in, int64_t h) {
  return in.softmax_type == TE_SOFTMAX_LEARNABLE ? in.softmax_offset[h] : 0.0f;
}

// ---- Tile loads and stores (block-wide; FP32 tiles of `n` columns, stride ld)

// Rows first .. first + count of one head (of `heads`) of a q-side (q, o, d_o)
// or kv-side (k, v) tensor with n elements per head, into tile rows 0.. .
template <class T>
__device__ inline void load_rows(const Inputs& in, const void* base, bool q_side, int64_t b,
                                 int64_t first, int64_t count, int64_t heads, int64_t head,
                                 int64_t n, float* tile, int64_t ld) {
  const T* p = static_cast<const T*>(base);
  for (int64_t e = threadIdx.x; e < count * n; e += blockDim.x) {
    const int64_t r = e / n, k = e % n;
    const int64_t row = q_side ? q_row(in, b, first + r) : kv_row(in, b, first + r);
    tile[r * ld + k] = cuda_elem::to_float(p[(row * heads + head) * n + k]);
  }
}

// The inverse: tile rows 0..count to the tensor, rounded to T.
template <class T>
__device__ inline void store_rows(const Inputs& in, void* base, bool q_side, int64_t b,
                                  int64_t first, int64_t count, int64_t heads, int64_t head,
                                  int64_t n, const float* tile, int64_t ld) {
  T* p = static_cast<T*>(base);
  for (int64_t e = threadIdx.x; e < count * n; e += blockDim.x) {
    const int64_t r = e / n, k = e % n;
    const int64_t row = q_side ? q_row(in, b, first + r) : kv_row(in, b, first + r);
    p[(row * heads + head) * n + k] = cuda_elem::from_float<T>(tile[r * ld + k]);
  }
}

__device__ inline void fill(float* p, int64_t n, float v) {
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) p[e] = v;
}

// Host: p[0 .. n) = v on the stream (a kernel: the lse's -inf rows).
void fill_async(float* p, int64_t n, float v, cudaStream_t stream);

// Host: raises the kernel's dynamic shared memory limit to the plan's (call
// before launching it with plan.shared_bytes).
void prepare_launch(const void* kernel, const Plan& plan);

}  // namespace te::attention::fallback
