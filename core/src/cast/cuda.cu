// CUDA backend of the cast family: per-tensor FP8 quantization, amax, scale
// from amax and dequantization. Byte-identical to the CPU backend (cpu.cpp):
//     q = saturate(round_to_nearest_even(float32(x) * scale)), NaN -> 0x7F
//     amax = max |x| over the non-NaN x;  x' = float32(q) * scale_inv
// with the hardware conversion (cvt.rn.satfinite.{e4m3,e5m2}x2.f32): RNE,
// denormals kept, +-inf and out-of-range values saturated to +-max. NaN lanes
// are patched to 0x7F explicitly, so the bytes do not depend on which NaN the
// instruction produces.
//
// Kernels (256 threads, all memory bound):
//  - rowwise only: a persistent grid-stride loop over 16-byte input vectors
//    (8 BF16/FP16 or 4 FP32 elements -> 8 or 4 FP8 bytes), amax fused, one
//    atomic per block. Traffic: (sizeof(x) + 1) bytes per element.
//  - with a columnwise output: the tiled cast-transpose of transpose/tile.cuh,
//    one pass, (sizeof(x) + 2) bytes per element (sizeof(x) + 1 without rowwise).
//  - current scaling: cudaMemsetAsync(amax, 0); an amax kernel (reads x once);
//    then the quantize kernel, in which every block derives the scale from
//    amax and block 0 writes scale and scale_inv when it is done. No host
//    synchronization, no allocation: the sequence can be captured in a graph.
//  - dequantize: grid-stride loop over 16-byte output vectors.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "cast/backend.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"
#include "runtime/element.h"
#include "runtime/numerics.h"
#include "transpose/tile.cuh"

namespace te::cast::cuda {
namespace {

constexpr int kThreads = 256;

using cuda_elem::dequant;
using cuda_elem::dispatch_fp8;
using cuda_elem::dispatch_input;
using cuda_elem::fp8x2;
using cuda_elem::fp8x2_to_float2;
using cuda_elem::from_float;
using cuda_elem::to_float;

// Where the quantize kernels get the scale. Delayed scaling reads `scale`;
// current scaling (scale == nullptr) computes it from `amax`. At the end of the
// kernel, block 0 writes scale_out (current scaling) and scale_inv_out =
// 1 / scale (IEEE division, as the CPU's 1.0f / s): writing them at the start
// would make every thread wait for the scale before issuing its loads.
struct ScaleSource {
  const float* scale;
  const float* amax;
  float fp8_max;
  bool force_pow2;
  float epsilon;
  float value_for_inf;
  float* scale_out;
  float* scale_inv_out;

  __device__ float value() const {
    return scale != nullptr
               ? *scale
               : te::scale_from_amax(*amax, fp8_max, force_pow2, epsilon, value_for_inf);
  }

  __device__ void publish(float s) const {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (scale_out != nullptr) *scale_out = s;
    if (scale_inv_out != nullptr) *scale_inv_out = __fdiv_rn(1.0f, s);
  }
};

// The element conversion of the quantize kernels (also the Op of tile.cuh).
// amax_accum, when set, receives fmaxf(*amax_accum, amax of the elements).
template <class In, bool kE5M2>
struct Quantizer {
  ScaleSource source;
  float* amax_accum;
  float scale;

  __device__ void begin() { scale = source.value(); }

  template <int N>
  __device__ __forceinline__ Vec<uint32_t, N / 4> convert_words(const Vec<In, N>& v,
                                                                float& amax) const {
    Vec<uint32_t, N / 4> out;
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float x0 = to_float(v.v[i]), x1 = to_float(v.v[i + 1]);
      amax = fmaxf(amax, fmaxf(fabsf(x0), fabsf(x1)));
      // A plain multiply (no contraction), as the CPU computes x * scale.
      const uint32_t pair = fp8x2<kE5M2>(__fmul_rn(x0, scale), __fmul_rn(x1, scale));
      if (i % 4 == 0) {
        out.v[i / 4] = pair;
      } else {
        out.v[i / 4] |= pair << 16;
      }
    }
    return out;
  }

  __device__ __forceinline__ uint2 convert(const Vec<In, 8>& v, float& amax) const {
    const Vec<uint32_t, 2> w = convert_words(v, amax);
    return make_uint2(w.v[0], w.v[1]);
  }

  __device__ __forceinline__ uint8_t convert_one(In x, float& amax) const {
    const float f = to_float(x);
    amax = fmaxf(amax, fabsf(f));
    return static_cast<uint8_t>(fp8x2<kE5M2>(__fmul_rn(f, scale), 0.0f));
  }

  __device__ void finish(float amax) const {
    source.publish(scale);
    if (amax_accum == nullptr) return;  // uniform over the grid
    amax = block_max(amax);
    if (threadIdx.x == 0) atomic_fmax(amax_accum, amax);
  }
};

// Grid-stride loop over [0, n) in vectors of N elements, kUnroll vectors in
// flight per thread, and the n % N tail element-wise. body_vec(i) handles
// elements [i*N, i*N+N) given its loaded vector; body_one(i) element i.
template <int kUnroll, class T, int N, class VecBody, class OneBody>
__device__ __forceinline__ void for_each_vector(const T* in, int64_t n, bool vectorized,
                                                VecBody body_vec, OneBody body_one) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorized) {
    const int64_t vectors = n / N;
    for (int64_t base = first; base < vectors; base += kUnroll * stride) {
      Vec<T, N> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + u * stride < vectors) v[u] = load_vec<T, N>(in + (base + u * stride) * N);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + u * stride < vectors) body_vec(base + u * stride, v[u]);
    }
    done = vectors * N;
  }
  for (int64_t i = done + first; i < n; i += stride) body_one(i);
}

template <class In, bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    quantize_rowwise_kernel(const In* __restrict__ in, uint8_t* __restrict__ out, int64_t n,
                            bool vectorized, Quantizer<In, kE5M2> op) {
  constexpr int N = 16 / sizeof(In);
  op.begin();
  float amax = 0.0f;
  for_each_vector<2, In, N>(
      in, n, vectorized,
      [&](int64_t i, const Vec<In, N>& v) {
        const Vec<uint32_t, N / 4> w = op.convert_words(v, amax);
        store_vec(reinterpret_cast<uint32_t*>(out + i * N), w);
      },
      [&](int64_t i) { out[i] = op.convert_one(in[i], amax); });
  op.finish(amax);
}

// amax over the input into *amax, which the launcher zeroed.
template <class In>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const In* __restrict__ in, int64_t n, bool vectorized, float* amax_out) {
  constexpr int N = 16 / sizeof(In);
  float amax = 0.0f;
  for_each_vector<4, In, N>(
      in, n, vectorized,
      [&](int64_t, const Vec<In, N>& v) {
#pragma unroll
        for (int j = 0; j < N; ++j) amax = fmaxf(amax, fabsf(to_float(v.v[j])));
      },
      [&](int64_t i) { amax = fmaxf(amax, fabsf(to_float(in[i]))); });
  amax = block_max(amax);
  if (threadIdx.x == 0) atomic_max_nonnegative(amax_out, amax);
}

__global__ void scale_from_amax_kernel(const float* amax, float* scale, float* scale_inv,
                                       float fp8_max, bool force_pow2, float epsilon) {
  const float s = te::scale_from_amax(*amax, fp8_max, force_pow2, epsilon, kFp32Max);
  *scale = s;
  if (scale_inv != nullptr) *scale_inv = __fdiv_rn(1.0f, s);
}

template <class Out, bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* __restrict__ in, const float* scale_inv, Out* __restrict__ out,
                      int64_t n, bool vectorized) {
  constexpr int N = 16 / sizeof(Out);
  const float s = *scale_inv;
  // Four vectors in flight: each load is only 4 or 8 bytes.
  for_each_vector<4, uint8_t, N>(
      in, n, vectorized,
      [&](int64_t i, const Vec<uint8_t, N>& q) {
        Vec<Out, N> o;
#pragma unroll
        for (int j = 0; j < N; j += 2) {
          const float2 f = fp8x2_to_float2<kE5M2>(q.v[j] | (uint32_t{q.v[j + 1]} << 8));
          o.v[j] = from_float<Out>(dequant(f.x, q.v[j] & 0x80, s));
          o.v[j + 1] = from_float<Out>(dequant(f.y, q.v[j + 1] & 0x80, s));
        }
        store_vec(out + i * N, o);
      },
      [&](int64_t i) {
        const float f = fp8x2_to_float2<kE5M2>(in[i]).x;
        out[i] = from_float<Out>(dequant(f, in[i] & 0x80, s));
      });
}

template <class In, bool kE5M2>
void launch_quantize(const Fp8QuantizeArgs& a, const ScaleSource& source, float* amax_accum,
                     cudaStream_t stream) {
  const Quantizer<In, kE5M2> op{source, amax_accum, 0.0f};
  const In* in = static_cast<const In*>(a.input);
  if (a.columnwise == nullptr) {
    constexpr int N = 16 / sizeof(In);
    const int64_t n = a.rows * a.cols;
    const bool vectorized = is_aligned(in, 16) && is_aligned(a.rowwise, N);
    auto kernel = quantize_rowwise_kernel<In, kE5M2>;
    const int64_t blocks = persistent_blocks(reinterpret_cast<const void*>(kernel), kThreads,
                                             ceil_div(n, N * kThreads));
    kernel<<<blocks, kThreads, 0, stream>>>(in, a.rowwise, n, vectorized, op);
    TE_CHECK_LAUNCH();
    return;
  }
  const auto args = tile::make_tile_args(in, a.rows, a.cols, a.rowwise, a.columnwise);
  const int64_t blocks = tile::num_tiles(a.rows, a.cols);
  if (a.rowwise != nullptr) {
    tile::cast_transpose_kernel<In, Quantizer<In, kE5M2>, true>
        <<<blocks, tile::kThreads, 0, stream>>>(args, op);
  } else {
    tile::cast_transpose_kernel<In, Quantizer<In, kE5M2>, false>
        <<<blocks, tile::kThreads, 0, stream>>>(args, op);
  }
  TE_CHECK_LAUNCH();
}

void quantize(const Fp8QuantizeArgs& a, const ScaleSource& source, float* amax_accum,
              cudaStream_t stream) {
  dispatch_input(a.input_dtype, [&](auto in_tag) {
    dispatch_fp8(a.fp8_dtype, [&](auto e5m2) {
      launch_quantize<decltype(in_tag), decltype(e5m2)::value>(a, source, amax_accum, stream);
    });
  });
}

// Zeroes *amax, then max-reduces |input| into it.
void amax_into(const void* input, te_dtype dtype, int64_t n, float* amax, cudaStream_t stream) {
  TE_CHECK_CUDA(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  dispatch_input(dtype, [&](auto in_tag) {
    using In = decltype(in_tag);
    constexpr int N = 16 / sizeof(In);
    const In* in = static_cast<const In*>(input);
    auto kernel = amax_kernel<In>;
    const int64_t blocks = persistent_blocks(reinterpret_cast<const void*>(kernel), kThreads,
                                             ceil_div(n, 4 * N * kThreads));
    kernel<<<blocks, kThreads, 0, stream>>>(in, n, is_aligned(in, 16), amax);
    TE_CHECK_LAUNCH();
  });
}

}  // namespace

void quantize_fp8(const Fp8QuantizeArgs& args, const float* scale, te_stream stream) {
  const ScaleSource source{scale, nullptr, 0.0f, false, 0.0f, 0.0f, nullptr, args.scale_inv};
  quantize(args, source, args.amax, cuda_stream(stream));
}

void quantize_fp8_current_scaling(const Fp8QuantizeArgs& args, const CurrentScaling& cs,
                                  te_stream stream) {
  amax_into(args.input, args.input_dtype, args.rows * args.cols, args.amax, cuda_stream(stream));
  const ScaleSource source{nullptr,       args.amax,     fp8_format(args.fp8_dtype).max_finite,
                           cs.force_pow2, cs.epsilon,    cs.value_for_inf,
                           cs.scale,      args.scale_inv};
  quantize(args, source, nullptr, cuda_stream(stream));
}

void compute_amax(const void* input, te_dtype dtype, int64_t n, float* amax, te_stream stream) {
  amax_into(input, dtype, n, amax, cuda_stream(stream));
}

void scale_from_amax(const float* amax, float* scale, float* scale_inv, float fp8_max,
                     bool force_pow2, float epsilon, te_stream stream) {
  scale_from_amax_kernel<<<1, 1, 0, cuda_stream(stream)>>>(amax, scale, scale_inv, fp8_max,
                                                           force_pow2, epsilon);
  TE_CHECK_LAUNCH();
}

void dequantize_fp8(const uint8_t* input, te_dtype fp8_dtype, const float* scale_inv, void* output,
                    te_dtype output_dtype, int64_t n, te_stream stream) {
  dispatch_input(output_dtype, [&](auto out_tag) {
    dispatch_fp8(fp8_dtype, [&](auto e5m2) {
      using Out = decltype(out_tag);
      constexpr int N = 16 / sizeof(Out);
      auto kernel = dequantize_kernel<Out, decltype(e5m2)::value>;
      Out* out = static_cast<Out*>(output);
      const bool vectorized = is_aligned(input, N) && is_aligned(out, 16);
      const int64_t blocks = persistent_blocks(reinterpret_cast<const void*>(kernel), kThreads,
                                               ceil_div(n, 4 * N * kThreads));
      kernel<<<blocks, kThreads, 0, cuda_stream(stream)>>>(input, scale_inv, out, n, vectorized);
      TE_CHECK_LAUNCH();
    });
  });
}

}  // namespace te::cast::cuda
