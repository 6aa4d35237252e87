// The core's own CUDA attention kernel, forward (te/attention.h; used where
// cuDNN has no engine, or with NVTE_FUSED_ATTN=0). FP32 SIMT FlashAttention:
// one thread block per (batch, query head, block of kBlockQ query rows) at a
// time, an online softmax over tiles of kBlockK keys staged through shared
// memory, exactly as the CPU backend (cpu.cpp) tiles and orders it
// (cuda_fallback_common.cuh says what that buys). Correctness first: no
// tensor cores; every output element is written by one thread.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <utility>

#include "attention/cpu_common.h"
#include "attention/cuda_fallback_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"

namespace te::attention {
namespace fallback {

static_assert(kBlockQ == cpu_detail::kBlockQ && kBlockK == cpu_detail::kBlockK,
              "the CUDA fallback must tile as the CPU backend does");

Plan make_plan(const int64_t* floats, int n, int64_t tasks) {
  if (n > Plan::kMaxBuffers) fail(TE_ERROR_INTERNAL, "attention fallback: too many buffers");
  int device = 0, optin = 0;
  TE_CHECK_CUDA(cudaGetDevice(&device));
  TE_CHECK_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int64_t limit = optin / static_cast<int64_t>(sizeof(float));
  Plan p{};
  int64_t used = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t size = (floats[i] + 3) / 4 * 4;  // 16-byte aligned buffers
    p.shared[i] = used + size <= limit;
    p.offset[i] = p.shared[i] ? used : p.slice_floats;
    (p.shared[i] ? used : p.slice_floats) += size;
  }
  p.shared_bytes = static_cast<size_t>(used) * sizeof(float);
  p.tasks = tasks;
  const int64_t cap = p.slice_floats == 0 ? int64_t{INT_MAX} : 2 * int64_t{cuda_sm_count()};
  p.blocks = std::max<int64_t>(1, std::min(tasks, cap));
  return p;
}

// The limit is raised once per (kernel, device) and size: later calls (a CUDA
// graph capture after a first eager call among them) make no CUDA call here.
void prepare_launch(const void* kernel, const Plan& plan) {
  if (plan.shared_bytes <= 48 * 1024) return;
  int device = 0;
  TE_CHECK_CUDA(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> raised;
  std::lock_guard<std::mutex> lock(mutex);
  size_t& done = raised[{kernel, device}];
  if (done >= plan.shared_bytes) return;
  TE_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(plan.shared_bytes)));
  done = plan.shared_bytes;
}

namespace {

// Forward scratch: per-row statistics first (the smallest, the most used).
enum FwdBuffer { kStats, kS, kW, kQ, kAcc, kKV, kFwdBuffers };
// Rows of the stats buffer: running max m, denominator l, this tile's
// correction, whether this tile updates the row, whether any tile did.
enum Stat { kM, kL, kCorr, kUpdate, kSeen, kStatRows };

Plan fwd_plan(const FwdArgs& a) {
  const Dims& d = a.dims;
  const int64_t floats[kFwdBuffers] = {
      kStatRows * kBlockQ,        kBlockQ * kBlockK, kBlockQ * kBlockK,
      kBlockQ * tile_stride(d.d), kBlockQ * d.dv,    kBlockK * tile_stride(std::max(d.d, d.dv))};
  const int64_t tasks = d.b * d.h * ceil_div(d.sq, kBlockQ);
  return make_plan(floats, kFwdBuffers, tasks);
}

struct FwdTile {
  float *stats, *s, *w, *q, *acc, *kv;
  int64_t ldq, ldkv;
};

// The online-softmax step of one key tile for row r (one warp): m, l, the
// correction and the weights w = exp(S - m) * keep, as the CPU's
// online_update computes them (a tile whose logits are all -inf or NaN
// leaves the row alone).
__device__ void softmax_row(const FwdArgs& a, const Dropout& drop, const Seq& s, int64_t h,
                            int64_t i, int64_t j0, int64_t nk, int64_t r, FwdTile& t) {
  const int lane = threadIdx.x % 32;
  const float ninf = __int_as_float(0xFF800000u);
  float* srow = t.s + r * kBlockK;
  float* wrow = t.w + r * kBlockK;
  const float s0 = lane < nk ? srow[lane] : ninf;
  const float s1 = lane + 32 < nk ? srow[lane + 32] : ninf;
  float mx = fmaxf(s0, s1);  // fmaxf drops NaN, as the CPU's std::max does
#pragma unroll
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
  float* st = t.stats;
  if (mx == ninf) {
    if (lane == 0) st[kUpdate * kBlockQ + r] = 0.0f;
    return;
  }
  const float m_old = st[kM * kBlockQ + r];
  const float m_new = fmaxf(m_old, mx);
  const float e0 = (lane < nk && s0 != ninf) ? expf(__fsub_rn(s0, m_new)) : 0.0f;
  const float e1 = (lane + 32 < nk && s1 != ninf) ? expf(__fsub_rn(s1, m_new)) : 0.0f;
  // The dropout draw matters only where the weight is not already 0.
  if (lane < nk)
    wrow[lane] = e0 == 0.0f ? 0.0f : __fmul_rn(e0, keep_factor(a, drop, s.b, h, i, j0 + lane));
  if (lane + 32 < nk)
    wrow[lane + 32] =
        e1 == 0.0f ? 0.0f : __fmul_rn(e1, keep_factor(a, drop, s.b, h, i, j0 + lane + 32));
  if (lane < nk) srow[lane] = e0;
  if (lane + 32 < nk) srow[lane + 32] = e1;
  __syncwarp();
  if (lane == 0) {  // the denominator in key order, as the CPU adds it
    const float corr = expf(__fsub_rn(m_old, m_new));
    float l = __fmul_rn(st[kL * kBlockQ + r], corr);
    for (int64_t c = 0; c < nk; ++c) l = __fadd_rn(l, srow[c]);
    st[kL * kBlockQ + r] = l;
    st[kM * kBlockQ + r] = m_new;
    st[kCorr * kBlockQ + r] = corr;
    st[kUpdate * kBlockQ + r] = 1.0f;
    st[kSeen * kBlockQ + r] = 1.0f;
  }
}

// acc = acc * corr + sum_c w_c v_c (keys in order, zero weights skipped).
__device__ void accumulate(int64_t nq, int64_t nk, int64_t dv, FwdTile& t) {
  for (int64_t e = threadIdx.x; e < nq * dv; e += blockDim.x) {
    const int64_t r = e / dv, k = e % dv;
    if (t.stats[kUpdate * kBlockQ + r] == 0.0f) continue;
    float x = __fmul_rn(t.acc[e], t.stats[kCorr * kBlockQ + r]);
    for (int64_t c = 0; c < nk; ++c) {
      const float w = t.w[r * kBlockK + c];
      if (w != 0.0f) x = __fadd_rn(x, __fmul_rn(w, t.kv[c * t.ldkv + k]));
    }
    t.acc[e] = x;
  }
}

// Rows i0 .. i0 + nq of (sequence s, head h): cpu.cpp's forward_block.
template <class T>
__device__ void forward_block(const FwdArgs& a, const Dropout& drop, const Seq& s, int64_t h,
                              int64_t i0, int64_t nq, FwdTile& t) {
  const Dims& d = a.dims;
  const int64_t hk = h / (d.h / d.hk);
  const bool sink = a.softmax_type != TE_SOFTMAX_VANILLA;
  const HeadTerms<T> terms = head_terms<T>(a, s.b, h);
  load_rows<T>(a, a.q, true, s.b, i0, nq, d.h, h, d.d, t.q, t.ldq);
  for (int64_t r = threadIdx.x; r < kBlockQ; r += blockDim.x) {
    t.stats[kM * kBlockQ + r] = sink ? sink_logit(a, h) : __int_as_float(0xFF800000u);
    t.stats[kL * kBlockQ + r] = sink ? 1.0f : 0.0f;
    t.stats[kSeen * kBlockQ + r] = 0.0f;
  }
  fill(t.acc, nq * d.dv, 0.0f);
  __syncthreads();
  int64_t lo, hi;
  key_range(a, s, i0, i0 + nq, &lo, &hi);
  for (int64_t j0 = lo; j0 < hi; j0 += kBlockK) {
    const int64_t nk = std::min<int64_t>(kBlockK, hi - j0);
    load_rows<T>(a, a.k, false, s.b, j0, nk, d.hk, hk, d.d, t.kv, t.ldkv);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < nq * nk; e += blockDim.x) {
      const int64_t r = e / nk, c = e % nk;
      t.s[r * kBlockK + c] =
          logit<T>(a, s, terms, i0 + r, j0 + c, t.q + r * t.ldq, t.kv + c * t.ldkv);
    }
    __syncthreads();
    for (int64_t r = threadIdx.x / 32; r < nq; r += kWarps)
      softmax_row(a, drop, s, h, i0 + r, j0, nk, r, t);
    __syncthreads();
    load_rows<T>(a, a.v, false, s.b, j0, nk, d.hk, hk, d.dv, t.kv, t.ldkv);
    __syncthreads();
    accumulate(nq, nk, d.dv, t);
    __syncthreads();
  }
  // Rows no tile reached stay as initialized: O = 0, lse = -inf.
  T* o = static_cast<T*>(a.o);
  for (int64_t e = threadIdx.x; e < nq * d.dv; e += blockDim.x) {
    const int64_t r = e / d.dv, k = e % d.dv;
    if (t.stats[kSeen * kBlockQ + r] == 0.0f) continue;
    const float l = t.stats[kL * kBlockQ + r];
    o[(q_row(a, s.b, i0 + r) * d.h + h) * d.dv + k] =
        cuda_elem::from_float<T>(__fdiv_rn(t.acc[e], l));
  }
  for (int64_t r = threadIdx.x; r < nq; r += blockDim.x) {
    if (t.stats[kSeen * kBlockQ + r] == 0.0f) continue;
    a.lse[lse_index(a, s.b, h, i0 + r)] =
        __fadd_rn(t.stats[kM * kBlockQ + r], logf(t.stats[kL * kBlockQ + r]));
  }
  __syncthreads();  // the next task reuses the buffers
}

template <class T>
__global__ void __launch_bounds__(kThreads) forward_kernel(const FwdArgs a, const Plan plan) {
  extern __shared__ float4 shared_raw[];
  float* shared = reinterpret_cast<float*>(shared_raw);
  float* slices = static_cast<float*>(a.workspace);
  const Dims& d = a.dims;
  FwdTile t{buffer(plan, kStats, shared, slices),
            buffer(plan, kS, shared, slices),
            buffer(plan, kW, shared, slices),
            buffer(plan, kQ, shared, slices),
            buffer(plan, kAcc, shared, slices),
            buffer(plan, kKV, shared, slices),
            tile_stride(d.d),
            tile_stride(d.d > d.dv ? d.d : d.dv)};
  const Dropout drop = dropout_of(a);
  const int64_t blocks_q = (d.sq + kBlockQ - 1) / kBlockQ;
  for (int64_t task = blockIdx.x; task < plan.tasks; task += gridDim.x) {
    const int64_t b = task / (d.h * blocks_q), h = (task / blocks_q) % d.h;
    const int64_t i0 = (task % blocks_q) * kBlockQ;
    const Seq s = seq_of(a, b);
    if (i0 < s.len_q)
      forward_block<T>(a, drop, s, h, i0, std::min<int64_t>(kBlockQ, s.len_q - i0), t);
  }
}

__global__ void fill_kernel(float* p, int64_t n, float v) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x)
    p[e] = v;
}

}  // namespace

void fill_async(float* p, int64_t n, float v, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>(ceil_div(n, 256), 4096);
  fill_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, n, v);
  TE_CHECK_LAUNCH();
}

}  // namespace fallback

namespace cuda_fallback {

size_t fwd_workspace(const FwdArgs& a) { return fallback::slice_bytes(fallback::fwd_plan(a)); }

void forward(const FwdArgs& a, te_stream stream) {
  using namespace fallback;
  const cudaStream_t s = cuda_stream(stream);
  const Dims& d = a.dims;
  // Rows outside every sequence (and rows no key reaches) are masked rows.
  const size_t elem = a.dtype == TE_DTYPE_FLOAT32 ? 4 : 2;
  const int64_t rows = q_tokens(a) * d.h;
  if (rows > 0) TE_CHECK_CUDA(cudaMemsetAsync(a.o, 0, static_cast<size_t>(rows * d.dv) * elem, s));
  fill_async(a.lse, rows, -INFINITY, s);
  const Plan plan = fwd_plan(a);
  if (plan.tasks == 0) return;
  cuda_elem::dispatch_input(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const void* kernel = reinterpret_cast<const void*>(&forward_kernel<T>);
    prepare_launch(kernel, plan);
    forward_kernel<T>
        <<<static_cast<unsigned>(plan.blocks), kThreads, plan.shared_bytes, s>>>(a, plan);
    TE_CHECK_LAUNCH();
  });
}

}  // namespace cuda_fallback
}  // namespace te::attention
