// MXFP8 quantize, warp-tile kernel: no shared memory, every pointer alignment.
// The CUDA backend runs it when a pointer does not allow the tiled kernel's
// vector accesses (quantize_tile.cuh); it was the only kernel before that one
// and stays selectable for benchmarks (bench/kernels/mxfp8_quantize_variants.cu).
//
//  - A warp owns a tile of 32 rows x 8V columns, V = 16 / sizeof(input) elements
//    per 16-byte vector (V = 8: 32 x 64 for BF16/FP16; V = 4: 32 x 32 for FP32).
//    Lane = 8 * g + v: row group g (rows 8g .. 8g+7 of the tile), column vector v
//    (columns V*v .. V*v+V-1). A lane issues its eight row loads before using any.
//  - Rowwise 1x32 block = 32 / V neighbouring lanes of one row group: a
//    __shfl_xor butterfly gives each lane the block amax. Columnwise 32x1 block
//    = the 4 row groups: butterfly over lanes 8 and 16 apart, per column. A 2-D
//    32x32 tile is the union of both.
//  - Each lane casts its elements and stores V bytes per row for each requested
//    direction; the first lane of a block writes its scale byte.
//  - Scale padding is not written by the kernel: launch_warp_quantize zeroes
//    the scale buffers that have any with cudaMemsetAsync first.
#pragma once

#include "mxfp8/backend.h"
#include "mxfp8/cuda_block.cuh"
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"

namespace te::mxfp8::cuda::warp {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kRowsPerLane = 8;  // 4 row groups x 8 rows = one 32-row block

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

// Column maxima over a lane's rows.
template <class In, int V>
__device__ __forceinline__ ColumnMax<In, V> lane_column_max(const Vec<In, V> (&raw)[kRowsPerLane]) {
  ColumnMax<In, V> m;
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) m.add(raw[i]);
  return m;
}

template <bool kVec, bool kE5M2, class In, int V>
__device__ __forceinline__ void columnwise_pass(const Vec<In, V> (&raw)[kRowsPerLane],
                                                const QuantizeArgs& a, const LaneTile& t,
                                                float reciprocal) {
  const ColumnMax<In, V> m = lane_column_max(raw);
  float f[V];
  uint8_t e[V];
  m.get(f);
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

template <bool kVec, bool kE5M2, bool kRow, bool kCol, class In, int V>
__device__ __forceinline__ void tile_pass(const Vec<In, V> (&raw)[kRowsPerLane],
                                          const QuantizeArgs& a, const LaneTile& t,
                                          float reciprocal) {
  const ColumnMax<In, V> m = lane_column_max(raw);
  const float amax = butterfly_max<8, 16>(butterfly_max<1, kBlock / V / 2>(m.all()));
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
  float f[V];
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
// element-wise form is a separate instantiation: in the same kernel its
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

// Zeroes a scale buffer that has padding (the kernel writes every real scale).
inline void zero_padding(uint8_t* scales, int64_t scale_rows, int64_t scale_cols, int64_t real,
                         cudaStream_t stream) {
  if (scales != nullptr && scale_rows * scale_cols != real)
    TE_CHECK_CUDA(cudaMemsetAsync(scales, 0, scale_rows * scale_cols, stream));
}

// The whole quantize with this kernel: padding zeroed, then one launch for
// the requested directions (rows, cols > 0).
template <class In, bool kE5M2, bool kVec>
void launch_quantize(const QuantizeArgs& a, cudaStream_t stream) {
  zero_padding(a.rowwise_scales, a.row_scale_rows, a.row_scale_cols, a.rows * (a.cols / kBlock),
               stream);
  zero_padding(a.columnwise_scales, a.col_scale_rows, a.col_scale_cols, (a.rows / kBlock) * a.cols,
               stream);
  constexpr int V = 16 / sizeof(In);
  KernelArgs k{a, ceil_div(a.cols, 8 * V), 0, kE5M2 ? kE5M2MaxReciprocal : kE4M3MaxReciprocal};
  k.num_tiles = ceil_div(a.rows, kBlock) * k.tiles_per_strip;
  const int64_t blocks = ceil_div(k.num_tiles, kWarpsPerBlock);
  dispatch_directions(a, [&](auto row, auto col, auto two_d) {
    quantize_kernel<In, kE5M2, decltype(row)::value, decltype(col)::value, decltype(two_d)::value,
                    kVec><<<blocks, kThreads, 0, stream>>>(k);
    TE_CHECK_LAUNCH();
  });
}

}  // namespace te::mxfp8::cuda::warp
