// CUDA backend of the MXFP8 family: byte-identical to cpu.cpp (te/mxfp8.h has
// the formulas; mxfp8/numerics.h the bit-level helpers both backends share).
//
// Quantize: one kernel, one pass over the input. 16-byte aligned pointers (the
// usual case) take the tiled kernel of quantize_tile.cuh in its
// tiled::DefaultShape (bench/kernels/run_mxfp8_variants.sh times it against
// other shapes and the warp-tile kernel); other pointers take the warp-tile
// kernel of quantize_warp.cuh, with vector or element-wise accesses as the
// pointers allow.
//  Traffic per element (BF16 in, both directions): 2 bytes read, 2 bytes written,
//  plus 2/32 bytes of scales, i.e. ~4.06 bytes/element, the minimum.
// Dequantize: grid-stride over 16 FP8 bytes per thread (one 16-byte load, 16
// outputs stored as 16-byte vectors); a NaN result is written as the quiet NaN
// with the sign of the FP8 code, as the CPU backend does.
#include "mxfp8/backend.h"
#include "mxfp8/numerics.h"
#include "mxfp8/quantize_tile.cuh"
#include "mxfp8/quantize_warp.cuh"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"

namespace te::mxfp8::cuda {
namespace {

// Whether 2-D (32x32) blocks take the tiled kernel too. The warp-tile kernel is
// cheap there (one scale per warp-tile column block); the variants driver
// times both, so this can follow the measurement.
constexpr bool kTiledFor2D = true;

constexpr int kThreads = 256;  // dequantize

using cuda_elem::dispatch_fp8;
using cuda_elem::dispatch_input;
using cuda_elem::fp8x2_to_float2;
using cuda_elem::from_float;

// ---- dequantize ----------------------------------------------------------------

constexpr int kDequantElems = 16;  // FP8 bytes per thread and step

// float(q) * factor, a NaN written as the quiet NaN with q's sign (cpu.cpp).
__device__ __forceinline__ float dequant(float q, uint8_t code, float factor) {
  const float v = __fmul_rn(q, factor);
  return v == v ? v : __uint_as_float((code & 0x80u ? 0x80000000u : 0u) | 0x7FC00000u);
}

template <class Out, bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const DequantizeArgs a, bool vectorized) {
  const int64_t groups = a.rows * a.cols / kDequantElems;  // never straddle rows (K % 32 == 0)
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Out* out = static_cast<Out*>(a.output);
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += stride) {
    const int64_t first = g * kDequantElems;
    const int64_t r = first / a.cols, c0 = first % a.cols;
    uint8_t q[kDequantElems];
    if (vectorized) {
      *reinterpret_cast<uint4*>(q) = __ldg(reinterpret_cast<const uint4*>(a.input + first));
    } else {
#pragma unroll
      for (int i = 0; i < kDequantElems; ++i) q[i] = a.input[first + i];
    }
    const uint8_t row_e =
        a.columnwise
            ? 0
            : __ldg(a.scales + rowwise_scale_offset(r, c0 / kBlock, a.scale_cols, a.swizzled));
    Vec<Out, kDequantElems> o;
#pragma unroll
    for (int i = 0; i < kDequantElems; i += 2) {
      const float2 f = fp8x2_to_float2<kE5M2>(q[i] | (uint32_t{q[i + 1]} << 8));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t e =
            a.columnwise
                ? __ldg(a.scales + columnwise_scale_offset(r / kBlock, c0 + i + h, a.scale_rows,
                                                           a.scale_cols, a.swizzled))
                : row_e;
        o.v[i + h] = from_float<Out>(dequant(h ? f.y : f.x, q[i + h], dequantize_factor(e)));
      }
    }
    if (vectorized) {
      store_vec(out + first, o);
    } else {
#pragma unroll
      for (int i = 0; i < kDequantElems; ++i) out[first + i] = o.v[i];
    }
  }
}

}  // namespace

void quantize(const QuantizeArgs& a, te_stream stream) {
  const cudaStream_t s = cuda_stream(stream);
  if (a.rows == 0 || a.cols == 0) return;  // then the scale buffers are empty too
  dispatch_input(a.input_dtype, [&](auto in_tag) {
    dispatch_fp8(a.fp8_dtype, [&](auto e5m2) {
      using In = decltype(in_tag);
      constexpr bool kE5M2 = decltype(e5m2)::value;
      constexpr int V = 16 / sizeof(In);
      if (tiled::fits(a) && (kTiledFor2D || !a.use_2d_blocks)) {
        tiled::launch_quantize<In, kE5M2, tiled::DefaultShape>(a, s);
      } else if (is_aligned(a.input, 16) && is_aligned(a.rowwise, V) &&
                 is_aligned(a.columnwise, V)) {
        warp::launch_quantize<In, kE5M2, true>(a, s);
      } else {
        warp::launch_quantize<In, kE5M2, false>(a, s);
      }
    });
  });
}

void dequantize(const DequantizeArgs& a, te_stream stream) {
  const int64_t groups = a.rows * a.cols / kDequantElems;
  if (groups == 0) return;
  auto launch = [&](auto out_tag, auto e5m2) {
    using Out = decltype(out_tag);
    auto kernel = dequantize_kernel<Out, decltype(e5m2)::value>;
    const bool vectorized = is_aligned(a.input, 16) && is_aligned(a.output, 16);
    const int64_t blocks = persistent_blocks(reinterpret_cast<const void*>(kernel), kThreads,
                                             ceil_div(groups, kThreads));
    kernel<<<blocks, kThreads, 0, cuda_stream(stream)>>>(a, vectorized);
    TE_CHECK_LAUNCH();
  };
  dispatch_input(a.output_dtype, [&](auto out_tag) {
    dispatch_fp8(a.fp8_dtype, [&](auto e5m2) { launch(out_tag, e5m2); });
  });
}

}  // namespace te::mxfp8::cuda
