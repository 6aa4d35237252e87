// Kernels around the cuDNN attention graphs (see cudnn_aux.h). All read the
// lengths on the device: the core never synchronizes.
#ifdef TE_WITH_CUDNN

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/cudnn_aux.h"
#include "runtime/cuda_check.h"

namespace te::attention::cudnn {
namespace {

__global__ void lengths_kernel(Inputs in, Lengths out) {
  const int64_t b = in.dims.b;
  for (int64_t i = threadIdx.x; i <= b; i += blockDim.x) {
    if (i < b && out.seqlen_q) out.seqlen_q[i] = in.cu_q[i + 1] - in.cu_q[i];
    if (i < b && out.seqlen_kv) out.seqlen_kv[i] = in.cu_kv[i + 1] - in.cu_kv[i];
    if (out.ragged_q) {
      const int64_t q0 = in.cu_q_padded[i], kv0 = in.cu_kv_padded[i];
      out.ragged_q[i] = static_cast<int32_t>(q0 * in.dims.h * in.dims.d);
      out.ragged_k[i] = static_cast<int32_t>(kv0 * in.dims.hk * in.dims.d);
      out.ragged_v[i] = static_cast<int32_t>(kv0 * in.dims.hk * in.dims.dv);
      out.ragged_o[i] = static_cast<int32_t>(q0 * in.dims.h * in.dims.dv);
      out.ragged_stats[i] = static_cast<int32_t>(q0 * in.dims.h);
    }
  }
}

// Memory row r of a q-like (query side) or k-like tensor: its sequence bi and
// in-sequence position i; false when r lies outside every sequence.
struct RowMap {
  int format;
  int64_t b, s;           // batch, sequence size of the tensor (bshd/sbhd)
  const int32_t* starts;  // thd: padded row offsets [b + 1]
  const int32_t* lens;    // per-sequence lengths [b], or null (= s)

  __device__ bool locate(int64_t r, int64_t* bi, int64_t* i) const {
    if (format == TE_QKV_FORMAT_BSHD) {
      *bi = r / s, *i = r % s;
    } else if (format == TE_QKV_FORMAT_SBHD) {
      *bi = r % b, *i = r / b;
    } else {                   // thd: the last sequence starting at or before r
      int64_t lo = 0, hi = b;  // starts[lo] <= r < starts[hi] when inside
      if (r >= starts[b]) return false;
      while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        (starts[mid] <= r ? lo : hi) = mid;
      }
      *bi = lo, *i = r - starts[lo];
    }
    return *i < length(*bi);
  }
  __device__ int64_t length(int64_t bi) const { return lens ? lens[bi] : s; }
};

// Query row i of sequence bi sees at least one key.
__device__ bool sees_a_key(const Inputs& in, int64_t i, int64_t len_q, int64_t len_kv) {
  const int64_t off = diagonal_offset(in.mask_type, len_q, len_kv);
  int64_t lo = in.window_left >= 0 ? i + off - in.window_left : 0;
  int64_t hi = in.window_right >= 0 ? i + off + in.window_right : len_kv - 1;
  lo = lo < 0 ? 0 : lo;
  hi = hi > len_kv - 1 ? len_kv - 1 : hi;
  return lo <= hi;
}

struct ZeroRows {
  RowMap rows;
  RowMap keys;  // query side: the kv lengths for the visibility test
  bool query;   // apply the visibility test (else: only "inside a sequence")
  int64_t count;
  uint16_t* out;  // BF16 / FP16 bits, `width` elements a row
  int64_t width;
  float* lse;  // query side, forward only: -inf for all heads of a dead row
  int64_t heads;
  float lse_value;
};

__global__ void zero_rows_kernel(Inputs in, ZeroRows z) {
  for (int64_t r = blockIdx.x; r < z.count; r += gridDim.x) {
    int64_t bi = 0, i = 0;
    bool live = z.rows.locate(r, &bi, &i);
    if (live && z.query) live = sees_a_key(in, i, z.rows.length(bi), z.keys.length(bi));
    if (live) continue;
    for (int64_t e = threadIdx.x; e < z.width; e += blockDim.x) z.out[r * z.width + e] = 0;
    if (z.lse == nullptr) continue;
    for (int64_t h = threadIdx.x; h < z.heads; h += blockDim.x) {
      // thd: [tq, h]; else [b, h, sq] (r was mapped to bi, i above, unless
      // outside every sequence, which only thd has).
      const int64_t at = in.qkv_format == TE_QKV_FORMAT_THD ? r * z.heads + h
                                                            : (bi * z.heads + h) * in.dims.sq + i;
      z.lse[at] = z.lse_value;
    }
  }
}

__global__ void lse_kernel(const float* lse, float* out, int64_t n) {
  const float inf = __int_as_float(0x7f800000);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = lse[e];
    out[e] = (v == -inf || v != v) ? inf : v;
  }
}

constexpr int kSinkRows = 256;  // query rows per block of the dsink partial sums

__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float to_float(__half x) { return __half2float(x); }

// Block (c, h): warp w sums exp(alpha_h - lse) * (dO . O) over rows c * 256 + w + 8 k.
template <class T>
__global__ void dsink_partial_kernel(Inputs in, const T* o, const T* d_o, const float* lse,
                                     float* partial, int64_t rows, int64_t chunks) {
  const int64_t h = blockIdx.y, heads = in.dims.h, dv = in.dims.dv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float alpha = in.softmax_offset[h];
  float acc = 0.0f;
  for (int64_t r = blockIdx.x * kSinkRows + warp; r < (blockIdx.x + 1) * kSinkRows && r < rows;
       r += blockDim.x / 32) {
    int64_t at = r * heads + h;  // thd: lse [tq, h]
    if (in.qkv_format == TE_QKV_FORMAT_BSHD) {
      at = ((r / in.dims.sq) * heads + h) * in.dims.sq + r % in.dims.sq;
    } else if (in.qkv_format == TE_QKV_FORMAT_SBHD) {
      at = ((r % in.dims.b) * heads + h) * in.dims.sq + r / in.dims.b;
    }
    const float l = lse[at];
    if (!(l > -__builtin_huge_valf())) continue;  // a dead row adds nothing
    const T* orow = o + (r * heads + h) * dv;
    const T* grow = d_o + (r * heads + h) * dv;
    float dot = 0.0f;
    for (int64_t e = lane; e < dv; e += 32) dot += to_float(orow[e]) * to_float(grow[e]);
    for (int m = 16; m > 0; m /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, m);
    acc += expf(alpha - l) * dot;
  }
  __shared__ float sums[32];
  if (lane == 0) sums[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += sums[w];
    partial[h * chunks + blockIdx.x] = total;
  }
}

__global__ void dsink_total_kernel(const float* partial, int64_t chunks, int64_t heads,
                                   float* out) {
  for (int64_t h = threadIdx.x; h < heads; h += blockDim.x) {
    float total = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) total += partial[h * chunks + c];
    out[h] = -total;
  }
}

bool padded(const Inputs& in) {
  return is_padding_mask(in.mask_type) || in.qkv_format == TE_QKV_FORMAT_THD;
}

RowMap row_map(const Inputs& in, bool query, const Lengths& len) {
  const bool thd = in.qkv_format == TE_QKV_FORMAT_THD;
  RowMap m{in.qkv_format, in.dims.b, query ? in.dims.sq : in.dims.skv, nullptr, nullptr};
  if (thd) m.starts = query ? in.cu_q_padded : in.cu_kv_padded;
  if (padded(in)) m.lens = query ? len.seqlen_q : len.seqlen_kv;
  return m;
}

int64_t row_count(const Inputs& in, bool query) {
  if (in.qkv_format == TE_QKV_FORMAT_THD) return query ? in.dims.tq : in.dims.tkv;
  return in.dims.b * (query ? in.dims.sq : in.dims.skv);
}

void launch_zero(const Inputs& in, const ZeroRows& z, cudaStream_t stream) {
  if (z.count == 0) return;
  const int64_t blocks = z.count < 8192 ? z.count : 8192;
  zero_rows_kernel<<<static_cast<unsigned>(blocks), 128, 0, stream>>>(in, z);
  TE_CHECK_LAUNCH();
}

int64_t query_rows(const Inputs& in) {
  return in.qkv_format == TE_QKV_FORMAT_THD ? in.dims.tq : in.dims.b * in.dims.sq;
}

}  // namespace

size_t dsink_partials(const Inputs& in) {
  return static_cast<size_t>((query_rows(in) + kSinkRows - 1) / kSinkRows * in.dims.h);
}

void dsoftmax_offset(const BwdArgs& a, float* partial, cudaStream_t stream) {
  const int64_t rows = query_rows(a), chunks = (rows + kSinkRows - 1) / kSinkRows;
  if (chunks > 0) {
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(a.dims.h));
    if (a.dtype == TE_DTYPE_BFLOAT16) {
      dsink_partial_kernel<<<grid, 256, 0, stream>>>(a, static_cast<const __nv_bfloat16*>(a.o),
                                                     static_cast<const __nv_bfloat16*>(a.d_o),
                                                     a.lse, partial, rows, chunks);
    } else {
      dsink_partial_kernel<<<grid, 256, 0, stream>>>(a, static_cast<const __half*>(a.o),
                                                     static_cast<const __half*>(a.d_o), a.lse,
                                                     partial, rows, chunks);
    }
    TE_CHECK_LAUNCH();
  }
  dsink_total_kernel<<<1, 128, 0, stream>>>(partial, chunks, a.dims.h, a.dsoftmax_offset);
  TE_CHECK_LAUNCH();
}

void compute_lengths(const Inputs& in, const Lengths& out, cudaStream_t stream) {
  lengths_kernel<<<1, 256, 0, stream>>>(in, out);
  TE_CHECK_LAUNCH();
}

void fix_dead_rows(const Inputs& in, const Lengths& lengths, void* o, float* lse,
                   cudaStream_t stream) {
  ZeroRows z{row_map(in, true, lengths), row_map(in, false, lengths), true, row_count(in, true),
             static_cast<uint16_t*>(o),  in.dims.h * in.dims.dv,      lse,  in.dims.h,
             -__builtin_huge_valf()};
  launch_zero(in, z, stream);
}

void lse_for_backward(const Inputs& in, const float* lse, float* out, cudaStream_t stream) {
  const int64_t n = in.qkv_format == TE_QKV_FORMAT_THD ? in.dims.tq * in.dims.h
                                                       : in.dims.b * in.dims.h * in.dims.sq;
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  if (n == 0) return;
  lse_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(lse, out, n);
  TE_CHECK_LAUNCH();
}

void zero_dead_gradients(const Inputs& in, const Lengths& lengths, void* dq, void* dk, void* dv,
                         cudaStream_t stream) {
  const RowMap q = row_map(in, true, lengths), kv = row_map(in, false, lengths);
  launch_zero(in,
              {q, kv, true, row_count(in, true), static_cast<uint16_t*>(dq), in.dims.h * in.dims.d,
               nullptr, 0, 0.0f},
              stream);
  launch_zero(in,
              {kv, kv, false, row_count(in, false), static_cast<uint16_t*>(dk),
               in.dims.hk * in.dims.d, nullptr, 0, 0.0f},
              stream);
  launch_zero(in,
              {kv, kv, false, row_count(in, false), static_cast<uint16_t*>(dv),
               in.dims.hk * in.dims.dv, nullptr, 0, 0.0f},
              stream);
}

}  // namespace te::attention::cudnn

#endif  // TE_WITH_CUDNN
