// The GEMM family's own CUDA kernels, bias_grad's aside (see kernels.h for
// what each computes). They are small, memory-bound helpers around cuBLASLt:
// element types are dispatched per element on warp-uniform values, which
// costs nothing next to the memory traffic.
#include <algorithm>

#include "gemm/cublas_check.h"
#include "gemm/elements.cuh"
#include "gemm/kernels.h"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"
#include "runtime/tensor.h"

namespace te::gemm::kernels {
namespace {

constexpr int kTile = 32;     // transpose tile (bytes per side)
constexpr int kTileRows = 8;  // threads per tile column
constexpr int kMaxGridY = 65535;
constexpr int kEpilogueThreads = 256;

__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// V values to a high-precision buffer at element i: one 8- or 16-byte store
// for V = 4 (the caller checked the alignment).
template <int V>
__device__ __forceinline__ void store_high_vec(void* p, te_dtype t, int64_t i, const float* v) {
  if constexpr (V == 1) {
    store_high(p, t, i, v[0]);
  } else if (t == TE_DTYPE_FLOAT32) {
    Vec<float, V> x;
#pragma unroll
    for (int j = 0; j < V; ++j) x.v[j] = v[j];
    store_vec(static_cast<float*>(p) + i, x);
  } else {
    Vec<uint16_t, V> x;
#pragma unroll
    for (int j = 0; j < V; ++j)
      x.v[j] = t == TE_DTYPE_BFLOAT16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v[j]))
                                      : __half_as_ushort(__float2half_rn(v[j]));
    store_vec(static_cast<uint16_t*>(p) + i, x);
  }
}

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_down_sync(0xFFFFFFFFu, v, offset));
  return v;
}

// ---------------------------------------------------------------------------

// One kTile x kTile tile per block through shared memory, so that both the
// reads and the writes walk contiguous bytes.
__global__ void transpose_bytes_kernel(const uint8_t* in, uint8_t* out, int64_t rows,
                                       int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kTile) {
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t row = r0 + r, col = c0 + threadIdx.x;
      if (row < rows && col < cols) tile[r][threadIdx.x] = in[row * cols + col];
    }
    __syncthreads();
    for (int c = threadIdx.y; c < kTile; c += kTileRows) {
      const int64_t col = c0 + c, row = r0 + threadIdx.x;
      if (row < rows && col < cols) out[col * rows + row] = tile[threadIdx.x][c];
    }
    __syncthreads();
  }
}

// V consecutive outputs of one row per thread (V = 4 when the row length and
// the buffers allow whole 16-byte FP32 loads), grid-stride over the [m, n]
// output in row-major order. acc may be D itself (FP32 D in place): each
// element is read before the same thread writes it, so plain loads.
template <int V>
__global__ void __launch_bounds__(kEpilogueThreads) epilogue_kernel(EpilogueArgs p) {
  const float d_scale = p.d_scale ? *p.d_scale : 1.0f;
  const bool fp8_out = is_fp8_dtype(p.d_dtype);
  const int64_t vectors = p.m * p.n / V;
  float amax = 0.0f;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < vectors;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = t * V, col = i % p.n;  // n % V == 0: the V outputs share a row
    float v[V];
    if (p.acc) {
      const Vec<float, V> x = *reinterpret_cast<const Vec<float, V>*>(p.acc + i);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = x.v[j];
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (p.c) v[j] += p.beta * load_high(p.c, p.c_dtype, i + j);
      if (p.bias) v[j] += load_high(p.bias, p.bias_dtype, col + j);
    }
    if (p.pre_gelu_out) {
      store_high_vec<V>(p.pre_gelu_out, p.pre_gelu_dtype, i, v);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = gelu_tanh(v[j]);
    }
    if (fp8_out) {
      Vec<uint8_t, V> q;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        amax = fmaxf(amax, fabsf(v[j]));
        q.v[j] = to_fp8(v[j] * d_scale, p.d_dtype);
      }
      *reinterpret_cast<Vec<uint8_t, V>*>(static_cast<uint8_t*>(p.d) + i) = q;
    } else {
      store_high_vec<V>(p.d, p.d_dtype, i, v);
    }
  }
  if (p.d_amax == nullptr) return;
  __shared__ float warp_amax[kEpilogueThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  amax = warp_max(amax);
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  if (warp == 0) {
    amax = lane < kEpilogueThreads / 32 ? warp_amax[lane] : 0.0f;
    amax = warp_max(amax);
    if (lane == 0) te::atomic_fmax(p.d_amax, amax);  // fmaxf semantics: NaN never wins
  }
}

__global__ void amax_combine_kernel(float* d_amax, const float* partial) {
  *d_amax = fmaxf(*d_amax, *partial);
}

unsigned int grid_dim(int64_t blocks, int64_t cap) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks, cap)));
}

}  // namespace

void transpose_bytes(const uint8_t* in, uint8_t* out, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 block(kTile, kTileRows);
  const dim3 grid(grid_dim((cols + kTile - 1) / kTile, INT32_MAX),
                  grid_dim((rows + kTile - 1) / kTile, kMaxGridY));
  transpose_bytes_kernel<<<grid, block, 0, stream>>>(in, out, rows, cols);
  TE_GEMM_CHECK_LAUNCH();
}

void epilogue(const EpilogueArgs& args, cudaStream_t stream) {
  if (args.m == 0 || args.n == 0) return;
  constexpr int V = 4;
  auto fits = [](const void* p, te_dtype t) {  // V elements of type t at p: one access
    return p == nullptr || is_aligned(p, V * dtype_bits(t) / 8);
  };
  const bool vector = args.n % V == 0 && fits(args.acc, TE_DTYPE_FLOAT32) &&
                      fits(args.pre_gelu_out, args.pre_gelu_dtype) && fits(args.d, args.d_dtype);
  const int64_t elements = args.m * args.n;
  if (vector) {
    const auto blocks =
        persistent_blocks(reinterpret_cast<const void*>(&epilogue_kernel<V>), kEpilogueThreads,
                          ceil_div(elements / V, kEpilogueThreads));
    epilogue_kernel<V><<<static_cast<unsigned int>(blocks), kEpilogueThreads, 0, stream>>>(args);
  } else {
    const auto blocks = persistent_blocks(reinterpret_cast<const void*>(&epilogue_kernel<1>),
                                          kEpilogueThreads, ceil_div(elements, kEpilogueThreads));
    epilogue_kernel<1><<<static_cast<unsigned int>(blocks), kEpilogueThreads, 0, stream>>>(args);
  }
  TE_GEMM_CHECK_LAUNCH();
}

void amax_combine(float* d_amax, const float* partial, cudaStream_t stream) {
  amax_combine_kernel<<<1, 1, 0, stream>>>(d_amax, partial);
  TE_GEMM_CHECK_LAUNCH();
}

}  // namespace te::gemm::kernels
