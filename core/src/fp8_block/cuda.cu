// CUDA backend of the FP8-block family (te/fp8_block.h), byte-identical to
// cpu.cpp. The FP8 cast is cuda_elem::fp8x2 (hardware RNE + saturation, NaN ->
// 0x7F); scales come from te::scale_from_amax (IEEE division on the device).
//
// Quantize: one CTA of 512 threads per 128x128 tile of the [M, K] input, one
// pass over it, both outputs from the same registers.
//  - Thread (g, cg) with g = 2*warp + lane/16 and cg = lane%16 holds rows
//    4g..4g+3 and columns 8cg..8cg+7 of the tile: four 16-byte loads for
//    BF16/FP16, eight for FP32 (a half-warp reads 256 contiguous bytes).
//    Elements past the tensor's edge load as 0: they never raise an amax and
//    are never stored, so a cut block uses only its valid elements.
//  - 1-D rowwise: the 16 lanes of a half-warp share each row; a shuffle max
//    gives the row's amax, the row is quantized and stored (8 bytes a lane,
//    128 contiguous bytes a half-warp).
//  - 1-D columnwise: column maxima over a thread's 4 rows, then over the
//    other half-warp's 4 (one shuffle), go to shared memory; 128 threads
//    finish the column maxima and scales; every thread then quantizes its 32
//    elements with its 8 column scales.
//  - 2-D: a block-wide max gives the tile's one scale; the rowwise bytes are
//    also the columnwise bytes (transposed for GEMM-ready).
//  - GEMM-ready columnwise output is [K, M]: each thread transposes its 4x8
//    bytes in registers (__byte_perm) into 8 words (4 rows of one column),
//    writes them to a swizzled [128 k][128 m] shared tile, and the tile leaves
//    in 16-byte stores, 8 lanes per 128-byte row segment. Compact columnwise
//    output has the input's layout and is stored like the rowwise output.
// 512 threads with 32 elements each (not 256 with 64) keep the registers per
// thread low, so more warps are resident to overlap the conversions of one
// tile with the loads of another.
// Traffic: sizeof(x) + 2 bytes per element for both outputs (+ 1/128 scales).
// Shared memory 24.6 KB; no device allocation, no host synchronization.
//
// Dequantize: a grid-stride loop over rows; each row's threads move 8 codes
// (8-byte loads) to 8 outputs (16- or 32-byte stores), one scale per element.
#include <algorithm>

#include "fp8_block/backend.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"
#include "runtime/element.h"
#include "transpose/backend.h"
#include "transpose/tile.cuh"

namespace te::fp8_block::cuda {
namespace {

using cuda_elem::dequant;
using cuda_elem::dispatch_fp8;
using cuda_elem::dispatch_input;
using cuda_elem::fp8x2;
using cuda_elem::fp8x2_to_float2;
using cuda_elem::from_float;
using cuda_elem::to_float;

constexpr int kThreads = 512;
constexpr int kRows = 4;                  // rows per thread
constexpr int kSpan = 8;                  // columns per thread
constexpr int kColGroups = kBlock / kSpan;  // 16: the lanes of a half-warp
constexpr int kPairs = kBlock / (2 * kRows);  // 16 pairs of row groups (one per warp)

struct QuantizeParams {
  int64_t rows, cols, tiles_k;
  uint8_t* rowwise;
  float* row_scales;
  ScaleMap row_map;
  uint8_t* columnwise;
  float* col_scales;
  ScaleMap col_map;
  bool gemm_ready;       // columnwise data transposed, scales padded
  bool vector_loads;     // input 16-byte aligned (rows are: K % 16 == 0)
  bool vector_rows;      // rowwise and compact columnwise outputs 8-byte aligned
  int column_store_bytes;  // widest store the transposed rows allow (16 .. 1)
  float fp8_max, epsilon, value_for_inf;
  bool force_pow2;

  __device__ float scale(float amax) const {
    return te::scale_from_amax(amax, fp8_max, force_pow2, epsilon, value_for_inf);
  }
};

// Rows row0..row0+3, columns col0..col0+7 of the input (0 outside it).
template <class In>
__device__ __forceinline__ void load_block(const In* __restrict__ in, const QuantizeParams& p,
                                           int64_t row0, int64_t col0, Vec<In, kSpan> (&v)[kRows]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t row = row0 + i;
    if (row < p.rows && col0 < p.cols) {  // K % 16 == 0: the 8 columns are all in or all out
      if (p.vector_loads) {
        v[i] = load_vec<In, kSpan>(in + row * p.cols + col0);
      } else {
#pragma unroll
        for (int j = 0; j < kSpan; ++j) v[i].v[j] = in[row * p.cols + col0 + j];
      }
    } else {
#pragma unroll
      for (int w = 0; w < static_cast<int>(sizeof(v[i]) / 4); ++w)
        reinterpret_cast<uint32_t*>(&v[i])[w] = 0u;
    }
  }
}

// 8 elements times their scales -> 8 FP8 bytes (element j in byte j).
template <bool kE5M2, class In>
__device__ __forceinline__ uint2 quantize8(const Vec<In, kSpan>& v, const float (&s)[kSpan]) {
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = 4 * h;
    const uint32_t lo = fp8x2<kE5M2>(__fmul_rn(to_float(v.v[j]), s[j]),
                                     __fmul_rn(to_float(v.v[j + 1]), s[j + 1]));
    const uint32_t hi = fp8x2<kE5M2>(__fmul_rn(to_float(v.v[j + 2]), s[j + 2]),
                                     __fmul_rn(to_float(v.v[j + 3]), s[j + 3]));
    w[h] = lo | (hi << 16);
  }
  return make_uint2(w[0], w[1]);
}

// Stores 8 bytes of row `row` at columns col0.. of an [rows, cols] byte matrix.
__device__ __forceinline__ void store_row8(uint8_t* out, const QuantizeParams& p, int64_t row,
                                           int64_t col0, uint2 q) {
  if (row >= p.rows || col0 >= p.cols) return;
  uint8_t* dst = out + row * p.cols + col0;
  if (p.vector_rows) {
    *reinterpret_cast<uint2*>(dst) = q;
  } else {
#pragma unroll
    for (int b = 0; b < 8; ++b) dst[b] = reinterpret_cast<const uint8_t*>(&q)[b];
  }
}

// The transposed tile in shared memory: row c (a column of the input) holds
// 128 bytes, m = 0..127, as 32 words. Row group g's word (m = 4g..4g+3) of
// row c sits at word g ^ (c/4 & 30): a warp's 32 word stores (g = 2w, 2w+1;
// c/8 = 0..15) then hit 32 distinct banks, and each 16-byte chunk keeps its
// 4 words (in a permuted order), so the 8 lanes reading one row's 8 chunks
// hit distinct banks too.
__device__ __forceinline__ int staged_word(int c, int g) { return c * 32 + (g ^ ((c >> 2) & 30)); }

// Thread (g, cg)'s 4x8 bytes (q[i] = row i) -> 8 words, one per column.
__device__ __forceinline__ void stage_transposed(uint32_t* staged, const uint2 (&q)[kRows], int g,
                                                 int cg) {
  uint32_t col[kSpan];  // column j: rows 0-3 in bytes 0-3
  tile::transpose4x4(q[0].x, q[1].x, q[2].x, q[3].x, col);
  tile::transpose4x4(q[0].y, q[1].y, q[2].y, q[3].y, col + 4);
#pragma unroll
  for (int j = 0; j < kSpan; ++j) staged[staged_word(kSpan * cg + j, g)] = col[j];
}

// The staged tile -> columnwise [K, M] rows k0.., columns m0.. (after a sync).
__device__ __forceinline__ void store_transposed(const uint32_t* staged, const QuantizeParams& p,
                                                 int64_t m0, int64_t k0) {
#pragma unroll
  for (int pass = 0; pass < kBlock * kBlock / 16 / kThreads; ++pass) {
    const int idx = pass * kThreads + threadIdx.x;
    const int c = idx / 8, h = idx % 8;  // 16 bytes: m = 16h .. 16h+15 of row c
    const int x = (c >> 2) & 30;         // the swizzle: logical word w is at w ^ x
    uint4 v = *reinterpret_cast<const uint4*>(staged + c * 32 + 4 * (h ^ (x >> 2)));
    if (x & 2) v = make_uint4(v.z, v.w, v.x, v.y);
    const int64_t k = k0 + c, m = m0 + 16 * h;
    if (k >= p.cols) continue;
    uint8_t* dst = p.columnwise + k * p.rows + m;
    if (m + 16 <= p.rows) {
      tile::store16(dst, v, p.column_store_bytes);
    } else {
#pragma unroll
      for (int b = 0; b < 16; ++b)
        if (m + b < p.rows) dst[b] = reinterpret_cast<const uint8_t*>(&v)[b];
    }
  }
}

// Zeroes the padding entries [valid1, shape1) of one scale-array row.
__device__ __forceinline__ void zero_padding(float* scales, const ScaleMap& map, int64_t row) {
  for (int64_t j = map.valid1 + threadIdx.x; j < map.shape1; j += blockDim.x)
    scales[row * map.shape1 + j] = 0.0f;
}

// GEMM-ready scale rows are indexed by one tile coordinate and padded along
// the other; the CTA that is last along the padded axis writes the padding.
__device__ __forceinline__ void write_padding(const QuantizeParams& p, bool two_d, int64_t mb,
                                              int64_t kb, bool last_m, bool last_k) {
  if (!p.gemm_ready) return;
  if (p.rowwise != nullptr && (two_d ? last_k : last_m))
    zero_padding(p.row_scales, p.row_map, two_d ? mb : kb);
  if (p.columnwise != nullptr && (two_d ? last_m : last_k))
    zero_padding(p.col_scales, p.col_map, two_d ? kb : mb);
}

template <class In, bool kE5M2, bool k2D>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const In* __restrict__ in, const QuantizeParams p) {
  __shared__ alignas(16) uint32_t staged[kBlock * kBlock / 4];
  __shared__ alignas(16) float partial[k2D ? 1 : kPairs][kBlock];  // column maxima per 8 rows
  __shared__ float shared_scale[kBlock];  // column scales (1-D) or the tile's scale (2-D)

  const int64_t mb = blockIdx.x / p.tiles_k, kb = blockIdx.x % p.tiles_k;
  const int64_t m0 = mb * kBlock, k0 = kb * kBlock;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = 2 * warp + lane / 16, cg = lane % 16;
  const int64_t row0 = m0 + kRows * g, col0 = k0 + kSpan * cg;
  write_padding(p, k2D, mb, kb, m0 + kBlock >= p.rows, k0 + kBlock >= p.cols);

  Vec<In, kSpan> v[kRows];
  load_block(in, p, row0, col0, v);
  uint2 q[kRows];

  if constexpr (k2D) {
    float amax = 0.0f;  // fmaxf skips NaN, as the CPU's std::fmax
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int j = 0; j < kSpan; ++j) amax = fmaxf(amax, fabsf(to_float(v[i].v[j])));
    amax = block_max(amax);
    if (threadIdx.x == 0) {
      const float s = p.scale(amax), inv = __fdiv_rn(1.0f, s);
      shared_scale[0] = s;
      if (p.rowwise != nullptr) p.row_scales[p.row_map.index(m0, k0)] = inv;
      if (p.columnwise != nullptr)
        p.col_scales[p.gemm_ready ? p.col_map.index(k0, m0) : p.col_map.index(m0, k0)] = inv;
    }
    __syncthreads();
    float s[kSpan];
#pragma unroll
    for (int j = 0; j < kSpan; ++j) s[j] = shared_scale[0];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      q[i] = quantize8<kE5M2>(v[i], s);
      if (p.rowwise != nullptr) store_row8(p.rowwise, p, row0 + i, col0, q[i]);
      if (p.columnwise != nullptr && !p.gemm_ready)
        store_row8(p.columnwise, p, row0 + i, col0, q[i]);
    }
  } else {
    if (p.rowwise != nullptr) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < kSpan; ++j) amax = fmaxf(amax, fabsf(to_float(v[i].v[j])));
#pragma unroll
        for (int offset = kColGroups / 2; offset > 0; offset /= 2)  // within the half-warp
          amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
        const float row_scale = p.scale(amax);
        float s[kSpan];
#pragma unroll
        for (int j = 0; j < kSpan; ++j) s[j] = row_scale;
        if (cg == i && row0 + i < p.rows)
          p.row_scales[p.row_map.index(row0 + i, k0)] = __fdiv_rn(1.0f, row_scale);
        store_row8(p.rowwise, p, row0 + i, col0, quantize8<kE5M2>(v[i], s));
      }
    }
    if (p.columnwise != nullptr) {
      float col_max[kSpan];
#pragma unroll
      for (int j = 0; j < kSpan; ++j) {
        col_max[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < kRows; ++i) col_max[j] = fmaxf(col_max[j], fabsf(to_float(v[i].v[j])));
        // Lane cg + 16 holds the same columns, rows 4(g+1)..: 8 rows per warp.
        col_max[j] = fmaxf(col_max[j], __shfl_xor_sync(0xFFFFFFFFu, col_max[j], 16));
      }
      if (lane < 16) {
        float4* slot = reinterpret_cast<float4*>(&partial[warp][kSpan * cg]);
        slot[0] = make_float4(col_max[0], col_max[1], col_max[2], col_max[3]);
        slot[1] = make_float4(col_max[4], col_max[5], col_max[6], col_max[7]);
      }
      __syncthreads();
      if (threadIdx.x < kBlock) {
        const int c = threadIdx.x;
        float amax = 0.0f;
#pragma unroll
        for (int w = 0; w < kPairs; ++w) amax = fmaxf(amax, partial[w][c]);
        const float s = p.scale(amax);
        shared_scale[c] = s;
        if (k0 + c < p.cols)
          p.col_scales[p.gemm_ready ? p.col_map.index(k0 + c, m0) : p.col_map.index(m0, k0 + c)] =
              __fdiv_rn(1.0f, s);
      }
      __syncthreads();
      float s[kSpan];
#pragma unroll
      for (int j = 0; j < kSpan; ++j) s[j] = shared_scale[kSpan * cg + j];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        q[i] = quantize8<kE5M2>(v[i], s);
        if (!p.gemm_ready) store_row8(p.columnwise, p, row0 + i, col0, q[i]);
      }
    }
  }

  if (p.columnwise != nullptr && p.gemm_ready) {
    stage_transposed(staged, q, g, cg);
    __syncthreads();
    store_transposed(staged, p, m0, k0);
  }
}

struct DequantizeParams {
  int64_t rows, cols;
  int shift_r, shift_c;  // log2 of the block's rows / columns (0 or 7)
  int64_t stride_r, stride_c;
  bool vectorized;       // cols % 8 == 0 and the pointers allow 8-code loads, 8-output stores
};

template <class Out, bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* __restrict__ in, const float* __restrict__ scales,
                      Out* __restrict__ out, const DequantizeParams p) {
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const uint8_t* q_row = in + r * p.cols;
    Out* out_row = out + r * p.cols;
    const float* s_row = scales + (r >> p.shift_r) * p.stride_r;
    auto scale_of = [&](int64_t c) { return s_row[(c >> p.shift_c) * p.stride_c]; };
    if (p.vectorized) {
      for (int64_t c = kSpan * static_cast<int64_t>(threadIdx.x); c < p.cols;
           c += kSpan * kThreads) {
        const Vec<uint8_t, kSpan> q = load_vec<uint8_t, kSpan>(q_row + c);
        Vec<Out, kSpan> o;
#pragma unroll
        for (int j = 0; j < kSpan; j += 2) {
          const float2 f = fp8x2_to_float2<kE5M2>(q.v[j] | (uint32_t{q.v[j + 1]} << 8));
          o.v[j] = from_float<Out>(dequant(f.x, q.v[j] & 0x80, scale_of(c + j)));
          o.v[j + 1] = from_float<Out>(dequant(f.y, q.v[j + 1] & 0x80, scale_of(c + j + 1)));
        }
        store_vec(out_row + c, o);
      }
    } else {
      for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
        const float f = fp8x2_to_float2<kE5M2>(q_row[c]).x;
        out_row[c] = from_float<Out>(dequant(f, q_row[c] & 0x80, scale_of(c)));
      }
    }
  }
}

__global__ void transpose_2d_scales_kernel(const float* __restrict__ row_scales, ScaleMap row_map,
                                           float* __restrict__ col_scales, ScaleMap col_map,
                                           bool gemm_ready) {
  const int64_t n = col_map.shape0 * col_map.shape1;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    col_scales[e] = columnwise_2d_scale(row_scales, row_map, col_map, gemm_ready,
                                        e / col_map.shape1, e % col_map.shape1);
}

int log2_block(int64_t block) { return block == kBlock ? 7 : 0; }

}  // namespace

void quantize(const QuantizeArgs& a, te_stream stream) {
  if (a.rows == 0 || a.cols == 0) return;  // every scale array is empty too
  QuantizeParams p{};
  p.rows = a.rows;
  p.cols = a.cols;
  p.tiles_k = cdiv(a.cols, kBlock);
  p.rowwise = a.rowwise;
  p.row_scales = a.rowwise_scale_inv;
  p.row_map = a.rowwise_map;
  p.columnwise = a.columnwise;
  p.col_scales = a.columnwise_scale_inv;
  p.col_map = a.columnwise_map;
  p.gemm_ready = a.layout == TE_FP8_BLOCK_GEMM_READY;
  p.vector_loads = is_aligned(a.input, 16);
  const bool compact_col = a.columnwise != nullptr && !p.gemm_ready;
  p.vector_rows = (a.rowwise == nullptr || is_aligned(a.rowwise, 8)) &&
                  (!compact_col || is_aligned(a.columnwise, 8));
  p.column_store_bytes = 1;
  for (int w = 16; w > 1; w /= 2) {
    if (a.rows % w == 0 && is_aligned(a.columnwise, w)) {
      p.column_store_bytes = w;
      break;
    }
  }
  p.fp8_max = fp8_format(a.fp8_dtype).max_finite;
  p.epsilon = a.epsilon;
  p.value_for_inf = max_finite_of(a.input_dtype);
  p.force_pow2 = a.force_pow2;
  const int64_t tiles = cdiv(a.rows, kBlock) * p.tiles_k;
  cudaStream_t s = cuda_stream(stream);
  dispatch_input(a.input_dtype, [&](auto in_tag) {
    using In = decltype(in_tag);
    dispatch_fp8(a.fp8_dtype, [&](auto e5m2) {
      constexpr bool kE5M2 = decltype(e5m2)::value;
      const In* in = static_cast<const In*>(a.input);
      if (a.dim == TE_FP8_BLOCK_2D) {
        quantize_kernel<In, kE5M2, true><<<tiles, kThreads, 0, s>>>(in, p);
      } else {
        quantize_kernel<In, kE5M2, false><<<tiles, kThreads, 0, s>>>(in, p);
      }
      TE_CHECK_LAUNCH();
    });
  });
}

void dequantize(const DequantizeArgs& a, te_stream stream) {
  if (a.rows == 0 || a.cols == 0) return;
  DequantizeParams p{a.rows, a.cols, log2_block(a.map.block_rows), log2_block(a.map.block_cols),
                     a.map.stride_r, a.map.stride_c, false};
  dispatch_input(a.output_dtype, [&](auto out_tag) {
    using Out = decltype(out_tag);
    dispatch_fp8(a.fp8_dtype, [&](auto e5m2) {
      auto kernel = dequantize_kernel<Out, decltype(e5m2)::value>;
      Out* out = static_cast<Out*>(a.output);
      p.vectorized = a.cols % kSpan == 0 && is_aligned(a.data, kSpan) &&
                     is_aligned(out, alignof(Vec<Out, kSpan>));
      const int64_t blocks =
          persistent_blocks(reinterpret_cast<const void*>(kernel), kThreads, a.rows);
      kernel<<<blocks, kThreads, 0, cuda_stream(stream)>>>(a.data, a.scale_inv, out, p);
      TE_CHECK_LAUNCH();
    });
  });
}

void transpose_2d(const Transpose2dArgs& a, te_stream stream) {
  cudaStream_t s = cuda_stream(stream);
  const bool gemm_ready = a.layout == TE_FP8_BLOCK_GEMM_READY;
  if (gemm_ready) {
    te::transpose::cuda::transpose(a.rowwise, a.columnwise, a.rows, a.cols, 1, stream);
  } else if (a.rows * a.cols > 0) {
    TE_CHECK_CUDA(cudaMemcpyAsync(a.columnwise, a.rowwise, static_cast<size_t>(a.rows * a.cols),
                                  cudaMemcpyDeviceToDevice, s));
  }
  const int64_t n = a.columnwise_map.shape0 * a.columnwise_map.shape1;
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>(ceil_div(n, kThreads), 1024);
  transpose_2d_scales_kernel<<<blocks, kThreads, 0, s>>>(a.rowwise_scale_inv, a.rowwise_map,
                                                         a.columnwise_scale_inv, a.columnwise_map,
                                                         gemm_ready);
  TE_CHECK_LAUNCH();
}

}  // namespace te::fp8_block::cuda
