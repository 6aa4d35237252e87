// Device helpers shared by the two MXFP8 quantize kernels (quantize_warp.cuh,
// quantize_tile.cuh): block maxima over lanes and rows, and the FP8 cast of a
// lane's 16-byte vector. te/mxfp8.h states the formulas.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "mxfp8/backend.h"
#include "mxfp8/numerics.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_utils.cuh"

namespace te::mxfp8::cuda {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

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
    for (int j = 0; j < 4; ++j) y[j] = __fmul_rn(cuda_elem::to_float(x.v[i + j]), factor[i + j]);
    out.w[i / 4] = cuda_elem::fp8x4<kE5M2>(y[0], y[1], y[2], y[3]);
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

// max over the lanes whose ids differ only in the bits kFirst, 2*kFirst, .., kLast
// (none when kFirst > kLast).
template <int kFirst, int kLast>
__device__ __forceinline__ float butterfly_max(float v) {
#pragma unroll
  for (int m = kFirst; m <= kLast; m *= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}

// |x| maxima. For BF16/FP16 they are taken on packed pairs with __hmax2: exact
// (the max is one of the values), NaN-skipping like fmaxf (__hmax2 returns the
// non-NaN operand and the accumulators start at +0), and without widening
// every element to FP32 (registers).
template <class In>
struct PairOf;
template <>
struct PairOf<float> {  // unused: FP32 maxima are plain floats (named for ColumnMax's alias)
  using type = float;
};
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

// Running column maxima of V elements: cols[j] = max(cols[j], |x[j]|), kept
// as V floats (FP32) or V / 2 packed pairs (BF16/FP16).
template <class In, int V>
struct ColumnMax {
  static constexpr bool kFloat = std::is_same_v<In, float>;
  using Pair = typename PairOf<In>::type;
  Pair m[kFloat ? V : V / 2];

  __device__ __forceinline__ ColumnMax() {
#pragma unroll
    for (auto& p : m) {
      if constexpr (kFloat) {
        p = 0.0f;
      } else {
        p = PairOf<In>::zero();
      }
    }
  }
  __device__ __forceinline__ void add(const Vec<In, V>& x) {
    if constexpr (kFloat) {
#pragma unroll
      for (int j = 0; j < V; ++j) m[j] = fmaxf(m[j], fabsf(x.v[j]));
    } else {
#pragma unroll
      for (int p = 0; p < V / 2; ++p)
        m[p] = __hmax2(m[p], __habs2(reinterpret_cast<const Pair*>(x.v)[p]));
    }
  }
  __device__ __forceinline__ void get(float (&cols)[V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if constexpr (kFloat) {
        cols[j] = m[j];
      } else {
        cols[j] = j % 2 ? __high2float(m[j / 2]) : __low2float(m[j / 2]);
      }
    }
  }
  // max over the V columns; pairs are reduced packed first (exact: no NaN in m).
  __device__ __forceinline__ float all() const {
    Pair p = m[0];
#pragma unroll
    for (int i = 1; i < static_cast<int>(sizeof(m) / sizeof(m[0])); ++i) {
      if constexpr (kFloat) {
        p = fmaxf(p, m[i]);
      } else {
        p = __hmax2(p, m[i]);
      }
    }
    if constexpr (kFloat) {
      return p;
    } else {
      return fmaxf(__low2float(p), __high2float(p));
    }
  }
};

// max |x[j]| over one lane-row.
template <class In, int V>
__device__ __forceinline__ float row_abs_max(const Vec<In, V>& x) {
  ColumnMax<In, V> m;
  m.add(x);
  return m.all();
}

// Host: f(kRow, kCol, k2D) as std::bool_constant values for the directions
// and block kind `a` asks for, so that each combination is one kernel
// instantiation.
template <class F>
void dispatch_directions(const QuantizeArgs& a, F&& f) {
  const bool row = a.rowwise != nullptr, col = a.columnwise != nullptr;
  auto with = [&](auto two_d) {
    if (row && col) {
      f(std::true_type{}, std::true_type{}, two_d);
    } else if (row) {
      f(std::true_type{}, std::false_type{}, two_d);
    } else {
      f(std::false_type{}, std::true_type{}, two_d);
    }
  };
  if (a.use_2d_blocks) {
    with(std::true_type{});
  } else {
    with(std::false_type{});
  }
}

}  // namespace te::mxfp8::cuda
