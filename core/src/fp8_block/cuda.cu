// CUDA quantize of the FP8-block family (te/fp8_block.h), byte-identical to
// cpu.cpp. (Dequantize and the 2-D transpose are in cuda_dequantize.cu.)
//
// One CTA per 128x128 tile of the [M, K] input, one pass over it; both outputs
// come from the same registers. Each thread loads one 16-byte vector from each
// of 8 consecutive rows: 8 x 8 elements for BF16/FP16 (256 threads a tile),
// 8 x 4 for FP32 (512 threads), 32 registers of input either way. All 8 loads
// are issued before any arithmetic. Elements past the tensor's edge load as 0:
// they never raise an amax and are never stored, so a cut block uses only its
// valid elements (K % 16 == 0: a vector is all in or all out).
//
//  - Maxima: one pass gives the thread's 8 row maxima and its column maxima
//    over the 8 rows. BF16/FP16 words stay packed: |x| by clearing the sign
//    bits, max by HMNMX2 (exact, and a NaN loses to a number as with fmaxf;
//    every final max is fmaxf(0, .), so an all-NaN block has amax 0).
//  - 1-D rowwise (1x128): a transposing reduction over the kLanes lanes of a
//    row: each butterfly step sends the half of the rows the partner keeps
//    (4, 2, 1 values), so 8 shuffles leave in each lane the full max of one
//    row. That lane computes the row's scale and scale_inv (one pair of IEEE
//    divisions per thread, not one per row), one lane stores scale_inv, and
//    the quantize loop fetches each row's scale with one shuffle.
//  - 1-D columnwise (128x1): the two half-warps' column maxima (BF16/FP16)
//    are combined by a shuffle, each warp writes its 128 maxima to shared
//    memory; after a barrier 128 threads finish the columns (scale,
//    scale_inv) while the others do the rowwise reduction; a second barrier
//    publishes the scales.
//  - 2-D (128x128): the tile max (warp shuffles, then shared memory), one
//    scale for the tile; the bytes serve both directions.
//  - Quantize: row by row, each element converted to float once for both
//    directions; a plain multiply (no contraction), as the CPU computes
//    x * scale; cuda_elem::fp8x4 converts 4 products (hardware RNE and
//    saturation, NaN -> 0x7F patched on the packed word).
//  - Rowwise and compact columnwise bytes are stored from registers (8 or 4
//    bytes a row, 128 contiguous bytes a half-warp or warp). GEMM-ready
//    columnwise [K, M]: the thread's 8 x kVec bytes are transposed in
//    registers (tile::transpose4x4) into one 8-byte word per column (8
//    consecutive m), stored to a 16 KB [128 k][128 m] shared tile whose 8-byte
//    units are XOR-swizzled by k, and leave in 16-byte stores, 8 lanes per
//    128-byte output row. Both shared accesses are free of bank conflicts.
// Shared memory: 16.5 KB at most (the column maxima reuse the staging tile);
// <= 64 registers (launch bounds), so 4 CTAs of 256 threads (2 of 512) are
// resident per SM: 128 KB of loads in flight per SM when all are loading.
// No device allocation, no host synchronization (CUDA-graph safe).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "fp8_block/backend.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"
#include "runtime/cuda_launch.h"
#include "runtime/cuda_utils.cuh"
#include "runtime/element.h"
#include "transpose/tile.cuh"

namespace te::fp8_block::cuda {
namespace {

using cuda_elem::dispatch_fp8;
using cuda_elem::dispatch_input;
using cuda_elem::fp8x4;
using cuda_elem::to_float;

constexpr int kTile = static_cast<int>(kBlock);  // 128
constexpr int kRows = 8;                         // rows per thread
constexpr int kGroups = kTile / kRows;           // 16 row groups per tile
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// The thread layout for one input type: thread (g, cg) holds rows 8g..8g+7
// and columns kVec*cg .. kVec*cg+kVec-1 of the tile.
template <class In>
struct Shape {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(In));  // 8, or 4 for FP32
  static constexpr int kLanes = kTile / kVec;                     // threads per row: 16 or 32
  static constexpr int kThreads = kGroups * kLanes;               // 256 or 512
  static constexpr int kWords = kVec / 4;                         // FP8 words per row
  static constexpr int kMinBlocks = 1024 / kThreads;              // caps registers at 64
};

// What one launch writes.
template <bool k2D_, bool kRowwise_, bool kColumnwise_, bool kTransposed_>
struct Mode {
  static constexpr bool k2D = k2D_, kRowwise = kRowwise_, kColumnwise = kColumnwise_;
  static constexpr bool kTransposed = kTransposed_;  // GEMM-ready columnwise: [K, M]
  static constexpr bool kColumnMaxima = !k2D && kColumnwise;
  // Static shared memory: the staging tile and the column maxima share bytes.
  static constexpr int kStagedBytes = kTransposed ? kTile * kTile : 0;
  static constexpr int kPartialBytes = kColumnMaxima ? 16 * kTile * 4 : 0;  // <= 16 warps
  static constexpr int kUnionBytes = std::max(kStagedBytes, kPartialBytes);
  static constexpr int kScaleBytes = kColumnMaxima ? kTile * 4 : (k2D ? 64 : 0);
  static constexpr int kSmemBytes = std::max(16, kUnionBytes + kScaleBytes);
};

struct QuantizeParams {
  int64_t rows, cols;
  unsigned tiles_k;
  uint8_t* rowwise;
  float* row_scales;
  ScaleMap row_map;
  uint8_t* columnwise;
  float* col_scales;
  ScaleMap col_map;
  bool vector_loads;       // input 16-byte aligned (rows are: K % 16 == 0)
  bool vector_rows;        // rowwise and compact columnwise outputs kVec-byte aligned
  int column_store_bytes;  // widest store the transposed rows allow (16 .. 1)
  float fp8_max, epsilon, value_for_inf;
  bool force_pow2;

  __device__ float scale(float amax) const {
    return te::scale_from_amax(amax, fp8_max, force_pow2, epsilon, value_for_inf);
  }
};

// Scale-array entry of block (i, j) of a stored matrix (no divisions).
__device__ __forceinline__ int64_t scale_at(const ScaleMap& map, int64_t i, int64_t j) {
  return i * map.stride_r + j * map.stride_c;
}

// A 16-byte input vector as four 32-bit words: BF16/FP16 pairs or floats.
template <class In>
struct PairOf {
  using type = float;
};
template <>
struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct PairOf<__half> {
  using type = __half2;
};

template <class In, int N>
__device__ __forceinline__ const typename PairOf<In>::type* pairs(const Vec<In, N>& v) {
  return reinterpret_cast<const typename PairOf<In>::type*>(&v);
}

// |x| of a word's elements (clearing the sign bits: one LOP3 for a pair;
// for a float the compiler folds fabsf into the FMNMX that uses it).
__device__ __forceinline__ float abs_word(float x) { return fabsf(x); }
template <class P>
__device__ __forceinline__ P abs_word(P x) {
  return bit_cast_value<P>(bit_cast_value<uint32_t>(x) & 0x7FFF7FFFu);
}

// Element-wise max (a NaN loses to a number, as with fmaxf).
__device__ __forceinline__ float max_word(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ __nv_bfloat162 max_word(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __hmax2(a, b);
}
__device__ __forceinline__ __half2 max_word(__half2 a, __half2 b) { return __hmax2(a, b); }

// A word's elements as floats.
__device__ __forceinline__ void word_floats(float x, float* f) { f[0] = x; }
__device__ __forceinline__ void word_floats(__nv_bfloat162 x, float* f) {
  const uint32_t w = bit_cast_value<uint32_t>(x);
  f[0] = __uint_as_float(w << 16);
  f[1] = __uint_as_float(w & 0xFFFF0000u);
}
__device__ __forceinline__ void word_floats(__half2 x, float* f) {
  f[0] = __low2float(x);
  f[1] = __high2float(x);
}

// The max of a word's elements, as a float.
__device__ __forceinline__ float word_max(float x) { return x; }
template <class P>
__device__ __forceinline__ float word_max(P x) {
  float f[2];
  word_floats(x, f);
  return fmaxf(f[0], f[1]);
}

// The thread's maxima of |x|: row_max[i] over row i's vector, col_max[w]
// over the 8 rows, per word (packed). Only what the launch needs is taken.
template <bool kRowMax, bool kColMax, class In, int N>
__device__ __forceinline__ void thread_maxima(const Vec<In, N> (&v)[kRows], float (&row_max)[kRows],
                                              typename PairOf<In>::type (&col_max)[4]) {
  using Pair = typename PairOf<In>::type;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    Pair a[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      a[w] = abs_word(pairs(v[i])[w]);
      if (kColMax) col_max[w] = i == 0 ? a[w] : max_word(col_max[w], a[w]);
    }
    if (kRowMax) row_max[i] = word_max(max_word(max_word(a[0], a[1]), max_word(a[2], a[3])));
  }
}

// Rows row0.., columns col.. of the input; rows past rows_in (the rows that
// exist, 0 when the columns do not) are 0.
template <class In, int N>
__device__ __forceinline__ void load_rows(const In* __restrict__ in, const QuantizeParams& p,
                                          int64_t row0, int64_t col, int rows_in,
                                          Vec<In, N> (&v)[kRows]) {
  const In* src = in + row0 * p.cols + col;
  static_assert(sizeof(Vec<In, N>) == 16, "one 16-byte vector a row");
  if (p.vector_loads) {
#pragma unroll
    for (int i = 0; i < kRows; ++i, src += p.cols) {
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (i < rows_in) raw = __ldg(reinterpret_cast<const uint4*>(src));
      v[i] = bit_cast_value<Vec<In, N>>(raw);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRows; ++i, src += p.cols) {
      v[i] = bit_cast_value<Vec<In, N>>(make_uint4(0, 0, 0, 0));
      if (i < rows_in) {
#pragma unroll
        for (int j = 0; j < N; ++j) v[i].v[j] = src[j];
      }
    }
  }
}

// Element j of a vector as a float (BF16: one shift or mask of its word).
template <class In, int N>
__device__ __forceinline__ float element(const Vec<In, N>& v, int j) {
  if constexpr (std::is_same_v<In, __nv_bfloat16>) {
    const uint32_t w = reinterpret_cast<const uint32_t*>(&v)[j / 2];
    return __uint_as_float(j % 2 ? w & 0xFFFF0000u : w << 16);
  } else {
    return to_float(v.v[j]);
  }
}

// Elements x[j] * s[j] of one vector -> N / 4 FP8 words.
template <bool kE5M2, class In, int N>
__device__ __forceinline__ void quantize_vector(const Vec<In, N>& v, const float (&s)[N],
                                                uint32_t (&q)[N / 4]) {
#pragma unroll
  for (int w = 0; w < N / 4; ++w) {
    const int j = 4 * w;
    q[w] = fp8x4<kE5M2>(__fmul_rn(element(v, j), s[j]), __fmul_rn(element(v, j + 1), s[j + 1]),
                        __fmul_rn(element(v, j + 2), s[j + 2]),
                        __fmul_rn(element(v, j + 3), s[j + 3]));
  }
}

// Stores one row's 4 * W bytes at dst when `valid`.
template <int W>
__device__ __forceinline__ void store_row(uint8_t* dst, bool valid, const QuantizeParams& p,
                                          const uint32_t (&q)[W]) {
  if (!valid) return;
  if (p.vector_rows) {
    if constexpr (W == 2) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(q[0], q[1]);
    } else {
      *reinterpret_cast<uint32_t*>(dst) = q[0];
    }
  } else {
#pragma unroll
    for (int b = 0; b < 4 * W; ++b) dst[b] = static_cast<uint8_t>(q[b / 4] >> (8 * (b % 4)));
  }
}

// The transposing row reduction. a[i]: this lane's max of row i (of its 8);
// the kLanes lanes of a row group (a power-of-2 segment of the warp) hold
// the same rows. Returns the max over all kLanes lanes of row `row`, where
// row = 4*b2 + 2*b1 + b0 from the lane bits b2 = kLanes/2, b1, b0 below it.
template <int kLanes>
__device__ __forceinline__ float row_block_max(const float (&a)[kRows], int cg, int& row) {
  constexpr int kB2 = kLanes / 2, kB1 = kLanes / 4, kB0 = kLanes / 8;
  const bool b2 = cg & kB2, b1 = cg & kB1, b0 = cg & kB0;
  float h[4], q[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // keep rows 0-3 or 4-7, send the others
    const float send = b2 ? a[i] : a[i + 4], keep = b2 ? a[i + 4] : a[i];
    h[i] = fmaxf(keep, __shfl_xor_sync(kFullMask, send, kB2));
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float send = b1 ? h[i] : h[i + 2], keep = b1 ? h[i + 2] : h[i];
    q[i] = fmaxf(keep, __shfl_xor_sync(kFullMask, send, kB1));
  }
  const float send = b0 ? q[0] : q[1], keep = b0 ? q[1] : q[0];
  float m = fmaxf(keep, __shfl_xor_sync(kFullMask, send, kB0));
#pragma unroll
  for (int offset = kB0 / 2; offset > 0; offset /= 2)  // lanes that share the row
    m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
  row = 4 * b2 + 2 * b1 + b0;
  return m;
}

// The lane (within its row group) that holds row i after row_block_max.
template <int kLanes>
__device__ __forceinline__ int row_owner(int i) {
  return ((i >> 2) & 1) * (kLanes / 2) + ((i >> 1) & 1) * (kLanes / 4) + (i & 1) * (kLanes / 8);
}

// Staged transposed tile: row k (a column of the input) holds 128 bytes
// (m = 0..127) as 16 units of 8 bytes; unit u sits at slot u ^ (k / kVec % 16).
// Thread (g, cg) writes unit g of rows kVec*cg..: the 16 lanes of a half-warp
// hit 16 distinct slots. A 16-byte chunk (units 2c, 2c+1) stays in one
// aligned chunk (c ^ (x >> 1), halves swapped when x is odd), and the 8 lanes
// that read one row's 8 chunks hit distinct banks.
template <int kVec>
__device__ __forceinline__ int row_swizzle(int k) {
  return (k / kVec) & 15;
}

// Thread (g, cg)'s 8 x kVec bytes (q[i] = row i) -> kVec staged units.
template <int kVec>
__device__ __forceinline__ void stage_transposed(uint8_t* staged,
                                                 const uint32_t (&q)[kRows][kVec / 4], int g,
                                                 int cg) {
#pragma unroll
  for (int w = 0; w < kVec / 4; ++w) {
    uint32_t lo[4], hi[4];  // column 4w + j: rows 0-3 in lo[j], rows 4-7 in hi[j]
    tile::transpose4x4(q[0][w], q[1][w], q[2][w], q[3][w], lo);
    tile::transpose4x4(q[4][w], q[5][w], q[6][w], q[7][w], hi);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = kVec * cg + 4 * w + j;
      *reinterpret_cast<uint2*>(staged + k * kTile + 8 * (g ^ row_swizzle<kVec>(k))) =
          make_uint2(lo[j], hi[j]);
    }
  }
}

// The staged tile -> columnwise [K, M] rows k0.., columns m0.. (after a
// barrier). Thread t moves 16 bytes (m = 16c .. 16c+15, c = t % 8) of rows
// k = t / 8 + pass * kThreads / 8.
template <int kVec, int kThreads>
__device__ __forceinline__ void store_transposed(const uint8_t* staged, const QuantizeParams& p,
                                                 int64_t m0, int64_t k0) {
  constexpr int kRowsPerPass = kThreads / 8;
  const int c = threadIdx.x % 8, k_first = threadIdx.x / 8;
  const int64_t m = m0 + 16 * c;
  const bool full = k0 + kTile <= p.cols && m0 + kTile <= p.rows && p.column_store_bytes == 16;
  uint8_t* dst = p.columnwise + (k0 + k_first) * p.rows + m;
#pragma unroll
  for (int pass = 0; pass < kTile / kRowsPerPass; ++pass, dst += kRowsPerPass * p.rows) {
    const int k = k_first + pass * kRowsPerPass;
    const int x = row_swizzle<kVec>(k);
    uint4 v = *reinterpret_cast<const uint4*>(staged + k * kTile + 16 * (c ^ (x >> 1)));
    if (x & 1) v = make_uint4(v.z, v.w, v.x, v.y);
    if (full) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else if (k0 + k < p.cols) {
      if (m + 16 <= p.rows) {
        tile::store16(dst, v, p.column_store_bytes);
      } else {
#pragma unroll
        for (int b = 0; b < 16; ++b)
          if (m + b < p.rows) dst[b] = reinterpret_cast<const uint8_t*>(&v)[b];
      }
    }
  }
}

// Zeroes the padding entries [valid1, shape1) of one scale-array row.
__device__ __forceinline__ void zero_padding(float* scales, const ScaleMap& map, int64_t row) {
  for (int64_t j = map.valid1 + threadIdx.x; j < map.shape1; j += blockDim.x)
    scales[row * map.shape1 + j] = 0.0f;
}

// GEMM-ready scale rows are indexed by one tile coordinate and padded along
// the other; the CTA that is last along the padded axis writes the padding
// (compact arrays have none: the loop is empty).
template <class M>
__device__ __forceinline__ void write_padding(const QuantizeParams& p, int64_t mb, int64_t kb,
                                              bool last_m, bool last_k) {
  if (M::kRowwise && (M::k2D ? last_k : last_m))
    zero_padding(p.row_scales, p.row_map, M::k2D ? mb : kb);
  if (M::kColumnwise && (M::k2D ? last_m : last_k))
    zero_padding(p.col_scales, p.col_map, M::k2D ? kb : mb);
}

// 1-D: the column maxima over the warp's rows -> partial[warp][column].
// With 16 lanes a row (BF16/FP16) the two half-warps hold the same columns
// and are combined by one shuffle of the packed maxima first.
template <class In, class Pair>
__device__ __forceinline__ void store_column_maxima(Pair (&col_max)[4], float* partial, int cg) {
  constexpr int kVec = Shape<In>::kVec, kLanes = Shape<In>::kLanes;
  if (kLanes == 16) {
#pragma unroll
    for (int w = 0; w < 4; ++w)
      col_max[w] = max_word(col_max[w], __shfl_xor_sync(kFullMask, col_max[w], 16));
    if (threadIdx.x % 32 >= 16) return;
  }
  float f[kVec];
#pragma unroll
  for (int w = 0; w < 4; ++w) word_floats(col_max[w], f + w * (kVec / 4));
  float4* slot = reinterpret_cast<float4*>(partial + threadIdx.x / 32 * kTile + kVec * cg);
#pragma unroll
  for (int w = 0; w < kVec / 4; ++w)
    slot[w] = make_float4(f[4 * w], f[4 * w + 1], f[4 * w + 2], f[4 * w + 3]);
}

template <class In, bool kE5M2, class M>
__global__ void __launch_bounds__(Shape<In>::kThreads, Shape<In>::kMinBlocks)
    quantize_kernel(const In* __restrict__ in, const QuantizeParams p) {
  using S = Shape<In>;
  constexpr int kVec = S::kVec;
  __shared__ alignas(16) uint8_t smem[M::kSmemBytes];
  uint8_t* const staged = smem;                           // [128 k][128 m] bytes
  float* const partial = reinterpret_cast<float*>(smem);  // [warps][128] maxima
  float* const shared_scale = reinterpret_cast<float*>(smem + M::kUnionBytes);

  const unsigned mb = blockIdx.x / p.tiles_k, kb = blockIdx.x % p.tiles_k;
  const int64_t m0 = static_cast<int64_t>(mb) * kTile, k0 = static_cast<int64_t>(kb) * kTile;
  const int t = threadIdx.x, g = t / S::kLanes, cg = t % S::kLanes;
  const int64_t row0 = m0 + kRows * g, col = k0 + kVec * cg;

  // How many of the thread's rows exist (none when its columns do not).
  const int rows_in = col >= p.cols || row0 >= p.rows ? 0
                      : p.rows - row0 >= kRows        ? kRows
                                                      : static_cast<int>(p.rows - row0);
  Vec<In, kVec> v[kRows];
  load_rows(in, p, row0, col, rows_in, v);
  write_padding<M>(p, mb, kb, m0 + kTile >= p.rows, k0 + kTile >= p.cols);

  // Scales: s_row is this lane's rowwise scale (1-D: of row `row` of its
  // group, handed to the other lanes by shuffles); col_scale[j] the scale of
  // column j (2-D: the tile's scale everywhere).
  float s_row = 0.0f, col_scale[kVec];
  float row_max[kRows];
  typename PairOf<In>::type col_max[4];
  thread_maxima<M::kRowwise && !M::k2D, M::k2D || M::kColumnwise>(v, row_max, col_max);
  if constexpr (M::k2D) {
    float amax =
        word_max(max_word(max_word(col_max[0], col_max[1]), max_word(col_max[2], col_max[3])));
#pragma unroll
    for (int step = 16; step > 0; step /= 2)
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, step));
    if (t % 32 == 0) shared_scale[t / 32] = amax;
    __syncthreads();
    amax = 0.0f;
#pragma unroll
    for (int w = 0; w < S::kThreads / 32; ++w) amax = fmaxf(amax, shared_scale[w]);
    const float s = p.scale(amax);
    if (t == 0) {
      const float inv = __fdiv_rn(1.0f, s);
      if (M::kRowwise) p.row_scales[scale_at(p.row_map, mb, kb)] = inv;
      if (M::kColumnwise)
        p.col_scales[M::kTransposed ? scale_at(p.col_map, kb, mb) : scale_at(p.col_map, mb, kb)] =
            inv;
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) col_scale[j] = s;
  } else {
    if constexpr (M::kColumnwise) {
      store_column_maxima<In>(col_max, partial, cg);
      __syncthreads();
      if (t < kTile) {  // column t of the tile: max over the warps' maxima, its scale
        float amax = 0.0f;
#pragma unroll
        for (int w = 0; w < S::kThreads / 32; ++w) amax = fmaxf(amax, partial[w * kTile + t]);
        const float s = p.scale(amax);
        shared_scale[t] = s;
        if (k0 + t < p.cols)
          p.col_scales[M::kTransposed ? scale_at(p.col_map, k0 + t, mb)
                                      : scale_at(p.col_map, mb, k0 + t)] = __fdiv_rn(1.0f, s);
      }
    }
    if constexpr (M::kRowwise) {  // meanwhile (no barrier): the rowwise scales
      int row;
      s_row = p.scale(fmaxf(0.0f, row_block_max<S::kLanes>(row_max, cg, row)));
      const float inv = __fdiv_rn(1.0f, s_row);
      if ((cg & (S::kLanes / 8 - 1)) == 0 && row0 + row < p.rows)
        p.row_scales[scale_at(p.row_map, row0 + row, kb)] = inv;
    }
    if constexpr (M::kColumnwise) {
      __syncthreads();  // the column scales are in shared memory
      const float4* src = reinterpret_cast<const float4*>(shared_scale + kVec * cg);
#pragma unroll
      for (int w = 0; w < kVec / 4; ++w) {
        const float4 s = src[w];
        col_scale[4 * w] = s.x;
        col_scale[4 * w + 1] = s.y;
        col_scale[4 * w + 2] = s.z;
        col_scale[4 * w + 3] = s.w;
      }
    }
  }

  // Quantize row by row (each element converted once to float for both
  // directions). Rowwise and compact columnwise bytes leave at once; the
  // GEMM-ready columnwise bytes are kept for the transposed staging.
  int64_t offset = row0 * p.cols + col;
  uint32_t q_col[kRows][S::kWords];
#pragma unroll
  for (int i = 0; i < kRows; ++i, offset += p.cols) {
    const bool valid = i < rows_in;
    if constexpr (M::k2D) {
      quantize_vector<kE5M2>(v[i], col_scale, q_col[i]);  // the same bytes both ways
      if (M::kRowwise) store_row(p.rowwise + offset, valid, p, q_col[i]);
    } else {
      if constexpr (M::kRowwise) {
        float s[kVec];
        const float s_i = __shfl_sync(kFullMask, s_row, row_owner<S::kLanes>(i), S::kLanes);
#pragma unroll
        for (int j = 0; j < kVec; ++j) s[j] = s_i;
        uint32_t q[S::kWords];
        quantize_vector<kE5M2>(v[i], s, q);
        store_row(p.rowwise + offset, valid, p, q);
      }
      if constexpr (M::kColumnwise) quantize_vector<kE5M2>(v[i], col_scale, q_col[i]);
    }
    if (M::kColumnwise && !M::kTransposed) store_row(p.columnwise + offset, valid, p, q_col[i]);
  }

  if constexpr (M::kTransposed) {
    stage_transposed<kVec>(staged, q_col, g, cg);
    __syncthreads();
    store_transposed<kVec, S::kThreads>(staged, p, m0, k0);
  }
}

template <class In, bool kE5M2, class M>
void launch(const In* in, const QuantizeParams& p, int64_t tiles, cudaStream_t stream) {
  quantize_kernel<In, kE5M2, M><<<tiles, Shape<In>::kThreads, 0, stream>>>(in, p);
  TE_CHECK_LAUNCH();
}

// The kernel for the requested outputs.
template <class In, bool kE5M2, bool k2D>
void launch_mode(const In* in, const QuantizeParams& p, bool transposed, int64_t tiles,
                 cudaStream_t stream) {
  const bool row = p.rowwise != nullptr, col = p.columnwise != nullptr;
  if (row && !col) return launch<In, kE5M2, Mode<k2D, true, false, false>>(in, p, tiles, stream);
  if (row && transposed)
    return launch<In, kE5M2, Mode<k2D, true, true, true>>(in, p, tiles, stream);
  if (row) return launch<In, kE5M2, Mode<k2D, true, true, false>>(in, p, tiles, stream);
  if (transposed) return launch<In, kE5M2, Mode<k2D, false, true, true>>(in, p, tiles, stream);
  launch<In, kE5M2, Mode<k2D, false, true, false>>(in, p, tiles, stream);
}

}  // namespace

void quantize(const QuantizeArgs& a, te_stream stream) {
  if (a.rows == 0 || a.cols == 0) return;  // every scale array is empty too
  QuantizeParams p{};
  p.rows = a.rows;
  p.cols = a.cols;
  p.tiles_k = static_cast<unsigned>(cdiv(a.cols, kBlock));
  p.rowwise = a.rowwise;
  p.row_scales = a.rowwise_scale_inv;
  p.row_map = a.rowwise_map;
  p.columnwise = a.columnwise;
  p.col_scales = a.columnwise_scale_inv;
  p.col_map = a.columnwise_map;
  const bool transposed = a.columnwise != nullptr && a.layout == TE_FP8_BLOCK_GEMM_READY;
  p.vector_loads = is_aligned(a.input, 16);
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
  const int64_t tiles = cdiv(a.rows, kBlock) * cdiv(a.cols, kBlock);
  cudaStream_t s = cuda_stream(stream);
  dispatch_input(a.input_dtype, [&](auto in_tag) {
    using In = decltype(in_tag);
    dispatch_fp8(a.fp8_dtype, [&](auto e5m2) {
      constexpr bool kE5M2 = decltype(e5m2)::value;
      const In* in = static_cast<const In*>(a.input);
      constexpr int kVec = Shape<In>::kVec;  // bytes a thread stores per row
      p.vector_rows = (a.rowwise == nullptr || is_aligned(a.rowwise, kVec)) &&
                      (a.columnwise == nullptr || transposed || is_aligned(a.columnwise, kVec));
      if (a.dim == TE_FP8_BLOCK_2D) {
        launch_mode<In, kE5M2, true>(in, p, transposed, tiles, s);
      } else {
        launch_mode<In, kE5M2, false>(in, p, transposed, tiles, s);
      }
    });
  });
}

}  // namespace te::fp8_block::cuda
