// bias_grad[i] = sum_k op(A)[i, k] (kernels.h), in FP32, deterministic.
//
// Memory-bound: each element of A is read once, with 16-byte loads where the
// layout allows (the summed dimension's neighbours are contiguous and the
// base pointer is 16-byte aligned), else one element at a time. K is cut into
// `splits` parts (cuda_plan.cpp picks them from the shape) so that even a
// narrow bias has enough blocks; each part writes FP32 partial sums to the
// workspace and finish_kernel adds them in part order.
//
//   A stored [k, m] (the wgrad layout, transa): column sums. A block of
//     32 x 8 threads owns 32 * V columns; its 8 thread rows walk the part's
//     rows, then add up through shared memory in a fixed order.
//   A stored [m, k]: row sums. One warp per (row, part); lanes read
//     consecutive vectors, then a fixed shuffle tree adds them.
#include <algorithm>

#include "gemm/cublas_check.h"
#include "gemm/elements.cuh"
#include "gemm/kernels.h"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"

namespace te::gemm::kernels {
namespace {

// Element types: storage, 16-byte vector width, exact value as float.
struct F32Elem {
  using T = float;
  static constexpr int kVec = 4;
  static constexpr bool kFp8 = false;
  __device__ static float value(float x) { return x; }
};
struct Bf16Elem {
  using T = uint16_t;
  static constexpr int kVec = 8;
  static constexpr bool kFp8 = false;
  __device__ static float value(uint16_t x) { return __uint_as_float(uint32_t(x) << 16); }
};
struct Fp16Elem {
  using T = uint16_t;
  static constexpr int kVec = 8;
  static constexpr bool kFp8 = false;
  __device__ static float value(uint16_t x) { return __half2float(__ushort_as_half(x)); }
};
template <__nv_fp8_interpretation_t kKind>
struct Fp8Elem {
  using T = uint8_t;
  static constexpr int kVec = 16;
  static constexpr bool kFp8 = true;
  __device__ static float value(uint8_t x) { return fp8_value(x, kKind); }
};

// The dequantized element (FP8: float(q) * scale_inv rounded to FP32, as the
// contract states; the product is exact for the other types, so skip it).
template <class E>
__device__ __forceinline__ float element(typename E::T x, float scale) {
  return E::kFp8 ? E::value(x) * scale : E::value(x);
}

template <class T, int V>
__device__ __forceinline__ Vec<T, V> load_elements(const T* p) {
  if constexpr (V == 1) {
    Vec<T, 1> r;
    r.v[0] = p[0];
    return r;
  } else {
    return load_vec<T, V>(p);
  }
}

// Part `part` of output i: the final value when there is one part.
__device__ __forceinline__ void write_sum(const BiasGradArgs& p, int64_t part, int64_t i, float s) {
  if (p.splits > 1)
    p.partials[part * p.m + i] = s;
  else
    store_high(p.out, p.out_dtype, i, s);
}

constexpr int kColThreads = 32;  // column-sum block: 32 x kRowLanes threads
constexpr int kRowLanes = 8;

template <class E, int V>
__global__ void __launch_bounds__(kColThreads* kRowLanes)
    column_sums_kernel(BiasGradArgs p, int64_t rows_per_part) {
  // Thread x's V sums at x * (V + 1): with the odd stride neither these stores
  // nor the column-order reads below hit one bank twice.
  __shared__ float lanes[kRowLanes][kColThreads * (V + 1)];
  const float scale = E::kFp8 ? *p.scale_inv : 1.0f;
  const auto* a = static_cast<const typename E::T*>(p.a);
  const int64_t block_col = static_cast<int64_t>(blockIdx.x) * kColThreads * V;
  const int64_t col = block_col + static_cast<int64_t>(threadIdx.x) * V;
  const int64_t part = blockIdx.y;
  const int64_t r0 = part * rows_per_part, r1 = std::min(p.k, r0 + rows_per_part);
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0.0f;
  if (col < p.m) {  // V > 1 only when m % V == 0: the whole vector is inside
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const Vec<typename E::T, V> x = load_elements<typename E::T, V>(a + r * p.m + col);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += element<E>(x.v[j], scale);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) lanes[threadIdx.y][threadIdx.x * (V + 1) + j] = acc[j];
  __syncthreads();
  for (int c = threadIdx.y * kColThreads + threadIdx.x; c < kColThreads * V;
       c += kColThreads * kRowLanes) {
    if (block_col + c >= p.m) break;
    const int at = c + c / V;  // (c / V) * (V + 1) + c % V
    float s = lanes[0][at];
#pragma unroll
    for (int y = 1; y < kRowLanes; ++y) s += lanes[y][at];
    write_sum(p, part, block_col + c, s);
  }
}

constexpr int kRowThreads = 256;  // row-sum block: 8 warps, one (row, part) each

template <class E, int V>
__global__ void __launch_bounds__(kRowThreads)
    row_sums_kernel(BiasGradArgs p, int64_t cols_per_part) {
  const float scale = E::kFp8 ? *p.scale_inv : 1.0f;
  const auto* a = static_cast<const typename E::T*>(p.a);
  const int lane = threadIdx.x % 32;
  const int64_t items = p.m * p.splits;
  // Warp-uniform loop: every lane of a warp has the same item.
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * (kRowThreads / 32) + threadIdx.x / 32;
       item < items; item += static_cast<int64_t>(gridDim.x) * (kRowThreads / 32)) {
    const int64_t row = item / p.splits, part = item % p.splits;
    const int64_t c0 = part * cols_per_part, c1 = std::min(p.k, c0 + cols_per_part);
    const auto* x_row = a + row * p.k;
    float acc = 0.0f;
    // c0 is a multiple of 16 and k % V == 0 when V > 1: whole vectors only.
#pragma unroll 4
    for (int64_t c = c0 + static_cast<int64_t>(lane) * V; c < c1; c += 32 * V) {
      const Vec<typename E::T, V> x = load_elements<typename E::T, V>(x_row + c);
#pragma unroll
      for (int j = 0; j < V; ++j) acc += element<E>(x.v[j], scale);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      acc += __shfl_down_sync(0xFFFFFFFFu, acc, offset);
    if (lane == 0) write_sum(p, part, row, acc);
  }
}

// out[i] = sum over parts of partials[part * m + i], in part order.
__global__ void finish_kernel(BiasGradArgs p) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.m;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t part = 0; part < p.splits; ++part) s += p.partials[part * p.m + i];
    store_high(p.out, p.out_dtype, i, s);
  }
}

constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // grid-stride kernels: cap on blocks

unsigned int blocks_for(int64_t useful) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(useful, kMaxBlocks)));
}

template <class E>
void launch(const BiasGradArgs& p, cudaStream_t stream) {
  constexpr int V = E::kVec;
  const bool aligned = is_aligned(p.a, 16);
  if (p.trans) {  // A stored [k, m]
    const int64_t rows_per_part = std::max<int64_t>(1, ceil_div(p.k, p.splits));
    const dim3 block(kColThreads, kRowLanes);
    // One block per 32 * V columns and part (splits <= 128 fits grid.y).
    const auto parts = static_cast<unsigned int>(p.splits);
    if (aligned && p.m % V == 0) {
      const dim3 grid(static_cast<unsigned int>(ceil_div(p.m, kColThreads * V)), parts);
      column_sums_kernel<E, V><<<grid, block, 0, stream>>>(p, rows_per_part);
    } else {
      const dim3 grid(static_cast<unsigned int>(ceil_div(p.m, kColThreads)), parts);
      column_sums_kernel<E, 1><<<grid, block, 0, stream>>>(p, rows_per_part);
    }
  } else {  // A stored [m, k]
    const int64_t cols_per_part = ceil_div(std::max<int64_t>(1, ceil_div(p.k, p.splits)), 16) * 16;
    const unsigned int grid = blocks_for(ceil_div(p.m * p.splits, kRowThreads / 32));
    if (aligned && p.k % V == 0)
      row_sums_kernel<E, V><<<grid, kRowThreads, 0, stream>>>(p, cols_per_part);
    else
      row_sums_kernel<E, 1><<<grid, kRowThreads, 0, stream>>>(p, cols_per_part);
  }
  TE_GEMM_CHECK_LAUNCH();
}

}  // namespace

void bias_grad(const BiasGradArgs& args, cudaStream_t stream) {
  if (args.m == 0) return;
  switch (args.a_dtype) {
    case TE_DTYPE_FLOAT32: launch<F32Elem>(args, stream); break;
    case TE_DTYPE_BFLOAT16: launch<Bf16Elem>(args, stream); break;
    case TE_DTYPE_FLOAT16: launch<Fp16Elem>(args, stream); break;
    case TE_DTYPE_FLOAT8E4M3: launch<Fp8Elem<__NV_E4M3>>(args, stream); break;
    default: launch<Fp8Elem<__NV_E5M2>>(args, stream); break;
  }
  if (args.splits > 1) {
    constexpr int kThreads = 256;
    finish_kernel<<<blocks_for(ceil_div(args.m, kThreads)), kThreads, 0, stream>>>(args);
    TE_GEMM_CHECK_LAUNCH();
  }
}

}  // namespace te::gemm::kernels
