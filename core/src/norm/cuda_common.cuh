// Building blocks of the norm family's CUDA kernels (cuda_fwd.cu, cuda_bwd.cu).
//
// Row layout. A row of H elements is cut into chunks (the forward: 16 bytes of
// x; the backward: 8 elements, one 16-byte access of BF16/FP16, two of FP32).
// The threads of a row take the chunks round-robin: thread t holds chunks t,
// t + threads, ..., so each warp-wide access is contiguous. The row stays in
// registers, packed in x's type, between its reductions and its output, and
// is widened to FP32 again in each pass. A block holds one or more such row
// groups and walks the rows grid-stride.
//
// Arithmetic. Every FP32 operation that feeds an output is an explicit
// round-to-nearest intrinsic (__fadd_rn, __fmul_rn, ...), which the compiler
// never contracts into an FMA: the FP32 y is then the same whatever the output
// type, and a fused FP8 output quantizes exactly the values an FP32 output
// holds. Row sums: each thread adds its own elements (the backward in order;
// the forward a balanced tree per chunk, then the chunks in order), a
// butterfly over the warp gives every lane the same total, and the warps of a
// row add their totals in warp order: fixed order, deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "norm/backend.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"
#include "runtime/numerics.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace te::norm::cuda {

constexpr int kChunk = 8;  // elements per vector access

template <int kWarps_, int kChunks_>
struct RowShape {
  static constexpr int kWarps = kWarps_;    // warps per row
  static constexpr int kChunks = kChunks_;  // chunks per thread
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockWarps = kWarps > 8 ? kWarps : 8;
  static constexpr int kRowsPerBlock = kBlockWarps / kWarps;
  static constexpr int kBlockThreads = 32 * kBlockWarps;
  static constexpr int64_t kCapacity = int64_t{kThreads} * kChunks * kChunk;
};

// The rows longer than every RowShape go to the looped kernels: one block per
// row, kLoopThreads threads striding over it, several passes over global memory.
constexpr int kLoopThreads = 512;

// The backward's shapes: calls f(RowShape<w, c>{}) for the smallest one whose
// capacity holds H (w doubles, c at most 2 chunks: the backward keeps two
// column sums per element in registers) and returns true, or returns false
// when H is longer than 8192.
template <class F>
bool with_row_shape(int64_t H, F&& f) {
  if (H <= RowShape<1, 1>::kCapacity) return f(RowShape<1, 1>{}), true;
  if (H <= RowShape<1, 2>::kCapacity) return f(RowShape<1, 2>{}), true;
  if (H <= RowShape<2, 2>::kCapacity) return f(RowShape<2, 2>{}), true;
  if (H <= RowShape<4, 2>::kCapacity) return f(RowShape<4, 2>{}), true;
  if (H <= RowShape<8, 2>::kCapacity) return f(RowShape<8, 2>{}), true;
  // A 32-warp row would have 64 registers per thread: too few (spills).
  if (H <= RowShape<16, 2>::kCapacity) return f(RowShape<16, 2>{}), true;
  return false;
}

// Host dispatch on x's type: f(T{}) with T = float, __nv_bfloat16 or __half.
template <class F>
void dispatch_x(te_dtype dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: f(float{}); return;
    case TE_DTYPE_BFLOAT16: f(__nv_bfloat16{}); return;
    case TE_DTYPE_FLOAT16: f(__half{}); return;
    default: fail(TE_ERROR_INTERNAL, "unexpected dtype ", dtype_name(dtype));
  }
}

// Blocks of a grid-stride launch: one full wave of resident blocks (given the
// dynamic shared memory), at most `useful`, at least 1. Kernels that need
// more than 48 KiB of shared memory are opted in first.
int64_t resident_grid(const void* kernel, int threads, size_t smem_bytes, int64_t useful);

// ---------------------------------------------------------------------------
// Device helpers

__host__ __device__ __forceinline__ bool is_fp8_code(te_dtype t) {
  return t == TE_DTYPE_FLOAT8E4M3 || t == TE_DTYPE_FLOAT8E5M2;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// Element i of an FP32/BF16/FP16 buffer whose type is known at run time.
__device__ __forceinline__ float load_any(const void* p, te_dtype t, int64_t i) {
  if (t == TE_DTYPE_BFLOAT16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (t == TE_DTYPE_FLOAT16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// ---------------------------------------------------------------------------
// Packed rows: 16 bytes of x as four 32-bit words, widened exactly to FP32.
// The widening is volatile asm so that the compiler cannot merge the identical
// unpacks of several passes into one set of live floats: the point is to keep
// only the packed row live across the reductions.

__device__ __forceinline__ void widen_pair(uint32_t w, float& lo, float& hi, __nv_bfloat16) {
  // BF16 is the high half of an FP32.
  asm volatile("{ shl.b32 %0, %2, 16; and.b32 %1, %2, 0xFFFF0000; }" : "=f"(lo), "=f"(hi) : "r"(w));
}
__device__ __forceinline__ void widen_pair(uint32_t w, float& lo, float& hi, __half) {
  asm volatile("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
               : "=f"(lo), "=f"(hi)
               : "r"(w));
}
__device__ __forceinline__ void unpack(const uint32_t (&w)[4], float (&f)[4], float) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("mov.b32 %0, %1;" : "=f"(f[i]) : "r"(w[i]));
}
template <class Tx>
__device__ __forceinline__ void unpack(const uint32_t (&w)[4], float (&f)[8], Tx tag) {
#pragma unroll
  for (int i = 0; i < 4; ++i) widen_pair(w[i], f[2 * i], f[2 * i + 1], tag);
}

// The 16 bytes at p, of which `left` elements (if positive) lie in the row:
// one 16-byte load (vec: p 16-byte aligned and the 16 bytes wholly in or out
// of the row), or element loads. Elements past the row are 0.
template <class Tx>
__device__ __forceinline__ void load_packed(const Tx* p, int left, bool vec, uint32_t (&w)[4]) {
  if (vec) {
    uint4 q = make_uint4(0, 0, 0, 0);
    if (left > 0) q = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = q.x, w[1] = q.y, w[2] = q.z, w[3] = q.w;
    return;
  }
  if constexpr (sizeof(Tx) == 4) {
    const unsigned int* e = reinterpret_cast<const unsigned int*>(p);
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = j < left ? __ldg(e + j) : 0u;
  } else {
    const unsigned short* e = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = 2 * i < left ? __ldg(e + 2 * i) : 0u;
      const uint32_t hi = 2 * i + 1 < left ? __ldg(e + 2 * i + 1) : 0u;
      w[i] = lo | (hi << 16);
    }
  }
}

// v, hidden from the optimizer: per-chunk row-end tests derived from it are
// recomputed in each pass where they are used, instead of being hoisted out
// of the row loop into one live register (or predicate copy) per chunk.
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

// ---------------------------------------------------------------------------
// Weights in shared memory, per-chunk layout: element j of chunk c (chunks of
// kE elements, kE = 4 or 8) is at (j / 4) * part + 4 * c + j % 4, with
// part = 4 * chunks. The float4 of a chunk's elements [4p, 4p + 4) lies at
// 4 * c + p * part: consecutive across the lanes of a warp, so reading a
// chunk's weights has no bank conflicts. Slots past H hold 0.

// Fills dst (chunks * kE floats) with value(i) for i < H, 0 past it.
template <int kE, class F>
__device__ __forceinline__ void stage_weights(float* dst, int H, F value) {
  const int chunks = (H + kE - 1) / kE;
  for (int i = threadIdx.x; i < chunks * kE; i += blockDim.x)
    dst[(i % kE) / 4 * (4 * chunks) + 4 * (i / kE) + i % 4] = i < H ? value(i) : 0.0f;
}

// The kE weights of the chunk whose first float4 is at w_c (= dst + 4 * c).
template <int kE>
__device__ __forceinline__ void load_weights(const float* w_c, int part, float (&v)[kE]) {
#pragma unroll
  for (int p = 0; p < kE / 4; ++p) {
    const float4 q = *reinterpret_cast<const float4*>(w_c + p * part);
    v[4 * p] = q.x, v[4 * p + 1] = q.y, v[4 * p + 2] = q.z, v[4 * p + 3] = q.w;
  }
}

// float -> T as the CPU backend rounds (RNE; NaN keeps its sign and becomes
// 0x7FFF in BF16/FP16, as te::float_to_bf16 / float_to_fp16).
using cuda_elem::from_float;

// Rounds the 8 values of the chunk at p to T and stores those in the row
// (`left` of them if fewer than 8): one vector store (vec: aligned, whole
// chunks) or element stores.
template <class T>
__device__ __forceinline__ void store_chunk(T* p, int left, bool vec, const float (&v)[kChunk]) {
  if (vec) {
    if (left <= 0) return;
    Vec<T, kChunk> r;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) r.v[j] = from_float<T>(v[j]);
    store_vec(p, r);
    return;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j)
    if (j < left) p[j] = from_float<T>(v[j]);
}

// FP8 byte of an already-scaled value, as numerics.h defines it: RNE,
// saturating to +-max (inf too), NaN -> 0x7F whatever its sign and payload.
__device__ __forceinline__ uint8_t fp8_byte(float v, bool e5m2) {
  if (v != v) return kFp8CanonicalNaN;
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// Sum of v over the lanes of a warp, the same in every lane (the two lanes of
// each butterfly pair add the same two numbers).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

// Sums of kN values over the kWarps warps of each row group, in warp order.
// Every thread of the block must call it (it synchronizes when kWarps > 1).
// The exchange buffer alternates between two halves (`parity`), so one
// __syncthreads per call suffices: a warp can only overwrite a half after
// every warp has passed the barrier of the call that followed its last read.
template <class Shape, int kN>
struct RowReducer {
  float (*buffer)[Shape::kRowsPerBlock][Shape::kWarps][kN];  // [2][groups][warps][kN]
  int parity;

  __device__ void sum(float (&v)[kN], int group, int warp_in_row, int lane) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = warp_sum(v[i]);
    if constexpr (Shape::kWarps > 1) {
      if (lane == 0) {
#pragma unroll
        for (int i = 0; i < kN; ++i) buffer[parity][group][warp_in_row][i] = v[i];
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float total = buffer[parity][group][0][i];
#pragma unroll
        for (int w = 1; w < Shape::kWarps; ++w)
          total = __fadd_rn(total, buffer[parity][group][w][i]);
        v[i] = total;
      }
      parity ^= 1;
    }
  }
};

// The weight of the formulas, g = gamma or 1 + gamma (FP32), for column i.
__device__ __forceinline__ float weight_at(const void* gamma, te_dtype t, int64_t i,
                                           bool zero_centered) {
  const float g = load_any(gamma, t, i);
  return zero_centered ? __fadd_rn(1.0f, g) : g;
}

// Sum of v over the block in fixed order (blockDim.x / 32 warps), valid in
// every thread. For the looped kernels; every thread must call it.
__device__ __forceinline__ float block_sum(float v, float* exchange /* [32] */) {
  v = warp_sum(v);
  const int warps = blockDim.x / 32;
  __syncthreads();  // the previous call's readers are done with `exchange`
  if (threadIdx.x % 32 == 0) exchange[threadIdx.x / 32] = v;
  __syncthreads();
  float total = exchange[0];
  for (int w = 1; w < warps; ++w) total = __fadd_rn(total, exchange[w]);
  return total;
}

}  // namespace te::norm::cuda
