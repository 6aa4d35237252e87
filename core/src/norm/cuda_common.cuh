// Building blocks of the norm family's CUDA kernels (cuda_fwd.cu, cuda_bwd.cu).
//
// Row layout. A row of H elements is cut into chunks of 8 (one 16-byte access
// of BF16/FP16, two of FP32, 8 bytes of FP8). The kThreads = 32 * kWarps
// threads of a row take the chunks round-robin: thread t holds chunks t,
// t + kThreads, ..., kChunks of them, so each warp-wide access is contiguous.
// The whole row stays in registers between its reduction and its output. A
// block holds kRowsPerBlock such row groups and walks the rows grid-stride.
//
// Arithmetic. Every FP32 operation that feeds an output is an explicit
// round-to-nearest intrinsic (__fadd_rn, __fmul_rn, ...), which the compiler
// never contracts into an FMA: the FP32 y is then the same whatever the output
// type, and a fused FP8 output quantizes exactly the values an FP32 output
// holds. Row sums: each thread adds its elements in order, a butterfly over the
// warp gives every lane the same total, and the warps of a row add their totals
// in warp order: fixed order, deterministic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "norm/backend.h"
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

// Calls f(RowShape<w, c>{}) for the smallest shape whose capacity holds H
// (w doubles; c at most kMaxChunks) and returns true, or returns false when H
// is longer than all of them: 16384 with kMaxChunks = 4 (forward), 8192 with
// kMaxChunks = 2 (backward, which keeps four values per element in registers).
template <int kMaxChunks, class F>
bool with_row_shape(int64_t H, F&& f) {
  if (H <= RowShape<1, 1>::kCapacity) return f(RowShape<1, 1>{}), true;
  if (H <= RowShape<1, 2>::kCapacity) return f(RowShape<1, 2>{}), true;
  if constexpr (kMaxChunks == 4) {
    if (H <= RowShape<1, 4>::kCapacity) return f(RowShape<1, 4>{}), true;
    if (H <= RowShape<2, 4>::kCapacity) return f(RowShape<2, 4>{}), true;
    if (H <= RowShape<4, 4>::kCapacity) return f(RowShape<4, 4>{}), true;
    if (H <= RowShape<8, 4>::kCapacity) return f(RowShape<8, 4>{}), true;
    if (H <= RowShape<16, 4>::kCapacity) return f(RowShape<16, 4>{}), true;
  } else {
    static_assert(kMaxChunks == 2, "kMaxChunks is 2 or 4");
    if (H <= RowShape<2, 2>::kCapacity) return f(RowShape<2, 2>{}), true;
    if (H <= RowShape<4, 2>::kCapacity) return f(RowShape<4, 2>{}), true;
    if (H <= RowShape<8, 2>::kCapacity) return f(RowShape<8, 2>{}), true;
    // A 32-warp row would have 64 registers per thread: too few (spills).
    if (H <= RowShape<16, 2>::kCapacity) return f(RowShape<16, 2>{}), true;
  }
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

// Elements [first, first + 8) of a row as floats, 0 past H. `vec`: H % 8 == 0
// and the row is 16-byte aligned, so a chunk is wholly in or out of the row.
template <class T>
__device__ __forceinline__ void load_chunk(const T* row, int64_t first, int64_t H, bool vec,
                                           float (&v)[kChunk]) {
  if (vec) {
    if (first < H) {
      const Vec<T, kChunk> r = load_vec<T, kChunk>(row + first);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) v[j] = to_f32(r.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < kChunk; ++j) v[j] = 0.0f;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j) v[j] = first + j < H ? to_f32(row[first + j]) : 0.0f;
}

// Same from a shared-memory float row (the weights).
__device__ __forceinline__ void load_smem_chunk(const float* row, int64_t first, int64_t H,
                                                bool vec, float (&v)[kChunk]) {
  if (vec && first < H) {
    const float4 a = *reinterpret_cast<const float4*>(row + first);
    const float4 b = *reinterpret_cast<const float4*>(row + first + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j) v[j] = first + j < H ? row[first + j] : 0.0f;
}

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// Rounds elements [first, first + 8) (those below H) to T and stores them.
template <class T>
__device__ __forceinline__ void store_chunk(T* row, int64_t first, int64_t H, bool vec,
                                            const float (&v)[kChunk]) {
  if (vec) {
    if (first >= H) return;
    Vec<T, kChunk> r;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) r.v[j] = from_f32<T>(v[j]);
    store_vec(row + first, r);
    return;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j)
    if (first + j < H) row[first + j] = from_f32<T>(v[j]);
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
        for (int w = 1; w < Shape::kWarps; ++w) total = __fadd_rn(total, buffer[parity][group][w][i]);
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
