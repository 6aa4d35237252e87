// CUDA backend of the fused softmax family (te/softmax.h). One warp per row
// (grid-stride over rows, kWarps rows per block); lane l takes the elements
// l, l + 32, ... of the row in order and the warp combines its 32 partials
// with an xor butterfly, which associates them as the CPU's pairwise tree
// does (softmax/backend.h). Each pass re-reads the row from global memory
// (cached): max, sum of exponentials, output. All FP32 operations are _rn
// intrinsics (never contracted into FMAs), so the backward gives the CPU's
// bits and the forward differs only through expf.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "softmax/backend.h"

namespace te::softmax::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_nan_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v = nan_max(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

__device__ __forceinline__ bool is_visible(const uint8_t* mask, int64_t prefix, int64_t j) {
  return j < prefix && (mask == nullptr || mask[j] == 0);
}

template <class T>
__device__ void forward_row(const Args& a, int64_t row, int lane) {
  using te::cuda_elem::from_float;
  using te::cuda_elem::to_float;
  const T* x = static_cast<const T*>(a.in) + row * a.sk;
  T* y = static_cast<T*>(a.out) + row * a.sk;
  const int64_t prefix = visible_prefix(a, row);
  const uint8_t* mask = mask_row(a, row);
  const float inf = __int_as_float(0x7F800000);
  float m = -inf;
  for (int64_t j = lane; j < a.sk; j += 32)
    if (is_visible(mask, prefix, j)) m = nan_max(m, __fmul_rn(to_float(x[j]), a.scale));
  m = warp_nan_max(m);
  if (m == -inf) {
    for (int64_t j = lane; j < a.sk; j += 32) y[j] = from_float<T>(0.0f);
    return;
  }
  float sum = 0.0f;
  for (int64_t j = lane; j < a.sk; j += 32)
    if (is_visible(mask, prefix, j))
      sum = __fadd_rn(sum, expf(__fsub_rn(__fmul_rn(to_float(x[j]), a.scale), m)));
  sum = warp_sum(sum);
  // Every lane has read its elements of x for the last time before it writes
  // them: y may be x.
  for (int64_t j = lane; j < a.sk; j += 32) {
    const float e =
        is_visible(mask, prefix, j) ? expf(__fsub_rn(__fmul_rn(to_float(x[j]), a.scale), m)) : 0.0f;
    y[j] = from_float<T>(__fdiv_rn(e, sum));
  }
}

template <class T>
__device__ void backward_row(const Args& a, int64_t row, int lane) {
  using te::cuda_elem::from_float;
  using te::cuda_elem::to_float;
  const T* dy = static_cast<const T*>(a.in) + row * a.sk;
  const T* y = static_cast<const T*>(a.y) + row * a.sk;
  T* dx = static_cast<T*>(a.out) + row * a.sk;
  float dot = 0.0f;
  for (int64_t j = lane; j < a.sk; j += 32)
    dot = __fadd_rn(dot, __fmul_rn(to_float(dy[j]), to_float(y[j])));
  dot = warp_sum(dot);
  for (int64_t j = lane; j < a.sk; j += 32) {
    const float g = __fmul_rn(to_float(y[j]), __fsub_rn(to_float(dy[j]), dot));
    dx[j] = from_float<T>(__fmul_rn(a.scale, g));
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) softmax_kernel(Args a) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  for (int64_t row = warp; row < a.rows; row += int64_t{gridDim.x} * kWarps) {
    if (a.backward) {
      backward_row<T>(a, row, lane);
    } else {
      forward_row<T>(a, row, lane);
    }
  }
}

}  // namespace

void run(const Args& a, te_stream stream) {
  te::cuda_elem::dispatch_input(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const void* kernel = reinterpret_cast<const void*>(&softmax_kernel<T>);
    const int64_t blocks = persistent_blocks(kernel, kThreads, ceil_div(a.rows, kWarps));
    softmax_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, cuda_stream(stream)>>>(a);
    TE_CHECK_LAUNCH();
  });
}

}  // namespace te::softmax::cuda
