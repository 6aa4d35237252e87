// The byte-tile transposer behind FP8 cast-transpose (cast/cuda.cu) and the
// 1-byte transpose (transpose/cuda.cu): one pass over an [M, K] input that
// writes out[k][m] = op(in[m][k]) as bytes, and optionally rowwise[m][k] too.
//
// Tile: 128 rows (m) x 64 columns (k), 256 threads, 8 KB of shared memory.
//  1. Thread t of warp w owns rows 4*rg .. 4*rg+3 (rg = 4w + lane/8) and
//     columns 8*(lane%8) .. +7: it loads 8 elements of each of its 4 rows (one
//     or two 16-byte loads, 8 lanes cover a 128-byte row segment), converts
//     them to 4 x 8 bytes, stores the rowwise bytes (8-byte stores), then
//     transposes the 4x8 bytes in registers (__byte_perm) into 8 words, each
//     holding 4 consecutive m of one k, and stores them to shared memory.
//  2. Shared memory holds the tile transposed, [64 k][128 m] bytes. Each k row
//     is 8 chunks of 16 bytes; chunk c is stored at slot c ^ (k/8 % 8). This
//     XOR swizzle makes step 1's word stores and step 2's 16-byte loads both
//     free of bank conflicts (a warp's 32 word stores land on 32 banks).
//  3. Each thread loads two 16-byte chunks (16 consecutive m of one k) and
//     stores them to out (16-byte stores; narrower when M or the pointer does
//     not allow 16).
// Tiles on the ragged edges, and inputs whose rows are not 8-element aligned,
// take the guarded element-wise path of step 1 and byte stores in step 3.
//
// Op supplies the element conversion:
//   void begin();                              once per thread, after the loads, before any convert
//   uint2 convert(const Vec<In, 8>&, float& amax) const;  8 elements -> 8 bytes
//   void finish(float amax) const;             once per thread, at the end (all threads)
#pragma once

#include <cstdint>

#include "runtime/cuda_utils.cuh"

namespace te::tile {

constexpr int kTileM = 128;
constexpr int kTileK = 64;
constexpr int kThreads = 256;

template <class In>
struct TileArgs {
  const In* input;  // [rows, cols]
  int64_t rows, cols;
  uint8_t* rowwise;        // [rows, cols] bytes, or null (then the kernel's kRowwise is false)
  uint8_t* columnwise;     // [cols, rows] bytes
  int64_t tiles_k;         // ceil(cols / kTileK)
  bool vector_rows;        // rows hold whole aligned 8-element chunks (input and rowwise)
  int column_store_bytes;  // 16, 8, 4, 2 or 1: widest store the columnwise rows allow
};

// The widest store (16, 8, 4, 2 or 1 bytes) that columnwise rows of `rows`
// bytes starting at `columnwise` allow.
inline int column_store_width(int64_t rows, const uint8_t* columnwise) {
  for (int w = 16; w > 1; w /= 2)
    if (rows % w == 0 && is_aligned(columnwise, w)) return w;
  return 1;
}

// Host side: fills the tiling fields for the given pointers and shape.
template <class In>
TileArgs<In> make_tile_args(const In* input, int64_t rows, int64_t cols, uint8_t* rowwise,
                            uint8_t* columnwise) {
  // tiles_k >= 1 even for cols == 0: the kernel divides by it.
  const int64_t tiles_k = cols > kTileK ? (cols + kTileK - 1) / kTileK : 1;
  TileArgs<In> a{input, rows, cols, rowwise, columnwise, tiles_k, false, 1};
  a.vector_rows = cols % 8 == 0 && is_aligned(input, alignof(Vec<In, 8>)) &&
                  (rowwise == nullptr || is_aligned(rowwise, 8));
  a.column_store_bytes = column_store_width(rows, columnwise);
  return a;
}

inline int64_t num_tiles(int64_t rows, int64_t cols) {
  const int64_t tiles = ((rows + kTileM - 1) / kTileM) * ((cols + kTileK - 1) / kTileK);
  return tiles > 0 ? tiles : 1;  // one block even when empty: block 0 writes the scalars
}

// Rows a, b, c, d of 4 bytes each -> column j in word j: bytes (a_j, b_j, c_j, d_j).
__device__ __forceinline__ void transpose4x4(uint32_t a, uint32_t b, uint32_t c, uint32_t d,
                                             uint32_t* col) {
  const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);
  const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
  col[0] = __byte_perm(ab_lo, cd_lo, 0x5410);
  col[1] = __byte_perm(ab_lo, cd_lo, 0x7632);
  col[2] = __byte_perm(ab_hi, cd_hi, 0x5410);
  col[3] = __byte_perm(ab_hi, cd_hi, 0x7632);
}

// Byte offset in the shared tile of chunk `chunk` (16 m values) of row k.
__device__ __forceinline__ int chunk_offset(int k, int chunk) {
  return k * kTileM + (((chunk ^ (k >> 3)) & 7) << 4);
}

// Stores 16 bytes as pieces of W bytes (W divides the destination's alignment).
template <int W>
__device__ __forceinline__ void store_pieces(uint8_t* dst, const uint4& v) {
  using Piece = Vec<uint8_t, W>;
#pragma unroll
  for (int i = 0; i < 16 / W; ++i)
    *reinterpret_cast<Piece*>(dst + i * W) = reinterpret_cast<const Piece*>(&v)[i];
}

__device__ __forceinline__ void store16(uint8_t* dst, const uint4& v, int width) {
  switch (width) {
    case 16: *reinterpret_cast<uint4*>(dst) = v; break;
    case 8: store_pieces<8>(dst, v); break;
    case 4: store_pieces<4>(dst, v); break;
    case 2: store_pieces<2>(dst, v); break;
    default: store_pieces<1>(dst, v); break;
  }
}

// Step 2: a thread's 4 x 8 bytes (tile rows 4*rg .. 4*rg+3, columns c .. c+7)
// into the shared tile, transposed.
__device__ __forceinline__ void stage_columns(const uint2 (&q)[4], int rg, int c, uint8_t* smem) {
  uint32_t col[8];
  transpose4x4(q[0].x, q[1].x, q[2].x, q[3].x, col);
  transpose4x4(q[0].y, q[1].y, q[2].y, q[3].y, col + 4);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int k = c + j;  // m = 4*rg: chunk rg/4, word rg%4 within it
    *reinterpret_cast<uint32_t*>(smem + chunk_offset(k, rg >> 2) + 4 * (rg & 3)) = col[j];
  }
}

// Step 3 (after a __syncthreads): the shared tile to columnwise[k][m] for the
// tile at (m0, k0) of a [rows, cols] matrix; full: the tile is inside it.
__device__ __forceinline__ void store_columns(const uint8_t* smem, uint8_t* columnwise,
                                              int64_t rows, int64_t cols, int64_t m0, int64_t k0,
                                              bool full, int column_store_bytes) {
#pragma unroll
  for (int pass = 0; pass < kTileK * kTileM / 16 / kThreads; ++pass) {
    const int idx = pass * kThreads + threadIdx.x;
    const int k = idx / (kTileM / 16), chunk = idx % (kTileM / 16);
    const uint4 sixteen = *reinterpret_cast<const uint4*>(smem + chunk_offset(k, chunk));
    const int64_t m = m0 + 16 * chunk;
    uint8_t* dst = columnwise + (k0 + k) * rows + m;
    if (full) {
      store16(dst, sixteen, column_store_bytes);
    } else if (k0 + k < cols) {
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&sixteen);
#pragma unroll
      for (int b = 0; b < 16; ++b)
        if (m + b < rows) dst[b] = bytes[b];
    }
  }
}

template <class In, class Op, bool kRowwise>
__global__ void __launch_bounds__(kThreads) cast_transpose_kernel(TileArgs<In> a, Op op) {
  __shared__ alignas(16) uint8_t smem[kTileK * kTileM];
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) / a.tiles_k) * kTileM;
  const int64_t k0 = (static_cast<int64_t>(blockIdx.x) % a.tiles_k) * kTileK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp * 4 + lane / 8;  // this thread's rows: 4*rg .. 4*rg+3 of the tile
  const int c = (lane % 8) * 8;        // its columns: c .. c+7
  const bool full = m0 + kTileM <= a.rows && k0 + kTileK <= a.cols;
  const int64_t row = m0 + 4 * rg;

  // All loads are issued before op.begin(), which may wait on a global load
  // of its own (the scale): the tile's loads then overlap that latency.
  const bool vector_path = full && a.vector_rows;
  Vec<In, 8> v[4];
  if (vector_path) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = load_vec<In, 8>(a.input + (row + i) * a.cols + k0 + c);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t k = k0 + c + j;
        // Out-of-range elements are zero: they leave amax unchanged and their
        // bytes are never stored.
        v[i].v[j] = (row + i < a.rows && k < a.cols) ? a.input[(row + i) * a.cols + k] : In{};
      }
    }
  }
  op.begin();
  float amax = 0.0f;
  uint2 q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) q[i] = op.convert(v[i], amax);
  if constexpr (kRowwise) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint8_t* dst = a.rowwise + (row + i) * a.cols + k0 + c;
      if (vector_path) {
        *reinterpret_cast<uint2*>(dst) = q[i];
      } else {
        const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&q[i]);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (row + i < a.rows && k0 + c + j < a.cols) dst[j] = bytes[j];
      }
    }
  }

  stage_columns(q, rg, c, smem);
  __syncthreads();
  store_columns(smem, a.columnwise, a.rows, a.cols, m0, k0, full, a.column_store_bytes);
  op.finish(amax);
}

}  // namespace te::tile
