// CUDA backend of the NVFP4 family, except the quantize kernel
// (cuda_quantize.cu): global amaxes, dequantize and the 2-D transpose.
// Byte-identical to the CPU backend (cpu.cpp); the arithmetic is formulas.h,
// hadamard.h and philox.h, shared with it.
//
//  - amax without RHT: grid-stride loop over 16-byte vectors, one atomic per
//    block (after a cudaMemsetAsync of the outputs: the kernel overwrites).
//  - amax with RHT: a thread owns 16 rows x one 8-byte column group (4
//    BF16/FP16 or 2 FP32 columns): it reads them once, takes the rowwise amax
//    and the amax of the RHT of each column (warps read 256-byte row runs).
//  - dequantize: a thread takes two blocks at a time (a 16-byte load of
//    codes, two scale bytes), four such loads in flight; values come from a
//    16-entry table in shared memory (conflict-free: at most 16 distinct
//    words), times the block factor, packed by the hardware RNE conversions
//    (a NaN factor takes the software path); 16-byte stores.
//  - transpose_2d: a thread per 16x16 tile: nibbles transposed in registers.
#include "nvfp4/backend.h"
#include "nvfp4/cuda_common.cuh"
#include "nvfp4/hadamard.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "runtime/numerics.h"

namespace te::nvfp4::cuda {
namespace {

// Grid-stride over [0, n).
#define TE_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Adds the block's max into each non-null output (zeroed before the launch).
__device__ __forceinline__ void publish_max(float m, float* out0, float* out1) {
  m = block_max(m);
  if (threadIdx.x != 0) return;
  if (out0) atomic_max_nonnegative(out0, m);
  if (out1) atomic_max_nonnegative(out1, m);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* __restrict__ in, int64_t vectors, float* out0, float* out1) {
  constexpr int N = 16 / sizeof(T);
  float m = 0.0f;
  TE_GRID_STRIDE(i, vectors) {
    const Vec<T, N> v = load_vec<T, N>(in + i * N);
#pragma unroll
    for (int j = 0; j < N; ++j) m = abs_max(m, to_float(v.v[j]));
  }
  publish_max(m, out0, out1);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    rht_amax_kernel(const T* __restrict__ in, int64_t rows, int64_t cols, uint32_t sign_mask,
                    float* amax_rowwise, float* amax_columnwise) {
  constexpr int N = 8 / sizeof(T);  // columns per thread (8-byte loads keep 16 rows in registers)
  const int64_t groups = cols / N;
  float row_max = 0.0f, col_max = 0.0f;
  TE_GRID_STRIDE(unit, rows / kBlock * groups) {
    const int64_t r0 = unit / groups * kBlock, c0 = unit % groups * N;
    Vec<T, N> raw[kBlock];
#pragma unroll
    for (int i = 0; i < kBlock; ++i) raw[i] = load_vec<T, N>(in + (r0 + i) * cols + c0);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      float v[kBlock];
#pragma unroll
      for (int i = 0; i < kBlock; ++i) {
        v[i] = to_float(raw[i].v[j]);
        row_max = abs_max(row_max, v[i]);
      }
      random_hadamard_16(v, sign_mask);
      col_max = fmaxf(col_max, block_abs_max(v));
    }
  }
  row_max = block_max(row_max);
  __syncthreads();  // block_max reuses its shared buffer
  col_max = block_max(col_max);
  if (threadIdx.x == 0) {
    if (amax_rowwise) atomic_max_nonnegative(amax_rowwise, row_max);
    atomic_max_nonnegative(amax_columnwise, col_max);
  }
}

// float -> output element (NaN keeps its sign, as te::float_to_bf16 / _fp16).
using cuda_elem::from_float;

// Two non-NaN floats -> two output elements, rounded to nearest even: the
// hardware conversions give numerics.h's bits for every value but NaN.
__device__ __forceinline__ void from_float2(float lo, float hi, float* out) {
  out[0] = lo;
  out[1] = hi;
}
__device__ __forceinline__ void from_float2(float lo, float hi, __nv_bfloat16* out) {
  *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(lo, hi);
}
__device__ __forceinline__ void from_float2(float lo, float hi, __half* out) {
  *reinterpret_cast<__half2*>(out) = __floats2half2_rn(lo, hi);
}

// One block: 16 codes (element i in bits 4i..4i+3) and its scale byte.
// values[c] = e2m1_to_float(c); a NaN factor (a NaN scale byte) makes every
// element that NaN, as dequantize_element does.
template <class Out>
__device__ __forceinline__ void dequantize_block(uint2 codes, uint8_t scale, float s_dec,
                                                 const float* values, Out* out) {
  const float factor = block_decode_factor(scale, s_dec);
  Vec<Out, kBlock> y;
  if (factor != factor) {
#pragma unroll
    for (int i = 0; i < kBlock; ++i) y.v[i] = from_float<Out>(factor);
  } else {
#pragma unroll
    for (int i = 0; i < kBlock; i += 2) {
      const uint32_t word = i < 8 ? codes.x : codes.y;
      const float lo = values[(word >> (4 * (i % 8))) & 0xF] * factor;
      const float hi = values[(word >> (4 * (i % 8) + 4)) & 0xF] * factor;
      from_float2(lo, hi, y.v + i);
    }
  }
  store_vec(out, y);
}

// A thread takes units of two consecutive blocks (16 code bytes, one 16-byte
// load; a unit may span two rows), kUnroll units in flight. Index is uint32_t
// unless the tensor has 2^32 blocks or more.
template <class Out, class Index>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(DequantizeArgs a, Out* __restrict__ out) {
  constexpr int kUnroll = 4;
  __shared__ float values[16];
  if (threadIdx.x < 16) values[threadIdx.x] = e2m1_to_float(static_cast<uint8_t>(threadIdx.x));
  __syncthreads();
  const Index per_row = static_cast<Index>(a.cols / kBlock);
  const Index blocks = static_cast<Index>(a.rows) * per_row, units = (blocks + 1) / 2;
  const float s_dec = global_decode_scale(global_encode_scale(*a.amax));
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  for (Index base = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; base < units;
       base += kUnroll * stride) {
    uint4 codes[kUnroll];
    uint8_t scale[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index unit = base + u * stride;
      if (unit >= units) break;
      const Index b = 2 * unit, r = b / per_row, c = b - r * per_row;
      const uint8_t* s = a.scale + static_cast<int64_t>(r) * a.scale_cols + c;
      scale[u][0] = __ldg(s);
      if (b + 1 < blocks) {
        codes[u] = __ldg(reinterpret_cast<const uint4*>(a.data) + unit);
        scale[u][1] = __ldg(c + 1 < per_row ? s + 1 : s + a.scale_cols - c);  // next row's first
      } else {  // the last block of an odd count: only 8 bytes exist
        const uint2 half = __ldg(reinterpret_cast<const uint2*>(a.data) + b);
        codes[u] = make_uint4(half.x, half.y, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index unit = base + u * stride;
      if (unit >= units) break;
      const Index b = 2 * unit;
      dequantize_block(make_uint2(codes[u].x, codes[u].y), scale[u][0], s_dec, values,
                       out + static_cast<int64_t>(b) * kBlock);
      if (b + 1 < blocks)
        dequantize_block(make_uint2(codes[u].z, codes[u].w), scale[u][1], s_dec, values,
                         out + static_cast<int64_t>(b + 1) * kBlock);
    }
  }
}

__global__ void __launch_bounds__(kThreads) transpose_2d_kernel(TransposeArgs a) {
  const int64_t M = a.rows, K = a.cols, tiles_k = K / kBlock;
  TE_GRID_STRIDE(t, M / kBlock * tiles_k) {
    const int64_t m0 = t / tiles_k * kBlock, k0 = t % tiles_k * kBlock;
    uint64_t in[kBlock];  // row i of the tile: 16 codes
#pragma unroll
    for (int i = 0; i < kBlock; ++i) {
      const uint2 w = __ldg(reinterpret_cast<const uint2*>(a.rowwise + ((m0 + i) * K + k0) / 2));
      in[i] = (static_cast<uint64_t>(w.y) << 32) | w.x;
    }
    const uint8_t s = a.rowwise_scale[m0 * a.rowwise_scale_cols + k0 / kBlock];
#pragma unroll
    for (int j = 0; j < kBlock; ++j) {
      uint64_t o = 0;
#pragma unroll
      for (int i = 0; i < kBlock; ++i) o |= ((in[i] >> (4 * j)) & 0xFu) << (4 * i);
      *reinterpret_cast<uint2*>(a.columnwise + ((k0 + j) * M + m0) / 2) =
          make_uint2(static_cast<uint32_t>(o), static_cast<uint32_t>(o >> 32));
      a.columnwise_scale[(k0 + j) * a.columnwise_scale_cols + m0 / kBlock] = s;
    }
  }
}

template <class Kernel>
int64_t grid_for(Kernel kernel, int64_t useful) {
  return persistent_blocks(reinterpret_cast<const void*>(kernel), kThreads, useful);
}

}  // namespace

void clear_scale_padding(uint8_t* scale, int64_t rows, int64_t cols, int64_t rows_padded,
                         int64_t cols_padded, te_stream stream) {
  const cudaStream_t s = cuda_stream(stream);
  if (cols_padded > cols && rows > 0)
    TE_CHECK_CUDA(cudaMemset2DAsync(scale + cols, static_cast<size_t>(cols_padded), 0,
                                    static_cast<size_t>(cols_padded - cols),
                                    static_cast<size_t>(rows), s));
  if (rows_padded > rows && cols_padded > 0)
    TE_CHECK_CUDA(cudaMemsetAsync(scale + rows * cols_padded, 0,
                                  static_cast<size_t>((rows_padded - rows) * cols_padded), s));
}

void compute_amax(const void* input, te_dtype dtype, int64_t rows, int64_t cols,
                  float* amax_rowwise, float* amax_columnwise, const Options& options,
                  te_stream stream) {
  const cudaStream_t s = cuda_stream(stream);
  for (float* out : {amax_rowwise, amax_columnwise})
    if (out) TE_CHECK_CUDA(cudaMemsetAsync(out, 0, sizeof(float), s));
  if (rows == 0 || cols == 0) return;
  const bool rht = amax_columnwise != nullptr && options.random_hadamard;
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* in = static_cast<const T*>(input);
    if (rht) {
      const int64_t units = rows / kBlock * (cols / (8 / sizeof(T)));
      rht_amax_kernel<T>
          <<<grid_for(rht_amax_kernel<T>, ceil_div(units, kThreads)), kThreads, 0, s>>>(
              in, rows, cols, options.rht_sign_mask, amax_rowwise, amax_columnwise);
    } else {
      const int64_t vectors = rows * cols / (16 / sizeof(T));
      amax_kernel<T><<<grid_for(amax_kernel<T>, ceil_div(vectors, kThreads)), kThreads, 0, s>>>(
          in, vectors, amax_rowwise, amax_columnwise);
    }
    TE_CHECK_LAUNCH();
  });
}

void dequantize(const DequantizeArgs& a, te_stream stream) {
  const int64_t blocks = a.rows * (a.cols / kBlock);
  if (blocks == 0) return;
  dispatch_float(a.output_dtype, [&](auto tag) {
    using Out = decltype(tag);
    auto run = [&](auto kernel) {
      kernel<<<grid_for(kernel, ceil_div(ceil_div(blocks, 2), kThreads)), kThreads, 0,
               cuda_stream(stream)>>>(a, static_cast<Out*>(a.output));
    };
    // 32-bit indices while every index (and base + 4 * stride) fits.
    if (blocks < (int64_t{1} << 31)) {
      run(dequantize_kernel<Out, uint32_t>);
    } else {
      run(dequantize_kernel<Out, uint64_t>);
    }
    TE_CHECK_LAUNCH();
  });
}

void transpose_2d(const TransposeArgs& a, te_stream stream) {
  clear_scale_padding(a.columnwise_scale, a.cols, a.rows / kBlock, a.columnwise_scale_rows,
                      a.columnwise_scale_cols, stream);
  const int64_t tiles = a.rows / kBlock * (a.cols / kBlock);
  if (tiles == 0) return;
  transpose_2d_kernel<<<grid_for(transpose_2d_kernel, ceil_div(tiles, kThreads)), kThreads, 0,
                        cuda_stream(stream)>>>(a);
  TE_CHECK_LAUNCH();
}

}  // namespace te::nvfp4::cuda
