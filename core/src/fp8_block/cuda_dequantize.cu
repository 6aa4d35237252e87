// CUDA dequantize and 2-D transpose of the FP8-block family (te/fp8_block.h),
// identical to cpu.cpp. (The quantize kernel is in cuda.cu.)
//
// Dequantize: each thread moves 16 codes (one 16-byte load) of each of 4
// consecutive rows to 16 outputs per row (two or four 16-byte stores); the 4
// loads and their scales are all issued before any conversion. 16 codes never
// straddle a 128-element block (16 divides 128), so a 1x128 or 128x128 block
// gives one scale per row of the thread; 128x1 blocks (1-D compact
// columnwise) give 16 consecutive scales, the same for the 4 rows (they lie
// in one 128-row block). Threads of a row segment are consecutive (16-byte
// accesses, 512 contiguous code bytes a warp); the CTA is 2-D so that narrow
// matrices still fill it. Traffic: 1 + sizeof(out) bytes per element.
// Per 16 codes: with no NaN code and finite nonzero scales no product can be
// NaN, so a multiply and a hardware round (F2FP, RNE) per element give the
// CPU's bits; otherwise each element takes cuda_elem::dequant and the exact
// from_float (the CPU's NaN bits). Shapes whose rows are not whole 16-byte
// vectors (or unaligned pointers) take an element-wise kernel.
#include <algorithm>

#include "fp8_block/backend.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"
#include "runtime/numerics.h"
#include "transpose/backend.h"

namespace te::fp8_block::cuda {
namespace {

using cuda_elem::dequant;
using cuda_elem::dispatch_fp8;
using cuda_elem::dispatch_input;
using cuda_elem::fp8x2_to_float2;
using cuda_elem::from_float;

constexpr int kThreads = 256;
constexpr int kCodes = 16;  // codes per thread per row: one 16-byte load
constexpr int kRowsPerThread = 4;

struct DequantizeParams {
  int64_t rows, cols;
  int shift_r, shift_c;  // log2 of the block's rows / columns (0 or 7)
  int64_t stride_r, stride_c;
  int64_t row_groups;  // cdiv(rows, kRowsPerThread)
  bool vector_scales;  // 128x1 blocks: each row of scales is 16-byte aligned
};

int log2_block(int64_t block) { return block == kBlock ? 7 : 0; }

// True when one of the 16 codes is a NaN (low 7 bits 0x7F in E4M3,
// 0x7D..0x7F in E5M2): adding 1 (3) to the low 7 bits carries into bit 7.
template <bool kE5M2>
__device__ __forceinline__ bool has_nan_code(const uint4& codes) {
  constexpr uint32_t kAdd = kE5M2 ? 0x03030303u : 0x01010101u;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&codes);
  uint32_t carry = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) carry |= (w[i] & 0x7F7F7F7Fu) + kAdd;
  return (carry & 0x80808080u) != 0;
}

// A finite, nonzero scale: times a non-NaN code it gives no NaN.
__device__ __forceinline__ bool plain_scale(float s) { return s != 0.0f && fabsf(s) <= kFp32Max; }

// Two non-NaN floats -> two outputs, rounded to nearest even by the hardware
// (the same bits as numerics.h for every non-NaN value).
__device__ __forceinline__ void store_pair(float* o, float a, float b) {
  o[0] = a;
  o[1] = b;
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* o, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store_pair(__half* o, float a, float b) {
  *reinterpret_cast<__half2*>(o) = __floats2half2_rn(a, b);
}

// 16 codes -> 16 outputs at dst; scale(j) is the scale of code j. Without
// NaN codes and with plain scales no product is NaN and one multiply and a
// hardware conversion per element give the CPU's bits; otherwise every
// element takes dequant(), which reproduces the CPU's NaN bits.
template <class Out, bool kE5M2, class Scale>
__device__ __forceinline__ void dequantize16(const uint4& codes, Scale scale, bool plain_scales,
                                             Out* dst) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(&codes);
  Vec<Out, kCodes> o;
  if (plain_scales && !has_nan_code<kE5M2>(codes)) {
#pragma unroll
    for (int j = 0; j < kCodes; j += 2) {
      const float2 f = fp8x2_to_float2<kE5M2>(words[j / 4] >> (8 * (j % 4)));
      store_pair(&o.v[j], __fmul_rn(f.x, scale(j)), __fmul_rn(f.y, scale(j + 1)));
    }
  } else {
#pragma unroll
    for (int j = 0; j < kCodes; j += 2) {
      const uint32_t two = (words[j / 4] >> (8 * (j % 4))) & 0xFFFFu;
      const float2 f = fp8x2_to_float2<kE5M2>(two);
      o.v[j] = from_float<Out>(dequant(f.x, two & 0x80u, scale(j)));
      o.v[j + 1] = from_float<Out>(dequant(f.y, two & 0x8000u, scale(j + 1)));
    }
  }
  store_vec(dst, o);
}

// kColumnScales: 128x1 blocks (one scale per column); else one scale per row
// of 16 codes.
template <class Out, bool kE5M2, bool kColumnScales>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* __restrict__ in, const float* __restrict__ scales,
                      Out* __restrict__ out, const DequantizeParams p) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kCodes;
  if (c >= p.cols) return;
  for (int64_t group = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
       group < p.row_groups; group += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t r0 = group * kRowsPerThread;
    uint4 q[kRowsPerThread];
    float s[kColumnScales ? kCodes : kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
      q[i] = r0 + i < p.rows ? __ldg(reinterpret_cast<const uint4*>(in + (r0 + i) * p.cols + c))
                             : make_uint4(0, 0, 0, 0);
    if constexpr (kColumnScales) {  // the 4 rows share one 128-row block
      const float* row = scales + (r0 >> p.shift_r) * p.stride_r + c;
      if (p.vector_scales) {
#pragma unroll
        for (int j = 0; j < kCodes; j += 4)
          *reinterpret_cast<float4*>(&s[j]) = __ldg(reinterpret_cast<const float4*>(row + j));
      } else {
#pragma unroll
        for (int j = 0; j < kCodes; ++j) s[j] = __ldg(row + j);
      }
    } else {
      const float* col_scales = scales + (c >> p.shift_c) * p.stride_c;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
        s[i] = r0 + i < p.rows ? __ldg(col_scales + ((r0 + i) >> p.shift_r) * p.stride_r) : 0.0f;
    }
    bool plain = true;  // 128x1 blocks: the same 16 scales for the 4 rows
    if constexpr (kColumnScales) {
#pragma unroll
      for (int j = 0; j < kCodes; ++j) plain = plain && plain_scale(s[j]);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      if (r0 + i >= p.rows) break;
      Out* dst = out + (r0 + i) * p.cols + c;
      if constexpr (kColumnScales) {
        dequantize16<Out, kE5M2>(q[i], [&](int j) { return s[j]; }, plain, dst);
      } else {
        const float row_scale = s[i];
        dequantize16<Out, kE5M2>(q[i], [&](int) { return row_scale; }, plain_scale(row_scale), dst);
      }
    }
  }
}

// Any shape and alignment: one element per thread, a grid-stride loop over rows.
template <class Out, bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    dequantize_elementwise_kernel(const uint8_t* __restrict__ in, const float* __restrict__ scales,
                                  Out* __restrict__ out, const DequantizeParams p) {
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* s_row = scales + (r >> p.shift_r) * p.stride_r;
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
      const uint8_t code = in[r * p.cols + c];
      const float f = fp8x2_to_float2<kE5M2>(code).x;
      const float s = s_row[(c >> p.shift_c) * p.stride_c];
      out[r * p.cols + c] = from_float<Out>(dequant(f, code & 0x80, s));
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

template <class Out, bool kE5M2>
void launch_dequantize(const DequantizeArgs& a, DequantizeParams p, cudaStream_t stream) {
  Out* out = static_cast<Out*>(a.output);
  const bool vectorized = a.cols % kCodes == 0 && is_aligned(a.data, 16) && is_aligned(out, 16);
  if (!vectorized) {
    auto kernel = dequantize_elementwise_kernel<Out, kE5M2>;
    const int64_t blocks =
        persistent_blocks(reinterpret_cast<const void*>(kernel), kThreads, a.rows);
    kernel<<<blocks, kThreads, 0, stream>>>(a.data, a.scale_inv, out, p);
    TE_CHECK_LAUNCH();
    return;
  }
  // The CTA spans min(256, next power of 2) 16-code vectors of a row, and as
  // many row groups as fill 256 threads.
  const int64_t vectors = a.cols / kCodes;
  int tx = 1;
  while (tx < vectors && tx < kThreads) tx *= 2;
  const int ty = kThreads / tx;
  p.row_groups = cdiv(a.rows, kRowsPerThread);
  const dim3 grid(static_cast<unsigned>(cdiv(vectors, tx)),
                  static_cast<unsigned>(std::min<int64_t>(cdiv(p.row_groups, ty), 65535)));
  const dim3 block(tx, ty);
  if (a.map.block_cols == 1) {  // 128x1 blocks: 1-D compact columnwise
    p.vector_scales = is_aligned(a.scale_inv, 16) && p.stride_r % 4 == 0;
    dequantize_kernel<Out, kE5M2, true><<<grid, block, 0, stream>>>(a.data, a.scale_inv, out, p);
  } else {
    dequantize_kernel<Out, kE5M2, false><<<grid, block, 0, stream>>>(a.data, a.scale_inv, out, p);
  }
  TE_CHECK_LAUNCH();
}

}  // namespace

void dequantize(const DequantizeArgs& a, te_stream stream) {
  if (a.rows == 0 || a.cols == 0) return;
  DequantizeParams p{};
  p.rows = a.rows;
  p.cols = a.cols;
  p.shift_r = log2_block(a.map.block_rows);
  p.shift_c = log2_block(a.map.block_cols);
  p.stride_r = a.map.stride_r;
  p.stride_c = a.map.stride_c;
  dispatch_input(a.output_dtype, [&](auto out_tag) {
    dispatch_fp8(a.fp8_dtype, [&](auto e5m2) {
      launch_dequantize<decltype(out_tag), decltype(e5m2)::value>(a, p, cuda_stream(stream));
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
  transpose_2d_scales_kernel<<<blocks, kThreads, 0, s>>>(
      a.rowwise_scale_inv, a.rowwise_map, a.columnwise_scale_inv, a.columnwise_map, gemm_ready);
  TE_CHECK_LAUNCH();
}

}  // namespace te::fp8_block::cuda
