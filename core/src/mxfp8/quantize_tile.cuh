// MXFP8 quantize, tiled kernel: the CUDA backend's kernel for aligned pointers
// (quantize_warp.cuh handles the others). One thread block per tile of R rows x
// C columns; Shape picks R, C, the threads and the columnwise lane layout, so
// bench/kernels/mxfp8_quantize_variants.cu can time several and cuda.cu names
// the one the backend uses (DefaultShape).
//
//  1. Load: the block copies its tile into shared memory with cp.async (16
//     bytes each, global -> shared without registers), all copies issued before
//     the first wait: R*C*sizeof(x) bytes in flight per block (32 KB for the
//     default 128 x 128 BF16 tile) while the thread state stays small, so
//     several blocks share an SM. Rows and columns outside the tensor are
//     zero-filled by the copy itself. With Shape::kStages = 2 the grid is one
//     wave instead and each block loads its next tile while it works on this one.
//  2. Rowwise: a thread takes one 16-byte chunk (V = 16 / sizeof(x) elements)
//     of a row; the 32 / V chunks of a 1x32 block sit in neighbouring lanes,
//     a __shfl_xor butterfly gives each the block amax. It casts and stores V
//     bytes; a warp's stores cover whole 128-byte lines. (Shape::kWholeRowBlocks:
//     one whole block per thread instead.)
//  3. Columnwise (and 2-D): a warp takes a 32-row strip x kColLanes chunks; lane
//     = group * kColLanes + chunk, each of the 32 / kColLanes groups holding
//     kColLanes rows.
//     A lane takes its column maxima over its rows (first read of shared
//     memory), the butterfly over the groups completes the 32x1 blocks (and, in
//     2-D, over the chunks the 32x32 block), then it reads the rows again to
//     cast and store V bytes per row. Reading twice keeps registers low.
//  4. Scales: every block amax lands in a small shared array; after a barrier
//     the block writes them as packed words: the C/32 rowwise scales of a tile
//     row are contiguous in both layouts; the columnwise ones of a strip are C
//     contiguous bytes (compact, 16-byte stores) or, swizzled, the R/32 strips
//     of a column are contiguous.
// The grid covers [roundup(M, 128), roundup(K, 128)] (R and C divide 128), the
// padded extent of both scale buffers, so every padding scale is written by
// some block: its zero-filled elements give amax 0, hence scale byte 0. No
// memset, and no data byte outside [M, K] is stored.
#pragma once

#include "mxfp8/backend.h"
#include "mxfp8/cuda_block.cuh"
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"

namespace te::mxfp8::cuda::tiled {

// kRows: tile rows for 2-byte inputs (halved for FP32, at least 32, so the
// shared tile keeps its size); kCols: tile columns; kColLanes: lanes along a
// row in the columnwise pass (8: 4 row groups of 8 rows; 16: 2 groups of 16).
// kStages: 1, one tile per block (grid = tiles); 2, a persistent grid (one
// wave) whose blocks loop over tiles, loading the next tile into a second
// buffer while they work on the current one. kWholeRowBlocks: in the rowwise
// pass a thread takes a whole 1x32 block (no shuffles, one scale per thread,
// 16-byte stores) instead of one chunk of it.
template <int kRows_, int kCols_, int kThreads_, int kMinBlocks_, int kColLanes_, int kStages_ = 1,
          bool kWholeRowBlocks_ = false>
struct Shape {
  static constexpr int kRows = kRows_, kCols = kCols_, kThreads = kThreads_;
  static constexpr int kMinBlocks = kMinBlocks_, kColLanes = kColLanes_, kStages = kStages_;
  static constexpr bool kWholeRowBlocks = kWholeRowBlocks_;
};

// The shape the CUDA backend uses (cuda.cu): 64 x 128 tiles (32 x 128 for
// FP32), 128 threads, at least 8 blocks per SM, 4 columnwise row groups of 8
// rows. The fastest of the candidates of bench/kernels/run_mxfp8_variants.sh on
// the H200 (2026-11-29, BF16 32768 x 4096, % of a D2D copy of the input):
// rowwise 92.7%, columnwise 91.2%, both 86.4%, 2-D both 88.3% (the 128 x 128 /
// 256-thread shape: 92.3 / 86.1 / 81.1 / 87.8%; the previous warp-tile kernel
// with this file's scale math: 83.4 / 96.0 / 82.6 / 84.8%).
using DefaultShape = Shape<64, 128, 128, 8, 8>;

template <class In, class S>
struct Geometry {
  static constexpr int V = 16 / static_cast<int>(sizeof(In));  // elements per chunk
  static constexpr int R = sizeof(In) == 4 && S::kRows > 32 ? S::kRows / 2 : S::kRows;
  static constexpr int C = S::kCols;
  static constexpr int T = S::kThreads;
  static constexpr int kChunks = C / V;  // per tile row
  static constexpr int kBlocksPerRow = C / kBlock;
  static constexpr int kStrips = R / kBlock;
  static constexpr int kLanesPerBlock = kBlock / V;
  static constexpr int kColLanes = S::kColLanes;
  static constexpr int kRowsPerLane = kColLanes;  // 32 rows over 32 / kColLanes groups
  static constexpr int kColUnits = kStrips * (kChunks / kColLanes);  // one warp each
  static constexpr int kTileBytes = R * C * static_cast<int>(sizeof(In));
  static constexpr int kScaleBytes = R * kBlocksPerRow;  // per direction
  static constexpr int kStages = S::kStages;
  static constexpr bool kWholeRowBlocks = S::kWholeRowBlocks;
  static constexpr int kSmemBytes = kStages * kTileBytes + 2 * kScaleBytes;

  static_assert(R % kBlock == 0 && 128 % R == 0, "tile rows: 32, 64 or 128");
  static_assert(C % kBlock == 0 && 128 % C == 0 && kChunks % 8 == 0, "tile columns: 64 or 128");
  static_assert(kColLanes == 8 || kColLanes == 16, "columnwise lanes per row: 8 or 16");
  static_assert(kChunks % kColLanes == 0 && kLanesPerBlock <= kColLanes, "columnwise layout");
  static_assert(T % 32 == 0 && (R * kChunks) % T == 0, "whole warps in every pass");
  static_assert(kStages == 1 || kStages == 2, "one or two tile buffers");
  static_assert((R * kBlocksPerRow) % T == 0, "whole warps in the rowwise pass (whole blocks)");
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory limit");
};

struct TileArgs {
  QuantizeArgs a;
  unsigned tiles_k;    // tiles along K
  unsigned num_tiles;  // in all
  float reciprocal;    // fl32(1 / fp8_max)
};

// 16 bytes global -> shared, asynchronously; zeros when !valid (nothing read).
__device__ __forceinline__ void copy16_async(void* smem, const void* global, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void commit_async_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending committed groups of this thread are in flight.
template <int kPending>
__device__ __forceinline__ void wait_async_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// An unsigned integer of N bytes (1, 2 or 4), or uint4 for N = 16.
template <int N>
using Word = std::conditional_t<
    N == 16, uint4,
    std::conditional_t<N == 4, uint32_t, std::conditional_t<N == 2, uint16_t, uint8_t>>>;

// N bytes (both addresses N-aligned) from shared to global memory.
template <int N>
__device__ __forceinline__ void copy_bytes(uint8_t* dst, const uint8_t* src) {
  *reinterpret_cast<Word<N>*>(dst) = *reinterpret_cast<const Word<N>*>(src);
}

// Step 2: rowwise 1x32 blocks, a chunk per thread.
template <class G, bool kE5M2, class In>
__device__ __forceinline__ void rowwise_pass_chunks(const In* tile, uint8_t* row_e,
                                                    const TileArgs& k, int64_t m0, int64_t k0) {
  constexpr int V = G::V;
  // Unrolled by 2 only: fully unrolled, the compiler hoists every chunk's
  // shared-memory load and runs out of registers.
#pragma unroll 2
  for (int step = 0; step < G::R * G::kChunks / G::T; ++step) {
    const unsigned it = step * G::T + threadIdx.x;  // unsigned: / and % become shifts
    const int r = static_cast<int>(it / G::kChunks), ch = static_cast<int>(it % G::kChunks);
    const Vec<In, V> x = *reinterpret_cast<const Vec<In, V>*>(tile + r * G::C + ch * V);
    const float amax = butterfly_max<1, G::kLanesPerBlock / 2>(row_abs_max(x));
    const uint8_t e = e8m0_round_up(__fmul_rn(amax, k.reciprocal));
    if (ch % G::kLanesPerBlock == 0) row_e[r * G::kBlocksPerRow + ch / G::kLanesPerBlock] = e;
    const int64_t gr = m0 + r, gc = k0 + ch * V;
    if (gr < k.a.rows && gc < k.a.cols) {
      float f[V];
#pragma unroll
      for (int j = 0; j < V; ++j) f[j] = quantize_factor(e);
      store_bytes<true>(k.a.rowwise + gr * k.a.cols + gc, cast_row<kE5M2>(x, f));
    }
  }
}

// Step 2 with kWholeRowBlocks: a 1x32 block per thread (4 or 8 chunks; the
// lanes of a warp read chunks 64 or 128 bytes apart, a 4-way bank conflict that
// shared memory has the bandwidth for), its 32 bytes stored as two 16-byte words.
template <class G, bool kE5M2, class In>
__device__ __forceinline__ void rowwise_pass_blocks(const In* tile, uint8_t* row_e,
                                                    const TileArgs& k, int64_t m0, int64_t k0) {
  constexpr int V = G::V, kChunks = G::kLanesPerBlock;  // per block
#pragma unroll
  for (int step = 0; step < G::R * G::kBlocksPerRow / G::T; ++step) {
    const unsigned it = step * G::T + threadIdx.x;
    const int r = static_cast<int>(it / G::kBlocksPerRow),
              b = static_cast<int>(it % G::kBlocksPerRow);
    const In* p = tile + r * G::C + b * kBlock;
    Vec<In, V> x[kChunks];
    ColumnMax<In, V> m;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      x[j] = *reinterpret_cast<const Vec<In, V>*>(p + j * V);
      m.add(x[j]);
    }
    const uint8_t e = e8m0_round_up(__fmul_rn(m.all(), k.reciprocal));
    row_e[r * G::kBlocksPerRow + b] = e;
    const int64_t gr = m0 + r, gc = k0 + b * kBlock;
    if (gr >= k.a.rows || gc >= k.a.cols) continue;
    float f[V];
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = quantize_factor(e);
    uint32_t w[kBlock / 4];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const Bytes<V> q = cast_row<kE5M2>(x[j], f);
#pragma unroll
      for (int i = 0; i < V / 4; ++i) w[j * (V / 4) + i] = q.w[i];
    }
    uint4* dst = reinterpret_cast<uint4*>(k.a.rowwise + gr * k.a.cols + gc);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

template <class G, bool kE5M2, class In>
__device__ __forceinline__ void rowwise_pass(const In* tile, uint8_t* row_e, const TileArgs& k,
                                             int64_t m0, int64_t k0) {
  if constexpr (G::kWholeRowBlocks) {
    rowwise_pass_blocks<G, kE5M2>(tile, row_e, k, m0, k0);
  } else {
    rowwise_pass_chunks<G, kE5M2>(tile, row_e, k, m0, k0);
  }
}

// Step 3: columnwise 32x1 blocks, or (k2D) 32x32 blocks for the requested
// directions.
template <class G, bool kE5M2, bool kRow, bool kCol, bool k2D, class In>
__device__ __forceinline__ void column_pass(const In* tile, uint8_t* row_e, uint8_t* col_e,
                                            const TileArgs& k, int64_t m0, int64_t k0) {
  constexpr int V = G::V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / G::kColLanes;
  constexpr int kWarps = G::T / 32;
#pragma unroll
  for (int step = 0; step < (G::kColUnits + kWarps - 1) / kWarps; ++step) {
    const int unit = step * kWarps + warp;
    if (unit >= G::kColUnits) break;  // whole warps
    const int strip = unit / (G::kChunks / G::kColLanes);
    const int ch = (unit % (G::kChunks / G::kColLanes)) * G::kColLanes + lane % G::kColLanes;
    const int r0 = strip * kBlock + group * G::kRowsPerLane;
    const In* p = tile + r0 * G::C + ch * V;
    ColumnMax<In, V> m;
#pragma unroll
    for (int i = 0; i < G::kRowsPerLane; ++i)
      m.add(*reinterpret_cast<const Vec<In, V>*>(p + i * G::C));
    // The rows are read again below: a compiler barrier, so that they are not
    // kept in registers from this first read.
    __syncwarp();
    float f[V];
    if constexpr (k2D) {
      const float amax =
          butterfly_max<G::kColLanes, 16>(butterfly_max<1, G::kLanesPerBlock / 2>(m.all()));
      const uint8_t e = e8m0_round_up(__fmul_rn(amax, k.reciprocal));
      if (ch % G::kLanesPerBlock == 0) {
#pragma unroll
        for (int i = 0; i < G::kRowsPerLane; ++i)
          row_e[(r0 + i) * G::kBlocksPerRow + ch / G::kLanesPerBlock] = e;
      }
      if (group == 0) {
#pragma unroll
        for (int j = 0; j < V; ++j) col_e[strip * G::C + ch * V + j] = e;
      }
#pragma unroll
      for (int j = 0; j < V; ++j) f[j] = quantize_factor(e);
    } else {
      m.get(f);
      Bytes<V> e;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const uint8_t ej =
            e8m0_round_up(__fmul_rn(butterfly_max<G::kColLanes, 16>(f[j]), k.reciprocal));
        e.w[j / 4] = (j % 4 ? e.w[j / 4] : 0u) | (uint32_t{ej} << (8 * (j % 4)));
        f[j] = quantize_factor(ej);
      }
      if (group == 0) store_bytes<true>(col_e + strip * G::C + ch * V, e);
    }
    const int64_t gc = k0 + ch * V;
    if (gc >= k.a.cols) continue;
#pragma unroll
    for (int i = 0; i < G::kRowsPerLane; ++i) {
      const int64_t gr = m0 + r0 + i;
      if (gr >= k.a.rows) break;
      const Bytes<V> b = cast_row<kE5M2>(*reinterpret_cast<const Vec<In, V>*>(p + i * G::C), f);
      if constexpr (kRow) store_bytes<true>(k.a.rowwise + gr * k.a.cols + gc, b);
      if constexpr (kCol) store_bytes<true>(k.a.columnwise + gr * k.a.cols + gc, b);
    }
  }
}

// Step 4: the tile's scales (padding included) from shared memory to the
// scale buffers.
template <class G, bool kRow, bool kCol>
__device__ __forceinline__ void store_scales(const uint8_t* row_e, const uint8_t* col_e,
                                             const QuantizeArgs& a, int64_t m0, int64_t k0) {
  if constexpr (kRow) {
    for (int r = threadIdx.x; r < G::R; r += G::T)
      copy_bytes<G::kBlocksPerRow>(
          a.rowwise_scales +
              rowwise_scale_offset(m0 + r, k0 / kBlock, a.row_scale_cols, a.swizzled),
          row_e + r * G::kBlocksPerRow);
  }
  if constexpr (kCol) {
    const int64_t strip0 = m0 / kBlock;
    if (!a.swizzled) {
      for (int it = threadIdx.x; it < G::kStrips * G::C / 16; it += G::T) {
        const int s = it / (G::C / 16), c = it % (G::C / 16) * 16;
        copy_bytes<16>(a.columnwise_scales + (strip0 + s) * a.col_scale_cols + k0 + c,
                       col_e + s * G::C + c);
      }
    } else {
      // Swizzled, the scales of strips strip0 .. strip0 + R/32 - 1 (strip0 % 4
      // == 0) of one column are neighbours: gather them into one word.
      for (int c = threadIdx.x; c < G::C; c += G::T) {
        uint32_t strips = 0;
#pragma unroll
        for (int s = 0; s < G::kStrips; ++s) strips |= uint32_t{col_e[s * G::C + c]} << (8 * s);
        const int64_t offset =
            columnwise_scale_offset(strip0, k0 + c, a.col_scale_rows, a.col_scale_cols, true);
        *reinterpret_cast<Word<G::kStrips>*>(a.columnwise_scales + offset) =
            static_cast<Word<G::kStrips>>(strips);
      }
    }
  }
}

// Step 1: the tile at (m0, k0) into shared memory, asynchronously (one group).
template <class G, class In>
__device__ __forceinline__ void load_tile(In* tile, const TileArgs& k, int64_t m0, int64_t k0) {
  const In* in = static_cast<const In*>(k.a.input);
#pragma unroll
  for (int step = 0; step < G::R * G::kChunks / G::T; ++step) {
    const unsigned it = step * G::T + threadIdx.x;  // unsigned: / and % become shifts
    const int r = static_cast<int>(it / G::kChunks), ch = static_cast<int>(it % G::kChunks);
    const int64_t gr = m0 + r, gc = k0 + ch * G::V;
    const bool valid = gr < k.a.rows && gc < k.a.cols;
    copy16_async(tile + r * G::C + ch * G::V, valid ? in + gr * k.a.cols + gc : in, valid);
  }
  commit_async_copies();
}

template <class In, bool kE5M2, bool kRow, bool kCol, bool k2D, class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks) quantize_kernel(const TileArgs k) {
  using G = Geometry<In, S>;
  __shared__ alignas(16) uint8_t smem[G::kSmemBytes];
  In* const buffers = reinterpret_cast<In*>(smem);     // kStages x [R][C]
  uint8_t* row_e = smem + G::kStages * G::kTileBytes;  // [R][C / 32]
  uint8_t* col_e = row_e + G::kScaleBytes;             // [R / 32][C]
  auto origin = [&](unsigned tile, int64_t& m0, int64_t& k0) {
    m0 = static_cast<int64_t>(tile / k.tiles_k) * G::R;
    k0 = static_cast<int64_t>(tile % k.tiles_k) * G::C;
  };
  int64_t m0, k0;
  unsigned tile = blockIdx.x;
  if (G::kStages == 2 && tile < k.num_tiles) {
    origin(tile, m0, k0);
    load_tile<G>(buffers, k, m0, k0);
  }
  for (int buffer = 0; tile < k.num_tiles; tile += gridDim.x, buffer ^= 1) {
    origin(tile, m0, k0);
    In* const current = buffers + (G::kStages == 2 ? buffer : 0) * (G::R * G::C);
    if constexpr (G::kStages == 1) {
      load_tile<G>(current, k, m0, k0);
      wait_async_copies<0>();
    } else {
      // The other buffer was last read before the barrier ahead of the
      // previous tile's scale stores: free.
      const unsigned next = tile + gridDim.x;
      if (next < k.num_tiles) {
        int64_t next_m0, next_k0;
        origin(next, next_m0, next_k0);
        load_tile<G>(buffers + (buffer ^ 1) * (G::R * G::C), k, next_m0, next_k0);
      } else {
        commit_async_copies();  // an empty group keeps the count below uniform
      }
      wait_async_copies<1>();  // all but the group just committed: the current tile
    }
    __syncthreads();

    if constexpr (k2D) {
      column_pass<G, kE5M2, kRow, kCol, true>(current, row_e, col_e, k, m0, k0);
    } else {
      if constexpr (kRow) rowwise_pass<G, kE5M2>(current, row_e, k, m0, k0);
      if constexpr (kCol)
        column_pass<G, kE5M2, false, true, false>(current, row_e, col_e, k, m0, k0);
    }
    __syncthreads();
    store_scales<G, kRow, kCol>(row_e, col_e, k.a, m0, k0);
  }
}

// Whether the pointers allow this kernel: 16-byte aligned input (cp.async),
// data (V-byte stores) and scale buffers (packed scale stores).
inline bool fits(const QuantizeArgs& a) {
  for (const void* p :
       {a.input, static_cast<const void*>(a.rowwise), static_cast<const void*>(a.rowwise_scales),
        static_cast<const void*>(a.columnwise), static_cast<const void*>(a.columnwise_scales)})
    if (!is_aligned(p, 16)) return false;
  return true;
}

// The whole quantize (rows, cols > 0; fits(a)).
template <class In, bool kE5M2, class S>
void launch_quantize(const QuantizeArgs& a, cudaStream_t stream) {
  using G = Geometry<In, S>;
  const unsigned tiles_k = static_cast<unsigned>(round_up(a.cols, 128) / G::C);
  const TileArgs k{a, tiles_k, static_cast<unsigned>(round_up(a.rows, 128) / G::R * tiles_k),
                   kE5M2 ? kE5M2MaxReciprocal : kE4M3MaxReciprocal};
  dispatch_directions(a, [&](auto row, auto col, auto two_d) {
    auto kernel = quantize_kernel<In, kE5M2, decltype(row)::value, decltype(col)::value,
                                  decltype(two_d)::value, S>;
    const int64_t blocks =
        G::kStages == 1
            ? k.num_tiles
            : persistent_blocks(reinterpret_cast<const void*>(kernel), G::T, k.num_tiles);
    kernel<<<blocks, G::T, 0, stream>>>(k);
    TE_CHECK_LAUNCH();
  });
}

}  // namespace te::mxfp8::cuda::tiled
