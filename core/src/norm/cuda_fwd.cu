// CUDA backend of the norm family: LayerNorm / RMSNorm forward (te/norm.h).
//
// norm_fwd_kernel (H <= 16384): the row layout of cuda_common.cuh, 4 chunks
// (32 elements) per thread at most, so a row is read once and written once:
// the memory floor, (sizeof(x) + sizeof(y)) bytes per element. gamma (as the
// FP32 weight g) and beta are staged once per block in shared memory. Per row:
// sum -> mu, sum of squares of (x - mu) -> rsigma (two passes over registers),
// then y. With an FP8 y the quantization and the amax are fused; the block's
// amax goes out with one atomic at the end.
//
// norm_fwd_looped_kernel (longer rows): one block per row, three passes over
// the row in global memory (sum, squares, output), weights read from global.
#include "norm/cuda_common.cuh"
#include "runtime/cuda_check.h"

namespace te::norm::cuda {
namespace {

// Rounds and stores one chunk of y; FP8 outputs also update the thread's amax.
__device__ __forceinline__ void store_y(const FwdArgs& a, int64_t row_start, int64_t first,
                                        bool vec, const float (&y)[kChunk], float scale,
                                        float& amax) {
  const int64_t H = a.cols;
  switch (a.y_dtype) {
    case TE_DTYPE_FLOAT32:
      store_chunk(static_cast<float*>(a.y) + row_start, first, H, vec, y);
      return;
    case TE_DTYPE_BFLOAT16:
      store_chunk(static_cast<__nv_bfloat16*>(a.y) + row_start, first, H, vec, y);
      return;
    case TE_DTYPE_FLOAT16:
      store_chunk(static_cast<__half*>(a.y) + row_start, first, H, vec, y);
      return;
    default: break;
  }
  const bool e5m2 = a.y_dtype == TE_DTYPE_FLOAT8E5M2;
  uint8_t* out = static_cast<uint8_t*>(a.y) + row_start;
  Vec<uint8_t, kChunk> q;
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    if (first + j < H) amax = fmaxf(amax, fabsf(y[j]));
    q.v[j] = fp8_byte(__fmul_rn(y[j], scale), e5m2);
  }
  if (vec) {
    if (first < H) store_vec(out + first, q);
    return;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j)
    if (first + j < H) out[first + j] = q.v[j];
}

// The FP32 y of one element: ((x - mu) * rsigma) * g (+ beta), each step rounded.
template <bool kLayerNorm>
__device__ __forceinline__ float y_value(float x, float mu, float rsigma, float g, float b) {
  const float scaled = __fmul_rn(__fmul_rn(kLayerNorm ? __fsub_rn(x, mu) : x, rsigma), g);
  return kLayerNorm ? __fadd_rn(scaled, b) : scaled;
}

// After the rows: the block's amax (one atomic) and scale_inv (block 0).
__device__ __forceinline__ void finish_fp8(const FwdArgs& a, float amax) {
  if (!is_fp8_code(a.y_dtype)) return;  // uniform over the grid
  if (a.y_amax != nullptr) {
    amax = block_max(amax);
    if (threadIdx.x == 0) atomic_fmax(a.y_amax, amax);
  }
  if (a.y_scale_inv != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    *a.y_scale_inv = __fdiv_rn(1.0f, *a.y_scale);
}

template <class Tx, class Shape, bool kLayerNorm>
__global__ void __launch_bounds__(Shape::kBlockThreads)
    norm_fwd_kernel(const FwdArgs a, const bool vec) {
  constexpr int kRows = Shape::kRowsPerBlock;
  extern __shared__ __align__(16) float weights[];  // g [H], then beta [H] (LayerNorm)
  __shared__ float exchange[2][kRows][Shape::kWarps][1];
  const int64_t H = a.cols;
  const float n = static_cast<float>(H);
  float* g_s = weights;
  float* b_s = weights + H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    g_s[i] = weight_at(a.gamma, a.w_dtype, i, a.zero_centered_gamma);
    if (kLayerNorm) b_s[i] = load_any(a.beta, a.w_dtype, i);
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / Shape::kWarps, warp_in_row = warp % Shape::kWarps;
  const int t = warp_in_row * 32 + lane;  // thread index within the row
  const bool fp8 = is_fp8_code(a.y_dtype);
  const float scale = fp8 ? *a.y_scale : 1.0f;
  RowReducer<Shape, 1> reducer{exchange, 0};
  float amax = 0.0f;
  const Tx* x = static_cast<const Tx*>(a.x);

  // Uniform trip count over the block: every thread reaches every barrier.
  for (int64_t base = int64_t{blockIdx.x} * kRows; base < a.rows;
       base += int64_t{gridDim.x} * kRows) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    const int64_t row_start = active ? row * H : 0;
    float v[Shape::kChunks][kChunk];
#pragma unroll
    for (int k = 0; k < Shape::kChunks; ++k)
      load_chunk(x + row_start, (int64_t{k} * Shape::kThreads + t) * kChunk, active ? H : 0, vec,
                 v[k]);

    float mu = 0.0f;
    if constexpr (kLayerNorm) {
      float s[1] = {0.0f};
#pragma unroll
      for (int k = 0; k < Shape::kChunks; ++k)
#pragma unroll
        for (int j = 0; j < kChunk; ++j) s[0] = __fadd_rn(s[0], v[k][j]);  // 0 past the row
      reducer.sum(s, group, warp_in_row, lane);
      mu = __fdiv_rn(s[0], n);
    }
    float ss[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < Shape::kChunks; ++k) {
      const int64_t first = (int64_t{k} * Shape::kThreads + t) * kChunk;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const float d = kLayerNorm ? __fsub_rn(v[k][j], mu) : v[k][j];
        if (first + j < H) ss[0] = __fadd_rn(ss[0], __fmul_rn(d, d));
      }
    }
    reducer.sum(ss, group, warp_in_row, lane);
    const float rsigma = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss[0], n), a.eps)));
    if (!active) continue;  // no barrier below
    if (t == 0) {
      if (a.mu != nullptr) a.mu[row] = mu;
      if (a.rsigma != nullptr) a.rsigma[row] = rsigma;
    }
#pragma unroll
    for (int k = 0; k < Shape::kChunks; ++k) {
      const int64_t first = (int64_t{k} * Shape::kThreads + t) * kChunk;
      if (first >= H) continue;
      float g[kChunk], b[kChunk], y[kChunk];
      load_smem_chunk(g_s, first, H, vec, g);
      if (kLayerNorm) load_smem_chunk(b_s, first, H, vec, b);
#pragma unroll
      for (int j = 0; j < kChunk; ++j)
        y[j] = y_value<kLayerNorm>(v[k][j], mu, rsigma, g[j], kLayerNorm ? b[j] : 0.0f);
      store_y(a, row_start, first, vec, y, scale, amax);
    }
  }
  finish_fp8(a, amax);
}

template <class Tx, bool kLayerNorm>
__global__ void __launch_bounds__(kLoopThreads)
    norm_fwd_looped_kernel(const FwdArgs a) {
  __shared__ float exchange[32];
  const int64_t H = a.cols;
  const float n = static_cast<float>(H);
  const float scale = is_fp8_code(a.y_dtype) ? *a.y_scale : 1.0f;
  const Tx* x = static_cast<const Tx*>(a.x);
  float amax = 0.0f;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const Tx* xr = x + row * H;
    float mu = 0.0f;
    if constexpr (kLayerNorm) {
      float s = 0.0f;
      for (int64_t i = threadIdx.x; i < H; i += kLoopThreads) s = __fadd_rn(s, to_f32(xr[i]));
      mu = __fdiv_rn(block_sum(s, exchange), n);
    }
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < H; i += kLoopThreads) {
      const float d = kLayerNorm ? __fsub_rn(to_f32(xr[i]), mu) : to_f32(xr[i]);
      ss = __fadd_rn(ss, __fmul_rn(d, d));
    }
    const float rsigma =
        __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(block_sum(ss, exchange), n), a.eps)));
    if (threadIdx.x == 0) {
      if (a.mu != nullptr) a.mu[row] = mu;
      if (a.rsigma != nullptr) a.rsigma[row] = rsigma;
    }
    for (int64_t i0 = int64_t{threadIdx.x} * kChunk; i0 < H; i0 += int64_t{kLoopThreads} * kChunk) {
      float y[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const int64_t i = i0 + j < H ? i0 + j : H - 1;  // past the row: computed, not stored
        const float g = weight_at(a.gamma, a.w_dtype, i, a.zero_centered_gamma);
        const float b = kLayerNorm ? load_any(a.beta, a.w_dtype, i) : 0.0f;
        y[j] = y_value<kLayerNorm>(to_f32(xr[i]), mu, rsigma, g, b);
      }
      store_y(a, row * H, i0, false, y, scale, amax);
    }
  }
  finish_fp8(a, amax);
}

template <class Tx, bool kLayerNorm>
void launch(const FwdArgs& a, cudaStream_t stream) {
  const int64_t H = a.cols;
  const int y_bytes = is_fp8_code(a.y_dtype) ? 1 : (a.y_dtype == TE_DTYPE_FLOAT32 ? 4 : 2);
  // 16-byte accesses: whole chunks in every row, aligned rows (FP8 y: 8 bytes).
  const bool vec = H % kChunk == 0 && is_aligned(a.x, 16) &&
                   is_aligned(a.y, y_bytes * kChunk > 16 ? 16 : y_bytes * kChunk);
  const bool fits = with_row_shape<4>(H, [&](auto shape) {
    using Shape = decltype(shape);
    auto kernel = norm_fwd_kernel<Tx, Shape, kLayerNorm>;
    const size_t smem = sizeof(float) * H * (kLayerNorm ? 2 : 1);
    const int64_t grid = resident_grid(reinterpret_cast<const void*>(kernel), Shape::kBlockThreads,
                                       smem, ceil_div(a.rows, Shape::kRowsPerBlock));
    kernel<<<grid, Shape::kBlockThreads, smem, stream>>>(a, vec);
  });
  if (!fits) {
    auto kernel = norm_fwd_looped_kernel<Tx, kLayerNorm>;
    const int64_t grid =
        resident_grid(reinterpret_cast<const void*>(kernel), kLoopThreads, 0, a.rows);
    kernel<<<grid, kLoopThreads, 0, stream>>>(a);
  }
  TE_CHECK_LAUNCH();
}

}  // namespace

void forward(const FwdArgs& a, te_stream stream) {
  dispatch_x(a.x_dtype, [&](auto x_tag) {
    using Tx = decltype(x_tag);
    if (a.layernorm) {
      launch<Tx, true>(a, cuda_stream(stream));
    } else {
      launch<Tx, false>(a, cuda_stream(stream));
    }
  });
}

}  // namespace te::norm::cuda
