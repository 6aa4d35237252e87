// CUDA backend of the MXFP8 family: byte-identical to cpu.cpp (te/mxfp8.h has
// the formulas; mxfp8/numerics.h the bit-level helpers both backends share).
//
// Quantize: one kernel, one pass over the input, no shared memory.
//  - A warp owns a tile of 32 rows x 8V columns, V = 16 / sizeof(input) elements
//    per 16-byte vector (V = 8: 32 x 64 for BF16/FP16; V = 4: 32 x 32 for FP32).
//    Lane = 8 * g + v: row group g (rows 8g .. 8g+7 of the tile), column vector v
//    (columns V*v .. V*v+V-1). A lane issues its eight 16-byte row loads before
//    using any, so 4 KB (BF16) per warp are in flight; one load instruction
//    covers 4 rows x 128 contiguous bytes.
//  - Rowwise 1x32 block = 32 / V neighbouring lanes of one row group: a
//    __shfl_xor butterfly over 2 (BF16) or 3 (FP32) steps gives each lane the
//    block amax. Columnwise 32x1 block = the 4 row groups: butterfly over lanes
//    8 and 16 apart, per column. A 2-D 32x32 tile is the union of both.
//  - Each lane then casts its elements (FP32 multiply by 2^(127-e), hardware
//    cvt.rn.satfinite, NaN patched to 0x7F: runtime/cuda_elem.cuh) and stores V bytes per row for
//    each requested direction; the first lane of a block writes its scale byte, compact or swizzled
//    (mxfp8/numerics.h offsets).
//  - Warps are independent; consecutive warps take consecutive column tiles of
//    one 32-row strip. Scale padding, when the shape has any, is zeroed by a
//    cudaMemsetAsync of the scale buffer before the kernel.
//  Traffic per element (BF16 in, both directions): 2 bytes read, 2 bytes written,
//  plus 2/32 bytes of scales, i.e. ~4.06 bytes/element, the minimum.
// Dequantize: grid-stride over 16 FP8 bytes per thread (one 16-byte load, 16
// outputs stored as 16-byte vectors); a NaN result is written as the quiet NaN
// with the sign of the FP8 code, as the CPU backend does.
#include <type_traits>

#include "mxfp8/backend.h"
#include "mxfp8/numerics.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"

namespace te::mxfp8::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kRowsPerLane = 8;  // 4 row groups x 8 rows = one 32-row block
constexpr unsigned kFullMask = 0xFFFFFFFFu;

using cuda_elem::dispatch_fp8;
using cuda_elem::dispatch_input;
using cuda_elem::fp8x2;
using cuda_elem::fp8x2_to_float2;
using cuda_elem::from_float;
using cuda_elem::to_float;

// V FP8 bytes of one lane-row, packed for a V-byte store.
template <int V>
struct Bytes {
  uint32_t w[V / 4];
};

// fp8(x[j] * factor[j]) for the V elements of one lane-row.
template <bool kE5M2, class In, int V>
__device__ __forceinline__ Bytes<V> cast_row(const Vec<In, V>& x, const float (&factor)[V]) {
  Bytes<V> out;
#pragma unroll
  for (int i = 0; i < V; i += 4) {
    float y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) y[j] = __fmul_rn(to_float(x.v[i + j]), factor[i + j]);
    out.w[i / 4] = fp8x2<kE5M2>(y[0], y[1]) | (fp8x2<kE5M2>(y[2], y[3]) << 16);
  }
  return out;
}

template <bool kVec, int V>
__device__ __forceinline__ void store_bytes(uint8_t* p, const Bytes<V>& b) {
  if constexpr (kVec) {
    if constexpr (V == 8) {
      *reinterpret_cast<uint2*>(p) = make_uint2(b.w[0], b.w[1]);
    } else {
      *reinterpret_cast<uint32_t*>(p) = b.w[0];
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = static_cast<uint8_t>(b.w[i / 4] >> (8 * (i % 4)));
  }
}

// max over the lanes whose ids differ only in the bits kFirst, 2*kFirst, .., kLast.
template <int kFirst, int kLast>
__device__ __forceinline__ float butterfly_max(float v) {
#pragma unroll
  for (int m = kFirst; m <= kLast; m *= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}

// |x| maxima of a lane's elements. For BF16/FP16 they are taken on packed
// pairs with __hmax2: exact (the max is one of the values), NaN-skipping like
// fmaxf (__hmax2 returns the non-NaN operand and the accumulators start at
// +0), and without widening all 8V elements to FP32 at once (registers).
template <class In>
struct PairOf;
template <>
struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type zero() { return __float2bfloat162_rn(0.0f); }
};
template <>
struct PairOf<__half> {
  using type = __half2;
  static __device__ __forceinline__ type zero() { return __float2half2_rn(0.0f); }
};

template <class In, int V>
__device__ __forceinline__ float row_abs_max(const Vec<In, V>& x) {
  if constexpr (std::is_same_v<In, float>) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < V; ++j) m = fmaxf(m, fabsf(x.v[j]));
    return m;
  } else {
    using Pair = PairOf<In>;
    typename Pair::type m = Pair::zero();
#pragma unroll
    for (int p = 0; p < V / 2; ++p)
      m = __hmax2(m, __habs2(reinterpret_cast<const typename Pair::type*>(x.v)[p]));
    return fmaxf(__low2float(m), __high2float(m));
  }
}

// cols[j] = max over the lane's rows i of |x[i][j]|.
template <class In, int V>
__device__ __forceinline__ void column_abs_max(const Vec<In, V> (&x)[kRowsPerLane],
                                               float (&cols)[V]) {
  if constexpr (std::is_same_v<In, float>) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      cols[j] = 0.0f;
#pragma unroll
      for (int i = 0; i < kRowsPerLane; ++i) cols[j] = fmaxf(cols[j], fabsf(x[i].v[j]));
    }
  } else {
    using Pair = PairOf<In>;
#pragma unroll
    for (int p = 0; p < V / 2; ++p) {
      typename Pair::type m = Pair::zero();
#pragma unroll
      for (int i = 0; i < kRowsPerLane; ++i)
        m = __hmax2(m, __habs2(reinterpret_cast<const typename Pair::type*>(x[i].v)[p]));
      cols[2 * p] = __low2float(m);
      cols[2 * p + 1] = __high2float(m);
    }
  }
}

struct KernelArgs {
  QuantizeArgs a;
  int64_t tiles_per_strip;  // column tiles of 8V columns in a 32-row strip
  int64_t num_tiles;
  float reciprocal;  // fl32(1 / fp8_max)
};

// One lane's place in its warp tile.
struct LaneTile {
  int64_t strip;            // 32-row block index
  int64_t row0;             // first of the lane's 8 rows
  int64_t col0;             // first of its V columns
  bool first_in_row_block;  // the lane that writes a rowwise scale
  bool first_row_group;     // the lanes that write columnwise scales
  bool active;              // its columns exist (all V or none: K % 32 == 0)
};

// The three passes below end with stores only; every lane runs the shuffles.
// Each pass handles one direction completely, so only one set of scales and
// factors is live at a time (registers: no spills with both directions).

// Rowwise 1x32 blocks: per row, amax over the 32 / V lanes of the block.
template <bool kVec, bool kE5M2, class In, int V>
__device__ __forceinline__ void rowwise_pass(const Vec<In, V> (&raw)[kRowsPerLane],
                                             const QuantizeArgs& a, const LaneTile& t,
                                             float reciprocal) {
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) {
    const float amax = butterfly_max<1, kBlock / V / 2>(row_abs_max(raw[i]));
    const uint8_t e = e8m0_round_up(__fmul_rn(amax, reciprocal));
    const int64_t r = t.row0 + i;
    if (!t.active || r >= a.rows) continue;
    if (t.first_in_row_block)
      a.rowwise_scales[rowwise_scale_offset(r, t.col0 / kBlock, a.row_scale_cols, a.swizzled)] = e;
    float f[V];
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = quantize_factor(e);
    store_bytes<kVec>(a.rowwise + r * a.cols + t.col0, cast_row<kE5M2>(raw[i], f));
  }
}

// Columnwise 32x1 blocks: per column, amax over the lane's 8 rows and the 4
// row groups (lanes 8 and 16 apart).
template <bool kVec, bool kE5M2, class In, int V>
__device__ __forceinline__ void columnwise_pass(const Vec<In, V> (&raw)[kRowsPerLane],
                                                const QuantizeArgs& a, const LaneTile& t,
                                                float reciprocal) {
  float f[V];
  uint8_t e[V];
  column_abs_max(raw, f);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    e[j] = e8m0_round_up(__fmul_rn(butterfly_max<8, 16>(f[j]), reciprocal));
    f[j] = quantize_factor(e[j]);
  }
  if (!t.active) return;
  if (t.first_row_group) {
#pragma unroll
    for (int j = 0; j < V; ++j)
      a.columnwise_scales[columnwise_scale_offset(t.strip, t.col0 + j, a.col_scale_rows,
                                                  a.col_scale_cols, a.swizzled)] = e[j];
  }
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i)
    store_bytes<kVec>(a.columnwise + (t.row0 + i) * a.cols + t.col0, cast_row<kE5M2>(raw[i], f));
}

// 2-D 32x32 tiles: one amax over the block's lanes and row groups; the same
// bytes go to both directions, the scale to both layouts.
template <bool kVec, bool kE5M2, bool kRow, bool kCol, class In, int V>
__device__ __forceinline__ void tile_pass(const Vec<In, V> (&raw)[kRowsPerLane],
                                          const QuantizeArgs& a, const LaneTile& t,
                                          float reciprocal) {
  float f[V];
  column_abs_max(raw, f);
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) amax = fmaxf(amax, f[j]);
  amax = butterfly_max<8, 16>(butterfly_max<1, kBlock / V / 2>(amax));
  const uint8_t e = e8m0_round_up(__fmul_rn(amax, reciprocal));
  if (!t.active) return;
  if (kRow && t.first_in_row_block) {
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i)
      a.rowwise_scales[rowwise_scale_offset(t.row0 + i, t.col0 / kBlock, a.row_scale_cols,
                                            a.swizzled)] = e;
  }
  if (kCol && t.first_row_group) {
#pragma unroll
    for (int j = 0; j < V; ++j)
      a.columnwise_scales[columnwise_scale_offset(t.strip, t.col0 + j, a.col_scale_rows,
                                                  a.col_scale_cols, a.swizzled)] = e;
  }
#pragma unroll
  for (int j = 0; j < V; ++j) f[j] = quantize_factor(e);
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) {
    const Bytes<V> b = cast_row<kE5M2>(raw[i], f);
    const int64_t offset = (t.row0 + i) * a.cols + t.col0;
    if constexpr (kRow) store_bytes<kVec>(a.rowwise + offset, b);
    if constexpr (kCol) store_bytes<kVec>(a.columnwise + offset, b);
  }
}

// kVec: 16-byte input loads and V-byte data stores (aligned pointers). The
// element-wise fallback is a separate instantiation: in the same kernel its
// registers would cost the fast path a third of its occupancy.
template <class In, bool kE5M2, bool kRow, bool kCol, bool k2D, bool kVec>
__global__ void __launch_bounds__(kThreads, 3) quantize_kernel(const KernelArgs k) {
  constexpr int V = 16 / sizeof(In);
  const QuantizeArgs& a = k.a;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (tile >= k.num_tiles) return;  // whole warps only: shuffles stay full
  const int lane = threadIdx.x % 32, group = lane / 8, vec = lane % 8;
  LaneTile t;
  t.strip = tile / k.tiles_per_strip;
  t.row0 = t.strip * kBlock + group * kRowsPerLane;
  t.col0 = (tile % k.tiles_per_strip) * (8 * V) + vec * V;
  t.first_in_row_block = vec % (kBlock / V) == 0;
  t.first_row_group = group == 0;
  t.active = t.col0 < a.cols;

  // Eight rows of V elements, all loads issued before any is used; rows and
  // columns outside the tensor read as 0 (never stored).
  const In* in = static_cast<const In*>(a.input) + t.col0;
  Vec<In, V> raw[kRowsPerLane];
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) {
    const int64_t r = t.row0 + i;
    raw[i] = Vec<In, V>{};
    if (!t.active || r >= a.rows) continue;
    if constexpr (kVec) {
      raw[i] = load_vec<In, V>(in + r * a.cols);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) raw[i].v[j] = in[r * a.cols + j];
    }
  }
  if constexpr (k2D) {
    tile_pass<kVec, kE5M2, kRow, kCol>(raw, a, t, k.reciprocal);
  } else {
    if constexpr (kRow) rowwise_pass<kVec, kE5M2>(raw, a, t, k.reciprocal);
    if constexpr (kCol) columnwise_pass<kVec, kE5M2>(raw, a, t, k.reciprocal);
  }
}

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

// ---- host dispatch -----------------------------------------------------------

template <class In, bool kE5M2, bool kVec>
void launch_quantize(const KernelArgs& k, int64_t blocks, cudaStream_t stream) {
  const bool row = k.a.rowwise != nullptr, col = k.a.columnwise != nullptr;
  // <kRow, kCol, k2D>: one instantiation per requested combination.
  auto go = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(k);
    TE_CHECK_LAUNCH();
  };
  if (k.a.use_2d_blocks) {
    if (row && col)
      go(quantize_kernel<In, kE5M2, true, true, true, kVec>);
    else if (row)
      go(quantize_kernel<In, kE5M2, true, false, true, kVec>);
    else
      go(quantize_kernel<In, kE5M2, false, true, true, kVec>);
  } else {
    if (row && col)
      go(quantize_kernel<In, kE5M2, true, true, false, kVec>);
    else if (row)
      go(quantize_kernel<In, kE5M2, true, false, false, kVec>);
    else
      go(quantize_kernel<In, kE5M2, false, true, false, kVec>);
  }
}

// Zeroes a scale buffer that has padding (the kernel writes every real scale).
void zero_padding(uint8_t* scales, int64_t scale_rows, int64_t scale_cols, int64_t real,
                  cudaStream_t stream) {
  if (scales != nullptr && scale_rows * scale_cols != real)
    TE_CHECK_CUDA(cudaMemsetAsync(scales, 0, scale_rows * scale_cols, stream));
}

}  // namespace

void quantize(const QuantizeArgs& a, te_stream stream) {
  const cudaStream_t s = cuda_stream(stream);
  zero_padding(a.rowwise_scales, a.row_scale_rows, a.row_scale_cols, a.rows * (a.cols / kBlock), s);
  zero_padding(a.columnwise_scales, a.col_scale_rows, a.col_scale_cols, (a.rows / kBlock) * a.cols,
               s);
  if (a.rows == 0 || a.cols == 0) return;
  auto launch = [&](auto in_tag, auto e5m2) {
    using In = decltype(in_tag);
    constexpr int V = 16 / sizeof(In);
    constexpr bool kE5M2 = decltype(e5m2)::value;
    KernelArgs k{a, ceil_div(a.cols, 8 * V), 0, kE5M2 ? kE5M2MaxReciprocal : kE4M3MaxReciprocal};
    k.num_tiles = ceil_div(a.rows, kBlock) * k.tiles_per_strip;
    const int64_t blocks = ceil_div(k.num_tiles, kWarpsPerBlock);
    const bool vectorized = is_aligned(a.input, 16) &&
                            (a.rowwise == nullptr || is_aligned(a.rowwise, V)) &&
                            (a.columnwise == nullptr || is_aligned(a.columnwise, V));
    if (vectorized) {
      launch_quantize<In, kE5M2, true>(k, blocks, s);
    } else {
      launch_quantize<In, kE5M2, false>(k, blocks, s);
    }
  };
  dispatch_input(a.input_dtype, [&](auto in_tag) {
    dispatch_fp8(a.fp8_dtype, [&](auto e5m2) { launch(in_tag, e5m2); });
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
