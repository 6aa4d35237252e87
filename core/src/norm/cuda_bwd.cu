// CUDA backend of the norm family: LayerNorm / RMSNorm backward (te/norm.h).
//
// Two kernels, no atomics, deterministic:
//  1. norm_bwd_kernel (H <= 8192): the row layout of cuda_common.cuh with 2
//     chunks (16 elements) per thread at most, since x, dz and the two column
//     accumulators all stay in registers. One pass: reads dz, x, mu, rsigma,
//     writes dx; gamma (as the FP32 weight g) is staged in shared memory once
//     per block. Each thread accumulates dgamma = sum(dz * xhat) and
//     dbeta = sum(dz) for its columns over all rows the block visits; at the
//     end the block adds its row groups in group order and writes one FP32
//     partial row per block into the workspace: [blocks][H] for dgamma, then
//     [blocks][H] for dbeta.
//     norm_bwd_looped_kernel (longer rows): one block per row, two passes over
//     the row in global memory; the block's partial row is accumulated in the
//     workspace itself (each column by one fixed thread).
//  2. reduce_columns_kernel: out[col] = sum over the blocks of partial[b][col],
//     8 strided runs per column added in a fixed order, rounded to gamma's type.
#include <type_traits>

#include "norm/cuda_common.cuh"
#include "runtime/cuda_check.h"

namespace te::norm::cuda {
namespace {

constexpr int kReduceRows = 8;  // reduce_columns_kernel: a block is 32 columns x 8 runs

// dx of one element: rsigma * ((dy - m1) - xhat * m2), each step rounded.
__device__ __forceinline__ float dx_value(float dy, float xhat, float m1, float m2, float rsigma) {
  return __fmul_rn(rsigma, __fsub_rn(__fsub_rn(dy, m1), __fmul_rn(xhat, m2)));
}

template <class Tx, class Shape, bool kLayerNorm>
__global__ void __launch_bounds__(Shape::kBlockThreads)
    norm_bwd_kernel(const BwdArgs a, const bool vec, float* __restrict__ partials) {
  constexpr int kRows = Shape::kRowsPerBlock;
  constexpr int kChunks = Shape::kChunks;
  // g [H]; then, with several row groups, [kRows][H] to add their column sums.
  extern __shared__ __align__(16) float smem[];
  __shared__ float exchange[2][kRows][Shape::kWarps][2];
  const int64_t H = a.cols;
  const float n = static_cast<float>(H);
  float* g_s = smem;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
    g_s[i] = weight_at(a.gamma, a.w_dtype, i, a.zero_centered_gamma);
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / Shape::kWarps, warp_in_row = warp % Shape::kWarps;
  const int t = warp_in_row * 32 + lane;
  RowReducer<Shape, 2> reducer{exchange, 0};
  float dgamma[kChunks][kChunk] = {}, dbeta[kChunks][kChunk] = {};
  const Tx* x = static_cast<const Tx*>(a.x);
  const Tx* dz_in = static_cast<const Tx*>(a.dz);

  for (int64_t base = int64_t{blockIdx.x} * kRows; base < a.rows;
       base += int64_t{gridDim.x} * kRows) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    const int64_t row_start = active ? row * H : 0;
    const int64_t h = active ? H : 0;  // inactive row groups load zeros
    float xhat[kChunks][kChunk], dz[kChunks][kChunk];
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t first = (int64_t{k} * Shape::kThreads + t) * kChunk;
      load_chunk(x + row_start, first, h, vec, xhat[k]);
      load_chunk(dz_in + row_start, first, h, vec, dz[k]);
    }
    const float mu = active && kLayerNorm ? a.mu[row] : 0.0f;
    const float rsigma = active ? a.rsigma[row] : 0.0f;
    float s[2] = {0.0f, 0.0f};  // sum(dy), sum(dy * xhat)
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t first = (int64_t{k} * Shape::kThreads + t) * kChunk;
      float g[kChunk];
      load_smem_chunk(g_s, first, H, vec, g);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        xhat[k][j] = __fmul_rn(kLayerNorm ? __fsub_rn(xhat[k][j], mu) : xhat[k][j], rsigma);
        const float dy = __fmul_rn(dz[k][j], g[j]);
        if (first + j < H) {
          s[0] = __fadd_rn(s[0], dy);
          s[1] = __fadd_rn(s[1], __fmul_rn(dy, xhat[k][j]));
        }
      }
    }
    reducer.sum(s, group, warp_in_row, lane);
    if (!active) continue;  // no barrier below
    const float m1 = kLayerNorm ? __fdiv_rn(s[0], n) : 0.0f;
    const float m2 = __fdiv_rn(s[1], n);
    Tx* dx_row = static_cast<Tx*>(a.dx) + row_start;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t first = (int64_t{k} * Shape::kThreads + t) * kChunk;
      if (first >= H) continue;
      float g[kChunk], dx[kChunk];
      load_smem_chunk(g_s, first, H, vec, g);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        dx[j] = dx_value(__fmul_rn(dz[k][j], g[j]), xhat[k][j], m1, m2, rsigma);
        if (first + j < H) {
          dgamma[k][j] = __fadd_rn(dgamma[k][j], __fmul_rn(dz[k][j], xhat[k][j]));
          dbeta[k][j] = __fadd_rn(dbeta[k][j], dz[k][j]);
        }
      }
      store_chunk(dx_row, first, H, vec, dx);
    }
  }

  // The block's column sums: row groups added in group order, one row each.
  auto write_block_sums = [&](const float(&acc)[kChunks][kChunk], float* out) {
    float* dst = kRows == 1 ? out : smem + H + int64_t{group} * H;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t first = (int64_t{k} * Shape::kThreads + t) * kChunk;
#pragma unroll
      for (int j = 0; j < kChunk; ++j)
        if (first + j < H) dst[first + j] = acc[k][j];
    }
    if constexpr (kRows > 1) {
      __syncthreads();
      for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
        float total = smem[H + i];
        for (int r = 1; r < kRows; ++r) total = __fadd_rn(total, smem[H + r * H + i]);
        out[i] = total;
      }
      __syncthreads();
    }
  };
  write_block_sums(dgamma, partials + int64_t{blockIdx.x} * H);
  if (kLayerNorm) write_block_sums(dbeta, partials + (int64_t{gridDim.x} + blockIdx.x) * H);
}

template <class Tx, bool kLayerNorm>
__global__ void __launch_bounds__(kLoopThreads)
    norm_bwd_looped_kernel(const BwdArgs a, float* __restrict__ partials) {
  __shared__ float exchange[32];
  const int64_t H = a.cols;
  const float n = static_cast<float>(H);
  float* dgamma = partials + int64_t{blockIdx.x} * H;
  float* dbeta = partials + (int64_t{gridDim.x} + blockIdx.x) * H;
  // Column i belongs to thread i % kLoopThreads for the whole kernel.
  for (int64_t i = threadIdx.x; i < H; i += kLoopThreads) {
    dgamma[i] = 0.0f;
    if (kLayerNorm) dbeta[i] = 0.0f;
  }
  const Tx* x = static_cast<const Tx*>(a.x);
  const Tx* dz = static_cast<const Tx*>(a.dz);
  Tx* dx = static_cast<Tx*>(a.dx);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t start = row * H;
    const float mu = kLayerNorm ? a.mu[row] : 0.0f;
    const float rsigma = a.rsigma[row];
    auto xhat_at = [&](int64_t i) {
      const float xi = to_f32(x[start + i]);
      return __fmul_rn(kLayerNorm ? __fsub_rn(xi, mu) : xi, rsigma);
    };
    auto dy_at = [&](int64_t i) {
      return __fmul_rn(to_f32(dz[start + i]), weight_at(a.gamma, a.w_dtype, i, a.zero_centered_gamma));
    };
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t i = threadIdx.x; i < H; i += kLoopThreads) {
      const float dy = dy_at(i);
      s1 = __fadd_rn(s1, dy);
      s2 = __fadd_rn(s2, __fmul_rn(dy, xhat_at(i)));
    }
    const float m1 = kLayerNorm ? __fdiv_rn(block_sum(s1, exchange), n) : 0.0f;
    const float m2 = __fdiv_rn(block_sum(s2, exchange), n);
    for (int64_t i = threadIdx.x; i < H; i += kLoopThreads) {
      const float xh = xhat_at(i), dzi = to_f32(dz[start + i]);
      dx[start + i] = from_f32<Tx>(dx_value(dy_at(i), xh, m1, m2, rsigma));
      dgamma[i] = __fadd_rn(dgamma[i], __fmul_rn(dzi, xh));
      if (kLayerNorm) dbeta[i] = __fadd_rn(dbeta[i], dzi);
    }
  }
}

__device__ __forceinline__ void store_any(void* p, te_dtype t, int64_t i, float v) {
  if (t == TE_DTYPE_BFLOAT16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else if (t == TE_DTYPE_FLOAT16) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// blockIdx.y = 0: dgamma from partials[0 .. blocks); 1: dbeta from the next rows.
__global__ void __launch_bounds__(32 * kReduceRows)
    reduce_columns_kernel(const float* __restrict__ partials, int64_t blocks, int64_t H,
                          void* dgamma, void* dbeta, te_dtype w_dtype) {
  __shared__ float runs[kReduceRows][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t col = int64_t{blockIdx.x} * 32 + tx;
  const float* part = partials + int64_t{blockIdx.y} * blocks * H;
  float s = 0.0f;
  if (col < H)
    for (int64_t b = ty; b < blocks; b += kReduceRows) s = __fadd_rn(s, part[b * H + col]);
  runs[ty][tx] = s;
  __syncthreads();
  if (ty != 0 || col >= H) return;
  float total = runs[0][tx];
#pragma unroll
  for (int r = 1; r < kReduceRows; ++r) total = __fadd_rn(total, runs[r][tx]);
  store_any(blockIdx.y == 0 ? dgamma : dbeta, w_dtype, col, total);
}

// The backward kernel for (x type, H) with its block size, dynamic shared
// memory and grid; used by both the workspace query and the launch, which
// therefore agree on the number of partial rows.
struct BwdLaunch {
  const void* kernel;
  int threads;
  size_t smem;
  int64_t grid;
  bool looped;
};

template <class Tx, bool kLayerNorm>
BwdLaunch plan(int64_t rows, int64_t H) {
  BwdLaunch p{};
  const bool fits = with_row_shape<2>(H, [&](auto shape) {
    using Shape = decltype(shape);
    p.kernel = reinterpret_cast<const void*>(norm_bwd_kernel<Tx, Shape, kLayerNorm>);
    p.threads = Shape::kBlockThreads;
    p.smem = sizeof(float) * H * (Shape::kRowsPerBlock > 1 ? 1 + Shape::kRowsPerBlock : 1);
    p.grid = resident_grid(p.kernel, p.threads, p.smem, ceil_div(rows, Shape::kRowsPerBlock));
  });
  if (!fits) {
    p.kernel = reinterpret_cast<const void*>(norm_bwd_looped_kernel<Tx, kLayerNorm>);
    p.threads = kLoopThreads;
    p.grid = resident_grid(p.kernel, p.threads, 0, rows);
    p.looped = true;
  }
  return p;
}

template <class F>
void dispatch(te_dtype x_dtype, bool layernorm, F&& f) {
  dispatch_x(x_dtype, [&](auto x_tag) {
    if (layernorm) {
      f(x_tag, std::true_type{});
    } else {
      f(x_tag, std::false_type{});
    }
  });
}

}  // namespace

size_t backward_workspace_bytes(te_dtype x_dtype, int64_t rows, int64_t cols, bool layernorm) {
  size_t bytes = 0;
  dispatch(x_dtype, layernorm, [&](auto x_tag, auto ln) {
    const BwdLaunch p = plan<decltype(x_tag), decltype(ln)::value>(rows, cols);
    bytes = sizeof(float) * static_cast<size_t>(p.grid * cols) * (layernorm ? 2 : 1);
  });
  return bytes;
}

void backward(const BwdArgs& a, te_stream stream_handle) {
  const cudaStream_t stream = cuda_stream(stream_handle);
  float* partials = static_cast<float*>(a.workspace);
  int64_t blocks = 0;
  dispatch(a.x_dtype, a.layernorm, [&](auto x_tag, auto ln) {
    using Tx = decltype(x_tag);
    constexpr bool kLayerNorm = decltype(ln)::value;
    const BwdLaunch p = plan<Tx, kLayerNorm>(a.rows, a.cols);
    blocks = p.grid;
    if (p.looped) {
      norm_bwd_looped_kernel<Tx, kLayerNorm><<<p.grid, p.threads, 0, stream>>>(a, partials);
    } else {
      const bool vec = a.cols % kChunk == 0 && is_aligned(a.x, 16) && is_aligned(a.dz, 16) &&
                       is_aligned(a.dx, 16);
      void* args[] = {const_cast<BwdArgs*>(&a), const_cast<bool*>(&vec), &partials};
      TE_CHECK_CUDA(cudaLaunchKernel(p.kernel, dim3(static_cast<unsigned>(p.grid)),
                                     dim3(p.threads), args, p.smem, stream));
    }
    TE_CHECK_LAUNCH();
  });
  const dim3 grid(static_cast<unsigned>(ceil_div(a.cols, 32)), a.layernorm ? 2 : 1);
  reduce_columns_kernel<<<grid, 32 * kReduceRows, 0, stream>>>(partials, blocks, a.cols, a.dgamma,
                                                               a.dbeta, a.w_dtype);
  TE_CHECK_LAUNCH();
}

}  // namespace te::norm::cuda
