// The core's own CUDA attention kernel, backward: FlashAttention's backward
// in the CPU backend's two passes (cpu_bwd.cpp), so that every output
// element has exactly one owning thread and no atomics are needed: the
// result is deterministic (config.deterministic holds whatever its value)
// and sums run in the CPU's order.
//   rows:   D_i = dO_i . O_i for every query row (workspace);
//   pass 1: one task per (batch, kv head, key block): dK, dV of those keys,
//           over the group's query heads and the query rows that see them;
//   pass 2: one task per (bias group, query block): dQ of those rows and the
//           dbias rows (an FP32 workspace copy), over the batches/heads the
//           bias is broadcast over;
//   dsoftmax_offset (learnable): one thread per head, the CPU's double sum.
// P is recomputed from S and lse in both passes (P = exp(S - lse)).
#include <cuda_runtime.h>

#include <algorithm>

#include "attention/cuda_fallback_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"

namespace te::attention {
namespace fallback {
namespace {

// Per-row lse and D of the loaded query block.
enum RowStat { kLse, kDelta, kRowStats };
// Pass 1 and pass 2 scratch (see kv_plan / q_plan for the sizes).
enum KvBuffer { kKvRows, kKvP, kKvDs, kKvQ, kKvDo, kKvK, kKvV, kKvDk, kKvDv, kKvBuffers };
enum QBuffer { kQRows, kQDs, kQQ, kQDo, kQK, kQV, kQDq, kQBuffers };

Plan kv_plan(const BwdArgs& a) {
  const Dims& d = a.dims;
  const int64_t floats[kKvBuffers] = {kRowStats * kBlockQ,
                                      kBlockQ * kBlockK,
                                      kBlockQ * kBlockK,
                                      kBlockQ * tile_stride(d.d),
                                      kBlockQ * tile_stride(d.dv),
                                      kBlockK * tile_stride(d.d),
                                      kBlockK * tile_stride(d.dv),
                                      kBlockK * d.d,
                                      kBlockK * d.dv};
  return make_plan(floats, kKvBuffers, d.b * d.hk * ceil_div(d.skv, kBlockK));
}

// Pass 2's tasks: (bias batch, bias head) groups when dbias is summed over
// broadcast dimensions, else (batch, head); times the query blocks.
Plan q_plan(const BwdArgs& a, bool with_dbias) {
  const Dims& d = a.dims;
  const int64_t gb = with_dbias ? a.bias_b : d.b, gh = with_dbias ? a.bias_h : d.h;
  const int64_t floats[kQBuffers] = {kRowStats * kBlockQ,
                                     kBlockQ * kBlockK,
                                     kBlockQ * tile_stride(d.d),
                                     kBlockQ * tile_stride(d.dv),
                                     kBlockK * tile_stride(d.d),
                                     kBlockK * tile_stride(d.dv),
                                     kBlockQ * d.d};
  return make_plan(floats, kQBuffers, gb * gh * ceil_div(d.sq, kBlockQ));
}

// The workspace: D per row, the FP32 dbias accumulator, the plans' slices.
struct Layout {
  int64_t delta, dbias, slices, total;  // float offsets and the float count
};

int64_t align4(int64_t n) { return (n + 3) / 4 * 4; }

// The size must not depend on whether dbias is requested (the size query
// does not see the outputs), so with a bias it covers both cases.
Layout layout(const BwdArgs& a) {
  const Dims& d = a.dims;
  Layout l{};
  l.delta = 0;
  l.dbias = align4(q_tokens(a) * d.h);
  const int64_t dbias = a.bias ? a.bias_b * a.bias_h * d.sq * d.skv : 0;
  l.slices = l.dbias + align4(dbias);
  int64_t slices = static_cast<int64_t>(slice_bytes(kv_plan(a)) / sizeof(float));
  slices = std::max<int64_t>(slices, slice_bytes(q_plan(a, false)) / sizeof(float));
  if (a.bias) slices = std::max<int64_t>(slices, slice_bytes(q_plan(a, true)) / sizeof(float));
  l.total = l.slices + slices;
  return l;
}

// A loaded query block: rows i0 .. i0 + nq of head h.
struct QueryTile {
  float *rows, *q, *d_o;
  int64_t ldq, ldo;
};

struct KeyTile {
  float *k, *v;
  int64_t ldk, ldv;
};

template <class T>
__device__ void load_query_block(const BwdArgs& a, const float* delta, const Seq& s, int64_t h,
                                 int64_t i0, int64_t nq, QueryTile& qt) {
  const Dims& d = a.dims;
  load_rows<T>(a, a.q, true, s.b, i0, nq, d.h, h, d.d, qt.q, qt.ldq);
  load_rows<T>(a, a.d_o, true, s.b, i0, nq, d.h, h, d.dv, qt.d_o, qt.ldo);
  for (int64_t r = threadIdx.x; r < nq; r += blockDim.x) {
    const int64_t idx = lse_index(a, s.b, h, i0 + r);
    qt.rows[kLse * kBlockQ + r] = a.lse[idx];
    qt.rows[kDelta * kBlockQ + r] = delta[idx];
  }
}

template <class T>
__device__ void load_key_block(const BwdArgs& a, const Seq& s, int64_t hk, int64_t j0, int64_t nk,
                               KeyTile& kt) {
  const Dims& d = a.dims;
  load_rows<T>(a, a.k, false, s.b, j0, nk, d.hk, hk, d.d, kt.k, kt.ldk);
  load_rows<T>(a, a.v, false, s.b, j0, nk, d.hk, hk, d.dv, kt.v, kt.ldv);
}

// P' (for dV; null to skip) and dS of the tile's (r, c) elements: the CPU's
// row_grads. A row with lse = -inf has no visible key: zeros.
template <class T>
__device__ void tile_grads(const BwdArgs& a, const Dropout& drop, const Seq& s, int64_t h,
                           const HeadTerms<T>& terms, int64_t i0, int64_t nq, int64_t j0,
                           int64_t nk, const QueryTile& qt, const KeyTile& kt, float* p,
                           float* ds) {
  const float ninf = __int_as_float(0xFF800000u);
  for (int64_t e = threadIdx.x; e < nq * nk; e += blockDim.x) {
    const int64_t r = e / nk, c = e % nk;
    const float lse = qt.rows[kLse * kBlockQ + r];
    float pv = 0.0f, dsv = 0.0f;
    if (lse != ninf) {
      const float sv = logit<T>(a, s, terms, i0 + r, j0 + c, qt.q + r * qt.ldq, kt.k + c * kt.ldk);
      const float prob = expf(__fsub_rn(sv, lse));  // 0 where masked
      if (prob != 0.0f) {
        const float keep = keep_factor(a, drop, s.b, h, i0 + r, j0 + c);
        pv = __fmul_rn(prob, keep);
        const float dp = dot_cpu_order(qt.d_o + r * qt.ldo, kt.v + c * kt.ldv, a.dims.dv);
        dsv = __fmul_rn(prob, __fsub_rn(__fmul_rn(dp, keep), qt.rows[kDelta * kBlockQ + r]));
      }
    }
    if (p) p[r * kBlockK + c] = pv;
    ds[r * kBlockK + c] = dsv;
  }
}

// Pass 1: dK, dV of keys j0 .. j0 + nk of (sequence s, kv head hk).
template <class T>
__device__ void key_block_grads(const BwdArgs& a, const Dropout& drop, const float* delta,
                                const Seq& s, int64_t hk, int64_t j0, int64_t nk,
                                float* const* buf) {
  const Dims& d = a.dims;
  const int64_t group = d.h / d.hk;
  QueryTile qt{buf[kKvRows], buf[kKvQ], buf[kKvDo], tile_stride(d.d), tile_stride(d.dv)};
  KeyTile kt{buf[kKvK], buf[kKvV], tile_stride(d.d), tile_stride(d.dv)};
  float *p = buf[kKvP], *ds = buf[kKvDs], *dk = buf[kKvDk], *dv = buf[kKvDv];
  load_key_block<T>(a, s, hk, j0, nk, kt);
  fill(dk, nk * d.d, 0.0f);
  fill(dv, nk * d.dv, 0.0f);
  int64_t lo, hi;
  query_range(a, s, j0, j0 + nk, &lo, &hi);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadTerms<T> terms = head_terms<T>(a, s.b, h);
    for (int64_t i0 = lo; i0 < hi; i0 += kBlockQ) {
      const int64_t nq = std::min<int64_t>(kBlockQ, hi - i0);
      __syncthreads();  // the previous block's tiles are consumed
      load_query_block<T>(a, delta, s, h, i0, nq, qt);
      __syncthreads();
      tile_grads<T>(a, drop, s, h, terms, i0, nq, j0, nk, qt, kt, p, ds);
      __syncthreads();
      // Per key element, the query rows in order (the CPU's r loop).
      for (int64_t e = threadIdx.x; e < nk * d.dv; e += blockDim.x) {
        const int64_t c = e / d.dv, k = e % d.dv;
        float x = dv[e];
        for (int64_t r = 0; r < nq; ++r) {
          const float pr = p[r * kBlockK + c];
          if (pr != 0.0f) x = __fadd_rn(x, __fmul_rn(pr, qt.d_o[r * qt.ldo + k]));
        }
        dv[e] = x;
      }
      for (int64_t e = threadIdx.x; e < nk * d.d; e += blockDim.x) {
        const int64_t c = e / d.d, k = e % d.d;
        float x = dk[e];
        for (int64_t r = 0; r < nq; ++r) {
          const float g = ds[r * kBlockK + c];
          if (g != 0.0f) x = __fadd_rn(x, __fmul_rn(__fmul_rn(a.scale, g), qt.q[r * qt.ldq + k]));
        }
        dk[e] = x;
      }
    }
  }
  __syncthreads();
  store_rows<T>(a, a.dk, false, s.b, j0, nk, d.hk, hk, d.d, dk, d.d);
  store_rows<T>(a, a.dv, false, s.b, j0, nk, d.hk, hk, d.dv, dv, d.dv);
  __syncthreads();  // the next task reuses the buffers
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    kv_pass_kernel(const BwdArgs a, const Plan plan, const float* delta, float* slices) {
  extern __shared__ float4 shared_raw[];
  float* shared = reinterpret_cast<float*>(shared_raw);
  float* buf[kKvBuffers];
  for (int i = 0; i < kKvBuffers; ++i) buf[i] = buffer(plan, i, shared, slices);
  const Dims& d = a.dims;
  const Dropout drop = dropout_of(a);
  const int64_t key_blocks = (d.skv + kBlockK - 1) / kBlockK;
  for (int64_t task = blockIdx.x; task < plan.tasks; task += gridDim.x) {
    const int64_t b = task / (d.hk * key_blocks), hk = (task / key_blocks) % d.hk;
    const int64_t j0 = (task % key_blocks) * kBlockK;
    const Seq s = seq_of(a, b);
    if (j0 < s.len_kv)
      key_block_grads<T>(a, drop, delta, s, hk, j0, std::min<int64_t>(kBlockK, s.len_kv - j0), buf);
  }
}

// Pass 2, one (sequence, head): dQ of rows i0 .. i0 + nq, their dS added into
// the FP32 dbias rows when given.
template <class T>
__device__ void query_block_grads(const BwdArgs& a, const Dropout& drop, const float* delta,
                                  const Seq& s, int64_t h, int64_t i0, int64_t nq,
                                  float* dbias_plane, float* const* buf) {
  const Dims& d = a.dims;
  const int64_t hk = h / (d.h / d.hk);
  const float bias_factor = a.bias_type == TE_ATTN_BIAS_PRE_SCALE_BIAS ? a.scale : 1.0f;
  QueryTile qt{buf[kQRows], buf[kQQ], buf[kQDo], tile_stride(d.d), tile_stride(d.dv)};
  KeyTile kt{buf[kQK], buf[kQV], tile_stride(d.d), tile_stride(d.dv)};
  float *ds = buf[kQDs], *dq = buf[kQDq];
  const HeadTerms<T> terms = head_terms<T>(a, s.b, h);
  load_query_block<T>(a, delta, s, h, i0, nq, qt);
  fill(dq, nq * d.d, 0.0f);
  int64_t lo, hi;
  key_range(a, s, i0, i0 + nq, &lo, &hi);
  for (int64_t j0 = lo; j0 < hi; j0 += kBlockK) {
    const int64_t nk = std::min<int64_t>(kBlockK, hi - j0);
    __syncthreads();
    load_key_block<T>(a, s, hk, j0, nk, kt);
    __syncthreads();
    tile_grads<T>(a, drop, s, h, terms, i0, nq, j0, nk, qt, kt, nullptr, ds);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < nq * d.d; e += blockDim.x) {
      const int64_t r = e / d.d, k = e % d.d;
      float x = dq[e];
      for (int64_t c = 0; c < nk; ++c) {
        const float g = ds[r * kBlockK + c];
        if (g != 0.0f) x = __fadd_rn(x, __fmul_rn(__fmul_rn(a.scale, g), kt.k[c * kt.ldk + k]));
      }
      dq[e] = x;
    }
    if (dbias_plane)
      for (int64_t e = threadIdx.x; e < nq * nk; e += blockDim.x) {
        const int64_t r = e / nk, c = e % nk;
        const float g = ds[r * kBlockK + c];
        if (g != 0.0f) {
          float& acc = dbias_plane[(i0 + r) * d.skv + j0 + c];
          acc = __fadd_rn(acc, __fmul_rn(bias_factor, g));
        }
      }
  }
  __syncthreads();
  store_rows<T>(a, a.dq, true, s.b, i0, nq, d.h, h, d.d, dq, d.d);
  __syncthreads();
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    q_pass_kernel(const BwdArgs a, const Plan plan, const float* delta, float* dbias_acc,
                  float* slices) {
  extern __shared__ float4 shared_raw[];
  float* shared = reinterpret_cast<float*>(shared_raw);
  float* buf[kQBuffers];
  for (int i = 0; i < kQBuffers; ++i) buf[i] = buffer(plan, i, shared, slices);
  const Dims& d = a.dims;
  const Dropout drop = dropout_of(a);
  const int64_t gb = a.dbias ? a.bias_b : d.b, gh = a.dbias ? a.bias_h : d.h;  // q_plan's
  const int64_t blocks_q = (d.sq + kBlockQ - 1) / kBlockQ;
  for (int64_t task = blockIdx.x; task < plan.tasks; task += gridDim.x) {
    const int64_t x = task / (gh * blocks_q), y = (task / blocks_q) % gh;
    const int64_t i0 = (task % blocks_q) * kBlockQ;
    float* plane = a.dbias ? dbias_acc + (x * a.bias_h + y) * d.sq * d.skv : nullptr;
    for (int64_t b = (gb == d.b ? x : 0); b < (gb == d.b ? x + 1 : d.b); ++b) {
      const Seq s = seq_of(a, b);
      if (i0 >= s.len_q) continue;
      for (int64_t h = (gh == d.h ? y : 0); h < (gh == d.h ? y + 1 : d.h); ++h)
        query_block_grads<T>(a, drop, delta, s, h, i0, std::min<int64_t>(kBlockQ, s.len_q - i0),
                             plane, buf);
    }
    if (!a.dbias) continue;
    __syncthreads();
    const int64_t rows = std::min<int64_t>(kBlockQ, d.sq - i0);
    T* out = static_cast<T*>(a.dbias) + (x * a.bias_h + y) * d.sq * d.skv + i0 * d.skv;
    for (int64_t e = threadIdx.x; e < rows * d.skv; e += blockDim.x)
      out[e] = cuda_elem::from_float<T>(plane[i0 * d.skv + e]);
  }
}

// D_i = dO_i . O_i (the CPU's row_deltas), one block per (batch, head) at a time.
template <class T>
__global__ void delta_kernel(const BwdArgs a, float* delta) {
  const Dims& d = a.dims;
  const T* o = static_cast<const T*>(a.o);
  const T* d_o = static_cast<const T*>(a.d_o);
  for (int64_t t = blockIdx.x; t < d.b * d.h; t += gridDim.x) {
    const int64_t b = t / d.h, h = t % d.h;
    const Seq s = seq_of(a, b);
    for (int64_t i = threadIdx.x; i < s.len_q; i += blockDim.x) {
      const int64_t off = (q_row(a, b, i) * d.h + h) * d.dv;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 8 <= d.dv; k += 8)
        for (int l = 0; l < 8; ++l)
          acc[l] = __fadd_rn(acc[l], __fmul_rn(cuda_elem::to_float(o[off + k + l]),
                                               cuda_elem::to_float(d_o[off + k + l])));
      float tail = 0.0f;
      for (; k < d.dv; ++k)
        tail = __fadd_rn(
            tail, __fmul_rn(cuda_elem::to_float(o[off + k]), cuda_elem::to_float(d_o[off + k])));
      const float left = __fadd_rn(__fadd_rn(acc[0], acc[1]), __fadd_rn(acc[2], acc[3]));
      const float right = __fadd_rn(__fadd_rn(acc[4], acc[5]), __fadd_rn(acc[6], acc[7]));
      delta[lse_index(a, b, h, i)] = __fadd_rn(__fadd_rn(left, right), tail);
    }
  }
}

// dalpha_h = -sum_{b,i} exp(alpha_h - lse_i) D_i, one thread per head, in the
// CPU's order with its double accumulator (softmax_offset_grad).
__global__ void softmax_offset_kernel(const BwdArgs a, const float* delta) {
  const Dims& d = a.dims;
  const float ninf = __int_as_float(0xFF800000u);
  for (int64_t h = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; h < d.h;
       h += int64_t{gridDim.x} * blockDim.x) {
    double sum = 0.0;
    for (int64_t b = 0; b < d.b; ++b) {
      const Seq s = seq_of(a, b);
      for (int64_t i = 0; i < s.len_q; ++i) {
        const int64_t idx = lse_index(a, b, h, i);
        if (a.lse[idx] == ninf) continue;
        sum += static_cast<double>(expf(__fsub_rn(sink_logit(a, h), a.lse[idx]))) *
               static_cast<double>(delta[idx]);
      }
    }
    a.dsoftmax_offset[h] = static_cast<float>(-sum);
  }
}

void zero_async(void* p, int64_t elements, size_t elem, cudaStream_t s) {
  if (elements > 0) TE_CHECK_CUDA(cudaMemsetAsync(p, 0, static_cast<size_t>(elements) * elem, s));
}

}  // namespace
}  // namespace fallback

namespace cuda_fallback {

size_t bwd_workspace(const BwdArgs& a) {
  return static_cast<size_t>(fallback::layout(a).total) * sizeof(float);
}

void backward(const BwdArgs& a, te_stream stream) {
  using namespace fallback;
  const cudaStream_t s = cuda_stream(stream);
  const Dims& d = a.dims;
  const size_t elem = a.dtype == TE_DTYPE_FLOAT32 ? 4 : 2;
  // Rows outside every sequence get zero gradients; so do unreached keys.
  zero_async(a.dq, q_tokens(a) * d.h * d.d, elem, s);
  zero_async(a.dk, kv_tokens(a) * d.hk * d.d, elem, s);
  zero_async(a.dv, kv_tokens(a) * d.hk * d.dv, elem, s);
  const Layout l = layout(a);
  float* ws = static_cast<float*>(a.workspace);
  float* delta = ws + l.delta;
  float* dbias_acc = a.dbias ? ws + l.dbias : nullptr;
  float* slices = ws + l.slices;
  zero_async(delta, q_tokens(a) * d.h, sizeof(float), s);
  if (a.dbias) {
    zero_async(a.dbias, a.bias_b * a.bias_h * d.sq * d.skv, elem, s);
    zero_async(dbias_acc, a.bias_b * a.bias_h * d.sq * d.skv, sizeof(float), s);
  }
  if (d.b * d.h == 0) return;
  const Plan p1 = kv_plan(a), p2 = q_plan(a, a.dbias != nullptr);
  cuda_elem::dispatch_input(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t rows_blocks = std::min<int64_t>(d.b * d.h, 65535);
    delta_kernel<T><<<static_cast<unsigned>(rows_blocks), 128, 0, s>>>(a, delta);
    TE_CHECK_LAUNCH();
    if (a.dsoftmax_offset) {
      softmax_offset_kernel<<<static_cast<unsigned>(ceil_div(d.h, 32)), 32, 0, s>>>(a, delta);
      TE_CHECK_LAUNCH();
    }
    const void* k1 = reinterpret_cast<const void*>(&kv_pass_kernel<T>);
    prepare_launch(k1, p1);
    kv_pass_kernel<T>
        <<<static_cast<unsigned>(p1.blocks), kThreads, p1.shared_bytes, s>>>(a, p1, delta, slices);
    TE_CHECK_LAUNCH();
    const void* k2 = reinterpret_cast<const void*>(&q_pass_kernel<T>);
    prepare_launch(k2, p2);
    q_pass_kernel<T><<<static_cast<unsigned>(p2.blocks), kThreads, p2.shared_bytes, s>>>(
        a, p2, delta, dbias_acc, slices);
    TE_CHECK_LAUNCH();
  });
}

}  // namespace cuda_fallback
}  // namespace te::attention
