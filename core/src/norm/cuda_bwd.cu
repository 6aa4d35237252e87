// CUDA backend of the norm family: LayerNorm / RMSNorm backward (te/norm.h).
//
// Two kernels, no atomics, deterministic:
//  1. norm_bwd_kernel (H <= 8192): the row layout of cuda_common.cuh with 2
//     chunks (16 elements) per thread at most, since x, dz (packed in x's
//     type, widened again in each of the two passes) and the two FP32 column
//     accumulators all stay in registers. One pass over memory: reads dz, x,
//     mu, rsigma, writes dx; gamma (as the FP32 weight g) is staged in shared
//     memory once per block, in the bank-conflict-free per-chunk layout.
//     BF16 H = 4096 (8 warps per row): 80 registers for LayerNorm, 60 for
//     RMSNorm (100 and 79 with the row widened to FP32), so 3 and 4 rows per
//     SM are in flight instead of 2. The element-wise path (H % 8 != 0 or a
//     buffer not 16-byte aligned) is a separate instantiation with the same
//     order of operations. Each thread accumulates dgamma = sum(dz * xhat) and
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

// The 8 elements of a chunk of x (or dz), packed: kV 16-byte vectors.
template <class Tx>
struct Packed {
  static constexpr int kE = 16 / static_cast<int>(sizeof(Tx));  // elements per vector
  static constexpr int kV = kChunk / kE;                        // 1, or 2 for FP32
  uint32_t w[kV][4];

  __device__ __forceinline__ void load(const Tx* p, int left, bool vec) {
#pragma unroll
    for (int v = 0; v < kV; ++v) load_packed(p + v * kE, left - v * kE, vec, w[v]);
  }
  __device__ __forceinline__ void widen(float (&f)[kChunk]) const {
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      float part[kE];
      unpack(w[v], part, Tx{});
#pragma unroll
      for (int j = 0; j < kE; ++j) f[v * kE + j] = part[j];
    }
  }
};

// kVec: 16-byte accesses to x, dz and dx (see backward()); a separate
// instantiation, so that the vector kernel's register count is not that of
// the element-wise path. Both add in the same order: the same bytes.
template <class Tx, class Shape, bool kLayerNorm, bool kVec>
__global__ void __launch_bounds__(Shape::kBlockThreads)
    norm_bwd_kernel(const BwdArgs a, float* __restrict__ partials) {
  constexpr bool vec = kVec;
  constexpr int kRows = Shape::kRowsPerBlock;
  constexpr int kChunks = Shape::kChunks;
  constexpr int kStride = Shape::kThreads * kChunk;  // elements between a thread's chunks
  // g [chunks * 8] (per-chunk layout); then, with several row groups,
  // [kRows][H] to add their column sums.
  extern __shared__ __align__(16) float smem[];
  __shared__ float exchange[2][kRows][Shape::kWarps][2];
  const int H = static_cast<int>(a.cols);  // <= 8192: int indices within a row
  const int chunks = (H + kChunk - 1) / kChunk;
  const int part = 4 * chunks;
  const float n = static_cast<float>(H);
  float* g_s = smem;
  float* sums_s = smem + chunks * kChunk;
  stage_weights<kChunk>(
      g_s, H, [&](int i) { return weight_at(a.gamma, a.w_dtype, i, a.zero_centered_gamma); });
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / Shape::kWarps, warp_in_row = warp % Shape::kWarps;
  const int t = warp_in_row * 32 + lane;
  const int rem = H - t * kChunk;  // row elements from the thread's first chunk on
  const float* g_t = g_s + 4 * t;  // the weights of the thread's first chunk
  RowReducer<Shape, 2> reducer{exchange, 0};
  float dgamma[kChunks][kChunk] = {}, dbeta[kChunks][kChunk] = {};
  const Tx* x = static_cast<const Tx*>(a.x);
  const Tx* dz_in = static_cast<const Tx*>(a.dz);

  for (int64_t base = int64_t{blockIdx.x} * kRows; base < a.rows;
       base += int64_t{gridDim.x} * kRows) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    const int64_t offset = (active ? row * a.cols : 0) + t * kChunk;
    // x and dz stay packed; inactive row groups load nothing (zeros).
    Packed<Tx> xp[kChunks], dzp[kChunks];
    int r = opaque(active ? rem : 0);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      xp[k].load(x + offset + k * kStride, r - k * kStride, vec);
      dzp[k].load(dz_in + offset + k * kStride, r - k * kStride, vec);
    }
    const float mu = active && kLayerNorm ? a.mu[row] : 0.0f;
    const float rsigma = active ? a.rsigma[row] : 0.0f;
    float s[2] = {0.0f, 0.0f};  // sum(dy), sum(dy * xhat), each thread's elements in order
    r = opaque(rem);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int left = r - k * kStride;
      float xv[kChunk], dzv[kChunk], g[kChunk];
      xp[k].widen(xv);
      dzp[k].widen(dzv);
      load_weights(g_t + 4 * k * Shape::kThreads, part, g);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const float xhat = __fmul_rn(kLayerNorm ? __fsub_rn(xv[j], mu) : xv[j], rsigma);
        const float dy = __fmul_rn(dzv[j], g[j]);
        if (j < left) {
          s[0] = __fadd_rn(s[0], dy);
          s[1] = __fadd_rn(s[1], __fmul_rn(dy, xhat));
        }
      }
    }
    reducer.sum(s, group, warp_in_row, lane);
    if (!active) continue;  // no barrier below
    const float m1 = kLayerNorm ? __fdiv_rn(s[0], n) : 0.0f;
    const float m2 = __fdiv_rn(s[1], n);
    Tx* dx_t = static_cast<Tx*>(a.dx) + offset;
    r = opaque(rem);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int left = r - k * kStride;
      if (left <= 0) break;  // the later chunks are past the row too
      float xv[kChunk], dzv[kChunk], g[kChunk], dx[kChunk];
      xp[k].widen(xv);
      dzp[k].widen(dzv);
      load_weights(g_t + 4 * k * Shape::kThreads, part, g);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const float xhat = __fmul_rn(kLayerNorm ? __fsub_rn(xv[j], mu) : xv[j], rsigma);
        dx[j] = dx_value(__fmul_rn(dzv[j], g[j]), xhat, m1, m2, rsigma);
        if (j < left) {
          dgamma[k][j] = __fadd_rn(dgamma[k][j], __fmul_rn(dzv[j], xhat));
          dbeta[k][j] = __fadd_rn(dbeta[k][j], dzv[j]);
        }
      }
      store_chunk(dx_t + k * kStride, left, vec, dx);
    }
  }

  // The block's column sums: row groups added in group order, one row each.
  auto write_block_sums = [&](const float (&acc)[kChunks][kChunk], float* out) {
    float* dst = kRows == 1 ? out : sums_s + group * H;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int first = k * kStride + t * kChunk;
#pragma unroll
      for (int j = 0; j < kChunk; ++j)
        if (first + j < H) dst[first + j] = acc[k][j];
    }
    if constexpr (kRows > 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float total = sums_s[i];
        for (int r = 1; r < kRows; ++r) total = __fadd_rn(total, sums_s[r * H + i]);
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
      return __fmul_rn(to_f32(dz[start + i]),
                       weight_at(a.gamma, a.w_dtype, i, a.zero_centered_gamma));
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
      dx[start + i] = from_float<Tx>(dx_value(dy_at(i), xh, m1, m2, rsigma));
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

// The grid comes from the vector kernel's occupancy whatever the pointers'
// alignment (the workspace query does not see them); the element-wise kernel,
// if chosen, runs the same grid.
template <class Tx, bool kLayerNorm>
BwdLaunch plan(int64_t rows, int64_t H, bool vec) {
  BwdLaunch p{};
  const bool fits = with_row_shape(H, [&](auto shape) {
    using Shape = decltype(shape);
    const void* vector_kernel =
        reinterpret_cast<const void*>(norm_bwd_kernel<Tx, Shape, kLayerNorm, true>);
    p.kernel = vec ? vector_kernel
                   : reinterpret_cast<const void*>(norm_bwd_kernel<Tx, Shape, kLayerNorm, false>);
    p.threads = Shape::kBlockThreads;
    const int64_t rows_s = Shape::kRowsPerBlock > 1 ? Shape::kRowsPerBlock * H : 0;
    p.smem = sizeof(float) * (ceil_div(H, kChunk) * kChunk + rows_s);
    // At most 32 KiB (H = 8192, one row per block): no opt-in beyond 48 KiB needed
    // for either kernel.
    p.grid = resident_grid(vector_kernel, p.threads, p.smem, ceil_div(rows, Shape::kRowsPerBlock));
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
    const BwdLaunch p = plan<decltype(x_tag), decltype(ln)::value>(rows, cols, true);
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
    // 16-byte accesses need whole chunks in every row (then every row starts as
    // aligned as its buffer) and x, dz and dx 16-byte aligned; gamma is staged
    // and the column sums are written element-wise, so their alignment is free.
    const bool vec =
        a.cols % kChunk == 0 && is_aligned(a.x, 16) && is_aligned(a.dz, 16) && is_aligned(a.dx, 16);
    const BwdLaunch p = plan<Tx, kLayerNorm>(a.rows, a.cols, vec);
    blocks = p.grid;
    if (p.looped) {
      norm_bwd_looped_kernel<Tx, kLayerNorm><<<p.grid, p.threads, 0, stream>>>(a, partials);
    } else {
      void* args[] = {const_cast<BwdArgs*>(&a), &partials};
      TE_CHECK_CUDA(cudaLaunchKernel(p.kernel, dim3(static_cast<unsigned>(p.grid)), dim3(p.threads),
                                     args, p.smem, stream));
    }
    TE_CHECK_LAUNCH();
  });
  const dim3 grid(static_cast<unsigned>(ceil_div(a.cols, 32)), a.layernorm ? 2 : 1);
  reduce_columns_kernel<<<grid, 32 * kReduceRows, 0, stream>>>(partials, blocks, a.cols, a.dgamma,
                                                               a.dbeta, a.w_dtype);
  TE_CHECK_LAUNCH();
}

}  // namespace te::norm::cuda
