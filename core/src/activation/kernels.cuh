// Kernels of the activation family's CUDA backend (cuda_kind.cuh instantiates
// them, one translation unit per kind; cuda.cu dispatches). The values come from the formulas of
// functions.h (_rn arithmetic, the core's own exp, canonical NaN) and the
// conversions of runtime/cuda_elem.cuh, so every byte equals the CPU's.
//
//  rowwise_kernel  outputs without a columnwise copy. A thread owns one column
//                  vector (16 bytes of input: 8 BF16/FP16 or 4 FP32 values; one
//                  element when the rows are not 16-byte aligned) of R
//                  consecutive rows and walks them in order: loads (grad,) a
//                  (, b), computes, stores the output vector (FP32/BF16/FP16 or
//                  FP8 bytes). In the backward with dbias R = 64 (one chunk of
//                  the bias-gradient order) and the thread also forms that
//                  order's sums: rows in groups of 4, groups added in order,
//                  one FP32 partial per chunk and column into the workspace.
//                  Traffic: each input and output byte once.
//  tile_kernel     an FP8 columnwise copy (with or without rowwise FP8): the
//                  128 x 64 tiles of transpose/tile.cuh. Each thread computes
//                  4 rows x 8 columns of every output half, stores its rowwise
//                  bytes, stages them transposed in shared memory, and the
//                  block writes the columnwise rows with 16-byte stores. With
//                  dbias the threads' 4-row group sums go through shared
//                  memory and 128 threads add the 16 groups of each 64-row
//                  chunk in order. The fused backward
//                  (te_activation_bwd_with_fwd_columnwise) always takes it:
//                  the same threads also compute the forward values of their
//                  4 x 8 elements from the (a, b) already in registers,
//                  quantize them with the forward's scale and stage them in a
//                  third (plain kinds: second) shared tile for the forward
//                  output's columnwise rows; its result rows may then be
//                  high precision too (no columnwise copy of their own).
//  dbias_kernel    dbias[j] = the chunk partials of column j added in order.
// No host synchronization and no allocation anywhere (CUDA-graph safe).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "activation/backend.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"
#include "transpose/tile.cuh"

namespace te::activation::cuda {

constexpr int kThreads = 256;
constexpr int kGroupRows = kDbiasGroupRows;
static_assert(kDbiasChunkRows % kGroupRows == 0 && tile::kTileM % kDbiasChunkRows == 0,
              "tiles and thread runs must hold whole dbias groups and chunks");

// Output tag of FP8 bytes (the format, E4M3 or E5M2, is a run-time flag).
struct Fp8Bytes {};

template <class Out>
using Storage = std::conditional_t<std::is_same_v<Out, Fp8Bytes>, uint8_t, Out>;

template <class In>
struct Inputs {
  const In* input;  // [rows, in_cols]
  const In* grad;   // [rows, cols], backward only
  int64_t rows;
  int64_t cols;      // H: the forward output's / grad's width
  int64_t in_cols;   // 2H (gated) or H
  int64_t out_cols;  // width of the result: cols (forward) or in_cols (backward)
};

struct Outputs {
  void* rowwise;        // [rows, out_cols] or null (tile_kernel only)
  uint8_t* columnwise;  // FP8 [out_cols, rows] or null
  const float* scale;   // FP8 outputs only
  float* scale_inv;     // may be null
  float* amax;          // may be null
  bool e5m2;
  float* partial;  // dbias partials [chunks, out_cols], or null
  // The forward output's columnwise copy of the fused backward (tile_kernel):
  // FP8 [cols, rows] quantized with fwd_scale, or null.
  uint8_t* fwd_columnwise;
  const float* fwd_scale;
  float* fwd_scale_inv;  // may be null
  bool fwd_e5m2;
  te_dtype fwd_values_dtype;  // the values are rounded to it (FP32: unchanged) before quantizing
};

__device__ __forceinline__ uint32_t fp8_pair(float lo, float hi, bool e5m2) {
  return e5m2 ? cuda_elem::fp8x2<true>(lo, hi) : cuda_elem::fp8x2<false>(lo, hi);
}

// Four values (already scaled) -> four FP8 bytes, v[0] in byte 0.
__device__ __forceinline__ uint32_t fp8_quad(const float* v, bool e5m2) {
  return e5m2 ? cuda_elem::fp8x4<true>(v[0], v[1], v[2], v[3])
              : cuda_elem::fp8x4<false>(v[0], v[1], v[2], v[3]);
}

// W values to row elements [offset, offset + W) of an output of type Out.
template <class Out, int W>
__device__ __forceinline__ void store_values(void* base, int64_t offset, const float (&v)[W],
                                             float scale, bool e5m2) {
  Storage<Out>* dst = static_cast<Storage<Out>*>(base) + offset;
  if constexpr (std::is_same_v<Out, Fp8Bytes>) {
    if constexpr (W == 1) {
      *dst = static_cast<uint8_t>(fp8_pair(__fmul_rn(v[0], scale), 0.0f, e5m2));
    } else {
      static_assert(W % 4 == 0, "vectors of 4 or 8 values");
      Vec<uint32_t, W / 4> q;
#pragma unroll
      for (int i = 0; i < W; i += 4) {
        const float scaled[4] = {__fmul_rn(v[i], scale), __fmul_rn(v[i + 1], scale),
                                 __fmul_rn(v[i + 2], scale), __fmul_rn(v[i + 3], scale)};
        q.v[i / 4] = fp8_quad(scaled, e5m2);
      }
      store_vec(reinterpret_cast<uint32_t*>(dst), q);
    }
  } else if constexpr (W == 1) {
    *dst = cuda_elem::from_float<Out>(v[0]);
  } else if constexpr (std::is_same_v<Out, float>) {
    Vec<float, W> o;
#pragma unroll
    for (int i = 0; i < W; ++i) o.v[i] = v[i];
    store_vec(dst, o);
  } else {
    // BF16/FP16, two at a time with the hardware's RNE conversion. Our NaN is
    // the canonical positive one, which numerics.h writes as 0x7FFF in both
    // types: patched explicitly, so the bytes do not depend on the hardware's NaN.
    Vec<uint16_t, W> o;
#pragma unroll
    for (int i = 0; i < W; i += 2) {
      uint32_t pair;
      if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[i], v[i + 1]);
        pair = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(v[i], v[i + 1]);
        pair = *reinterpret_cast<const uint32_t*>(&h);
      }
      o.v[i] = v[i] != v[i] ? uint16_t{0x7FFF} : static_cast<uint16_t>(pair);
      o.v[i + 1] = v[i + 1] != v[i + 1] ? uint16_t{0x7FFF} : static_cast<uint16_t>(pair >> 16);
    }
    store_vec(reinterpret_cast<uint16_t*>(dst), o);
  }
}

// v as an output of a run-time type stores it (FP32: v), widened back.
__device__ __forceinline__ float round_to(float v, te_dtype dtype) {
  if (dtype == TE_DTYPE_BFLOAT16) return cuda_elem::round_through<__nv_bfloat16>(v);
  if (dtype == TE_DTYPE_FLOAT16) return cuda_elem::round_through<__half>(v);
  return v;
}

// 8 values -> 8 FP8 bytes.
__device__ __forceinline__ uint2 pack8(const float (&v)[8], float scale, bool e5m2) {
  float scaled[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) scaled[i] = __fmul_rn(v[i], scale);
  return make_uint2(fp8_quad(scaled, e5m2), fp8_quad(scaled + 4, e5m2));
}

// W input elements kept as they were loaded, in 32-bit words: copies are then
// whole-register moves (16-bit elements in registers of their own would need a
// byte permute for every copy of the prefetched row).
template <class In, int W>
struct Raw {
  static constexpr int kWords = (W * static_cast<int>(sizeof(In)) + 3) / 4;
  uint32_t w[kWords];

  // Element i widened to FP32 (exactly, as cuda_elem::to_float).
  __device__ __forceinline__ float get(int i) const {
    if constexpr (sizeof(In) == 4) {
      return __uint_as_float(w[i]);
    } else {
      const uint32_t word = w[i / 2];
      const uint16_t bits = static_cast<uint16_t>(i % 2 ? word >> 16 : word);
      if constexpr (std::is_same_v<In, __nv_bfloat16>) {
        return __uint_as_float(static_cast<uint32_t>(bits) << 16);
      } else {
        return __half2float(__ushort_as_half(bits));
      }
    }
  }

  // Element i set from memory (the guarded, element-wise loads).
  __device__ __forceinline__ void set(int i, const In* p) {
    if constexpr (sizeof(In) == 4) {
      w[i] = *reinterpret_cast<const uint32_t*>(p);
    } else {
      const uint32_t bits = *reinterpret_cast<const uint16_t*>(p);
      w[i / 2] = i % 2 ? (w[i / 2] & 0xFFFFu) | (bits << 16) : (w[i / 2] & 0xFFFF0000u) | bits;
    }
  }
};

template <class In, int W>
__device__ __forceinline__ Raw<In, W> load_raw(const In* p) {
  Raw<In, W> r;
  if constexpr (Raw<In, W>::kWords * 4 == W * static_cast<int>(sizeof(In))) {
    const Vec<uint32_t, Raw<In, W>::kWords> v =
        load_vec<uint32_t, Raw<In, W>::kWords>(reinterpret_cast<const uint32_t*>(p));
#pragma unroll
    for (int i = 0; i < Raw<In, W>::kWords; ++i) r.w[i] = v.v[i];
  } else {  // one 16-bit element
    r.w[0] = 0;
    r.set(0, p);
  }
  return r;
}

// The raw input elements of one row of a thread's run or tile: a, and b and grad
// where the kind and direction use them.
template <class In, int W>
struct RawRow {
  Raw<In, W> a, b, g;
};

// The values of one element: forward (parts = 1) or backward (parts 1 or 2:
// the a and b halves of a gated kind).
template <te_activation K, bool kBwd>
struct Element {
  static constexpr bool kGated = Kind<K>::gated;
  static constexpr int kParts = (kBwd && kGated) ? 2 : 1;

  __device__ __forceinline__ static void compute(float g, float a, float b, const Params& p,
                                                 float (&d)[kParts]) {
    if constexpr (kBwd) {
      const GradPair gp = backward_value<K>(g, a, b, p);
      d[0] = gp.da;
      if constexpr (kParts == 2) d[1] = gp.db;
    } else {
      d[0] = forward_value<K>(a, b, p);
    }
  }

  // The W elements of a raw row: their values d per part, amax and, in the
  // backward, the running 4-row group sums.
  template <class In, int W>
  __device__ __forceinline__ static void compute_row(const RawRow<In, W>& v, const Params& p,
                                                     float (&d)[kParts][W], float& amax,
                                                     float (&group)[kParts][W]) {
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float a = v.a.get(i);
      const float b = kGated ? v.b.get(i) : 0.0f;
      const float g = kBwd ? v.g.get(i) : 0.0f;
      float e[kParts];
      compute(g, a, b, p, e);
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
        d[part][i] = e[part];
        amax = fmaxf(amax, fabsf(e[part]));
        if constexpr (kBwd) group[part][i] = add(group[part][i], e[part]);
      }
    }
  }
};

// amax (block max, one atomic per block) and scale_inv (block 0).
__device__ __forceinline__ void finish(const Outputs& out, float amax, float scale) {
  if (out.amax != nullptr) {  // uniform over the grid
    amax = block_max(amax);
    if (threadIdx.x == 0) atomic_fmax(out.amax, amax);
  }
  if (out.scale_inv != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    *out.scale_inv = __fdiv_rn(1.0f, scale);
}

// ---- rowwise ----------------------------------------------------------------

struct RowwiseShape {
  int64_t rows_per_thread;  // R: a multiple of 4; 64 when out.partial is set
  int64_t vectors_per_row;
  int64_t threads;  // ceil(rows / R) * vectors_per_row
  bool vectorized;  // W = 16 / sizeof(In), else W = 1
};

template <bool kGated, bool kBwd, class In, int W>
__device__ __forceinline__ RawRow<In, W> load_row(const Inputs<In>& in, int64_t r, int64_t j) {
  RawRow<In, W> row;
  row.a = load_raw<In, W>(in.input + r * in.in_cols + j);
  if constexpr (kGated) row.b = load_raw<In, W>(in.input + r * in.in_cols + in.cols + j);
  if constexpr (kBwd) row.g = load_raw<In, W>(in.grad + r * in.cols + j);
  return row;
}

// One thread's run: rows [t R, t R + R) of the W columns starting at j, in
// order, with the next row's loads issued before the current row's math.
template <te_activation K, bool kBwd, class In, class Out, int W>
__device__ __forceinline__ float rowwise_run(const Inputs<In>& in, const Outputs& out,
                                             const Params& p, float scale, int64_t t, int64_t j,
                                             int64_t rows_per_thread) {
  using E = Element<K, kBwd>;
  constexpr int kParts = E::kParts;
  const int64_t first = t * rows_per_thread;
  const int64_t end = in.rows < first + rows_per_thread ? in.rows : first + rows_per_thread;
  float amax = 0.0f;
  float chunk[kParts][W] = {};  // backward: this run's (one chunk's) sums
  float group[kParts][W] = {};  // backward: the current 4-row group's sums
  RawRow<In, W> next = load_row<E::kGated, kBwd, In, W>(in, first, j);  // first < end
  for (int64_t r = first; r < end; ++r) {
    const RawRow<In, W> cur = next;
    if (r + 1 < end) next = load_row<E::kGated, kBwd, In, W>(in, r + 1, j);
    float d[kParts][W];
    E::compute_row(cur, p, d, amax, group);
#pragma unroll
    for (int part = 0; part < kParts; ++part)
      store_values<Out, W>(out.rowwise, r * in.out_cols + part * in.cols + j, d[part], scale,
                           out.e5m2);
    if constexpr (kBwd) {
      if (r % kGroupRows == kGroupRows - 1 || r + 1 == end) {  // the group is complete
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
#pragma unroll
          for (int i = 0; i < W; ++i) {
            chunk[part][i] = add(chunk[part][i], group[part][i]);
            group[part][i] = 0.0f;
          }
        }
      }
    }
  }
  if (kBwd && out.partial != nullptr) {
#pragma unroll
    for (int part = 0; part < kParts; ++part)
#pragma unroll
      for (int i = 0; i < W; ++i)
        out.partial[t * in.out_cols + part * in.cols + j + i] = chunk[part][i];
  }
  return amax;
}

// Register caps: without a minimum of blocks per SM ptxas picks its own cap
// and may spill; 3 blocks (85 registers) for the forward, 2 (128) for the
// backward keep every kernel spill-free with enough threads resident.
template <te_activation K, bool kBwd, class In, class Out>
__global__ void __launch_bounds__(kThreads, kBwd ? 2 : 3)
    rowwise_kernel(const Inputs<In> in, const Outputs out, const Params p, const RowwiseShape s) {
  constexpr int N = 16 / sizeof(In);
  const float scale = std::is_same_v<Out, Fp8Bytes> ? *out.scale : 1.0f;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  float amax = 0.0f;
  if (thread < s.threads) {
    const int64_t t = thread / s.vectors_per_row, v = thread % s.vectors_per_row;
    amax = s.vectorized
               ? rowwise_run<K, kBwd, In, Out, N>(in, out, p, scale, t, v * N, s.rows_per_thread)
               : rowwise_run<K, kBwd, In, Out, 1>(in, out, p, scale, t, v, s.rows_per_thread);
  }
  // A high-precision output's amax is that of its stored values (te::stored_amax).
  if constexpr (!std::is_same_v<Out, Fp8Bytes>) amax = cuda_elem::round_through<Out>(amax);
  finish(out, amax, scale);
}

// ---- tiled, with the columnwise copy ------------------------------------------

struct TileShape {
  int64_t tiles_k;   // tiles along the H columns
  bool vector_rows;  // H % 8 == 0 and the rows' pointers aligned for 8-element loads and stores
  int column_store_bytes;      // tile::column_store_width of out.columnwise
  int fwd_column_store_bytes;  // and of out.fwd_columnwise
};

// Row r, columns col .. col+7 of the inputs with element loads: 0 outside the matrix.
template <bool kGated, bool kBwd, class In>
__device__ __forceinline__ RawRow<In, 8> load_row_guarded(const Inputs<In>& in, int64_t r,
                                                          int64_t col) {
  RawRow<In, 8> v{};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (r >= in.rows || col + j >= in.cols) continue;
    v.a.set(j, in.input + r * in.in_cols + col + j);
    if constexpr (kGated) v.b.set(j, in.input + r * in.in_cols + in.cols + col + j);
    if constexpr (kBwd) v.g.set(j, in.grad + r * in.cols + col + j);
  }
  return v;
}

// 8 rowwise values of row r at columns col .. col+7 (of a [rows, out_cols]
// output of type Out whose part starts at element `part_offset`): FP8 bytes q,
// or the values d rounded to Out. The guarded path skips what is outside.
template <class Out, class In>
__device__ __forceinline__ void store_row8(void* rowwise, int64_t part_offset, const Inputs<In>& in,
                                           int64_t r, int64_t col, bool vector_path, uint2 q,
                                           const float (&d)[8]) {
  const int64_t offset = part_offset + r * in.out_cols + col;
  if constexpr (std::is_same_v<Out, Fp8Bytes>) {
    uint8_t* dst = static_cast<uint8_t*>(rowwise) + offset;
    if (vector_path) {
      *reinterpret_cast<uint2*>(dst) = q;
      return;
    }
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&q);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (r < in.rows && col + j < in.cols) dst[j] = bytes[j];
  } else {
    if (vector_path) {
      store_values<Out, 8>(rowwise, offset, d, 1.0f, false);
      return;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (r < in.rows && col + j < in.cols)
        static_cast<Out*>(rowwise)[offset + j] = cuda_elem::from_float<Out>(d[j]);
  }
}

// After the tile's group sums are in shared memory: the 16 groups of each
// 64-row chunk added in order, one partial per chunk, part and column.
template <int kParts, class In, class GroupSums>
__device__ __forceinline__ void chunk_sums(const GroupSums& group_sums, const Inputs<In>& in,
                                           float* partial, int64_t m0, int64_t k0) {
  constexpr int kChunks = tile::kTileM / kDbiasChunkRows;
  constexpr int kGroups = kDbiasChunkRows / kGroupRows;
  for (int idx = threadIdx.x; idx < kParts * kChunks * tile::kTileK; idx += tile::kThreads) {
    const int part = idx / (kChunks * tile::kTileK);
    const int chunk = idx / tile::kTileK % kChunks, col = idx % tile::kTileK;
    const int64_t first_row = m0 + chunk * kDbiasChunkRows;
    if (first_row >= in.rows || k0 + col >= in.cols) continue;
    float sum = 0.0f;
    for (int grp = 0; grp < kGroups; ++grp)
      sum = add(sum, group_sums[part][chunk * kGroups + grp][col]);
    partial[(first_row / kDbiasChunkRows) * in.out_cols + part * in.cols + k0 + col] = sum;
  }
}

// Out: the rowwise output's type (Fp8Bytes, or a high-precision type in the
// fused backward below). kFwdCol (backward only): the same pass also computes
// the forward values f(a) * lin(b) (or f(x)) of the tile, quantizes them with
// out.fwd_scale and writes the forward output's columnwise copy.
template <te_activation K, bool kBwd, class In, class Out, bool kFwdCol>
__global__ void __launch_bounds__(tile::kThreads, 2)
    tile_kernel(const Inputs<In> in, const Outputs out, const Params p, const TileShape s) {
  static_assert(kBwd || !kFwdCol, "the forward columnwise copy is fused into the backward");
  using E = Element<K, kBwd>;
  constexpr int kParts = E::kParts;
  constexpr bool kFp8Out = std::is_same_v<Out, Fp8Bytes>;
  constexpr int kSumParts = kBwd ? kParts : 1;  // group sums are only formed in the backward
  // The staged columnwise bytes: the result's parts, then the forward output's.
  __shared__ alignas(16) uint8_t staged[kParts + (kFwdCol ? 1 : 0)][tile::kTileK * tile::kTileM];
  // The backward's 4-row group sums, [part][group of the tile][column] (padded rows).
  __shared__ alignas(
      16) float group_sums[kSumParts][kBwd ? tile::kTileM / kGroupRows : 1][tile::kTileK + 4];

  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) / s.tiles_k) * tile::kTileM;
  const int64_t k0 = (static_cast<int64_t>(blockIdx.x) % s.tiles_k) * tile::kTileK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp * 4 + lane / 8;  // this thread's rows: 4*rg .. 4*rg+3 of the tile
  const int c = (lane % 8) * 8;        // its columns: c .. c+7
  const int64_t row = m0 + 4 * rg;
  const bool full = m0 + tile::kTileM <= in.rows && k0 + tile::kTileK <= in.cols;
  const bool vector_path = full && s.vector_rows;

  float amax = 0.0f;
  float group[kParts][8] = {};  // backward: this thread's 4-row group sums
  uint2 q[kParts][4];           // the FP8 bytes of its 4 rows x 8 columns, per part
  uint2 fq[4];                  // kFwdCol: the forward values' FP8 bytes
  float scale = 1.0f, fwd_scale = 1.0f;
  auto compute_row = [&](int i, const RawRow<In, 8>& v) {
    float d[kParts][8];
    E::compute_row(v, p, d, amax, group);  // elements outside the matrix give 0
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      uint2 bytes = make_uint2(0, 0);
      if constexpr (kFp8Out) bytes = q[part][i] = pack8(d[part], scale, out.e5m2);
      if (out.rowwise != nullptr)
        store_row8<Out>(out.rowwise, part * in.cols, in, row + i, k0 + c, vector_path, bytes,
                        d[part]);
    }
    if constexpr (kFwdCol) {
      float f[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float value = forward_value<K>(v.a.get(j), E::kGated ? v.b.get(j) : 0.0f, p);
        f[j] = round_to(value, out.fwd_values_dtype);
      }
      fq[i] = pack8(f, fwd_scale, out.fwd_e5m2);
    }
  };
  // The scales are global loads of their own: issued after the tile's loads.
  // (An empty result has no rowwise pointer: the fused backward then runs the
  // FP8 instance for a high-precision result too, which has no scale.)
  auto load_scales = [&] {
    if constexpr (kFp8Out) {
      if (out.scale != nullptr) scale = *out.scale;
    }
    if constexpr (kFwdCol) fwd_scale = *out.fwd_scale;
  };
  if (vector_path) {
    // The loads of kBatch rows at a time, then their math. The fused backward
    // with FP32 inputs (96 registers of loads for 4 rows of a gated kind, and
    // the forward values on top) takes 2 rows at a time to stay spill-free.
    constexpr int kBatch = (kFwdCol && sizeof(In) == 4) ? 2 : 4;
#pragma unroll
    for (int i0 = 0; i0 < 4; i0 += kBatch) {
      RawRow<In, 8> v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        v[i] = load_row<E::kGated, kBwd, In, 8>(in, row + i0 + i, k0 + c);
      if (i0 == 0) load_scales();
#pragma unroll
      for (int i = 0; i < kBatch; ++i) compute_row(i0 + i, v[i]);
    }
  } else {
    // Ragged or unaligned tiles: element loads, row by row, zeros outside.
    load_scales();
#pragma unroll
    for (int i = 0; i < 4; ++i)
      compute_row(i, load_row_guarded<E::kGated, kBwd>(in, row + i, k0 + c));
  }

  // (out.columnwise is uniform over the grid; a high-precision result has none)
  if constexpr (kFp8Out) {
    if (out.columnwise != nullptr) {
#pragma unroll
      for (int part = 0; part < kParts; ++part) tile::stage_columns(q[part], rg, c, staged[part]);
    }
  }
  if constexpr (kFwdCol) tile::stage_columns(fq, rg, c, staged[kParts]);
  if constexpr (kBwd) {
    if (out.partial != nullptr) {  // uniform over the grid
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
        float4* dst = reinterpret_cast<float4*>(&group_sums[part][rg][c]);
        dst[0] = make_float4(group[part][0], group[part][1], group[part][2], group[part][3]);
        dst[1] = make_float4(group[part][4], group[part][5], group[part][6], group[part][7]);
      }
    }
  }
  __syncthreads();

  if constexpr (kFp8Out) {
    if (out.columnwise != nullptr) {
#pragma unroll
      for (int part = 0; part < kParts; ++part)
        tile::store_columns(staged[part], out.columnwise + part * in.cols * in.rows, in.rows,
                            in.cols, m0, k0, full, s.column_store_bytes);
    }
  }
  if constexpr (kFwdCol) {
    tile::store_columns(staged[kParts], out.fwd_columnwise, in.rows, in.cols, m0, k0, full,
                        s.fwd_column_store_bytes);
    if (blockIdx.x == 0 && threadIdx.x == 0 && out.fwd_scale_inv != nullptr)
      *out.fwd_scale_inv = __fdiv_rn(1.0f, fwd_scale);
  }
  if constexpr (kBwd) {
    if (out.partial != nullptr) chunk_sums<kParts>(group_sums, in, out.partial, m0, k0);
  }
  // A high-precision result's amax is that of its stored values (te::stored_amax).
  if constexpr (!kFp8Out) amax = cuda_elem::round_through<Out>(amax);
  finish(out, amax, scale);
}

// ---- the bias gradient's last stage -----------------------------------------

template <class Out>
__global__ void __launch_bounds__(kThreads)
    dbias_kernel(const float* __restrict__ partial, int64_t chunks, int64_t cols, Out* dbias) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= cols) return;
  float sum = 0.0f;
#pragma unroll 8
  for (int64_t t = 0; t < chunks; ++t) sum = add(sum, partial[t * cols + j]);  // loads run ahead
  dbias[j] = cuda_elem::from_float<Out>(canonical(sum));
}

// ---- host side ----------------------------------------------------------------

inline Outputs make_outputs(const OutputArgs& o, float* partial, const OutputArgs* fwd = nullptr,
                            te_dtype fwd_values_dtype = TE_DTYPE_FLOAT32) {
  Outputs out{
      o.rowwise, o.columnwise, o.scale, o.scale_inv, o.amax, o.fp8_dtype == TE_DTYPE_FLOAT8E5M2,
      partial,   nullptr,      nullptr, nullptr,     false,  fwd_values_dtype};
  // (Keyed on the scale, which the fused call always has: an empty input's
  // columnwise buffer may have no data pointer, yet fwd_scale_inv is written.)
  if (fwd != nullptr && fwd->scale != nullptr) {
    out.fwd_columnwise = fwd->columnwise;
    out.fwd_scale = fwd->scale;
    out.fwd_scale_inv = fwd->scale_inv;
    out.fwd_e5m2 = fwd->fp8_dtype == TE_DTYPE_FLOAT8E5M2;
  }
  return out;
}

// Calls f(Out{}) with the output tag of a rowwise dtype.
template <class F>
void dispatch_output(te_dtype dtype, F&& f) {
  if (is_fp8(dtype)) {
    f(Fp8Bytes{});
  } else {
    cuda_elem::dispatch_input(dtype, f);
  }
}

template <te_activation K, bool kBwd, class In, class Out>
void launch_rowwise(const Inputs<In>& in, const Outputs& out, const Params& p,
                    cudaStream_t stream) {
  constexpr int N = 16 / sizeof(In);
  RowwiseShape s{};
  s.vectorized = in.cols % N == 0 && is_aligned(in.input, 16) &&
                 (!kBwd || is_aligned(in.grad, 16)) &&
                 is_aligned(out.rowwise, alignof(Vec<Storage<Out>, N>));
  s.vectors_per_row = s.vectorized ? in.cols / N : in.cols;
  // Runs of 64 rows when they carry the bias-gradient sums; otherwise shorter
  // runs while that gives too few threads for two full waves.
  const int64_t wanted = 2 * static_cast<int64_t>(cuda_sm_count()) * 2048;
  s.rows_per_thread = kDbiasChunkRows;
  while (out.partial == nullptr && s.rows_per_thread > kGroupRows &&
         ceil_div(in.rows, s.rows_per_thread) * s.vectors_per_row < wanted)
    s.rows_per_thread /= 2;
  s.threads = ceil_div(in.rows, s.rows_per_thread) * s.vectors_per_row;
  const int64_t blocks =
      s.threads > 0 ? ceil_div(s.threads, kThreads) : 1;  // block 0 writes scale_inv
  rowwise_kernel<K, kBwd, In, Out><<<blocks, kThreads, 0, stream>>>(in, out, p, s);
  TE_CHECK_LAUNCH();
}

template <te_activation K, bool kBwd, class In, class Out, bool kFwdCol>
void launch_tile(const Inputs<In>& in, const Outputs& out, const Params& p, cudaStream_t stream) {
  TileShape s{};
  s.tiles_k = in.cols > tile::kTileK ? ceil_div(in.cols, tile::kTileK) : 1;
  s.vector_rows =
      in.cols % 8 == 0 && is_aligned(in.input, 16) && (!kBwd || is_aligned(in.grad, 16)) &&
      (out.rowwise == nullptr || is_aligned(out.rowwise, alignof(Vec<Storage<Out>, 8>)));
  s.column_store_bytes = tile::column_store_width(in.rows, out.columnwise);
  s.fwd_column_store_bytes = tile::column_store_width(in.rows, out.fwd_columnwise);
  tile_kernel<K, kBwd, In, Out, kFwdCol>
      <<<tile::num_tiles(in.rows, in.cols), tile::kThreads, 0, stream>>>(in, out, p, s);
  TE_CHECK_LAUNCH();
}

// The kernel for these outputs: tiled with a columnwise copy (of the result,
// or, fused into the backward, of the forward output), else rowwise.
template <te_activation K, bool kBwd, class In>
void launch(const Inputs<In>& in, const Outputs& out, te_dtype rowwise_dtype, const Params& p,
            cudaStream_t stream) {
  if constexpr (kBwd) {
    if (out.fwd_scale != nullptr) {
      // Any result type: the tile kernel also writes high-precision rows.
      const te_dtype dtype = out.rowwise == nullptr ? TE_DTYPE_FLOAT8E4M3 : rowwise_dtype;
      dispatch_output(dtype, [&](auto out_tag) {
        launch_tile<K, true, In, decltype(out_tag), true>(in, out, p, stream);
      });
      return;
    }
  }
  if (out.columnwise != nullptr) {
    launch_tile<K, kBwd, In, Fp8Bytes, false>(in, out, p, stream);
    return;
  }
  dispatch_output(rowwise_dtype, [&](auto out_tag) {
    launch_rowwise<K, kBwd, In, decltype(out_tag)>(in, out, p, stream);
  });
}

}  // namespace te::activation::cuda
