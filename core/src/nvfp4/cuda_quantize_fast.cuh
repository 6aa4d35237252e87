// The NVFP4 quantize kernel of the common case: 16-bit input (BF16/FP16),
// 1x16 blocks, round to nearest even, no RHT. The other options take the
// general kernel of cuda_quantize.cu. Same arithmetic (formulas.h), same bytes.
//
// Why it is shaped this way (design reasoning; the measurements are
// bench/kernels/run_nvfp4_variants.sh's). The general kernel writes its
// outputs in small pieces: per 64x128 tile about 512 warp-level store
// requests of 4 to 32 bytes (8-byte rowwise codes and single scale bytes from
// lanes of 8 rows, 32-byte columnwise pieces, 4-byte columnwise scales),
// where the per-tensor FP8 cast-transpose (transpose/tile.cuh, 86% of copy)
// needs about 192 requests of 64-128 bytes for as many elements; and it
// spends ~13 instructions per element and direction, half of them on the
// half-rate integer pipe. Here:
//  - rowwise: a lane quantizes two neighbouring blocks of a row (32 elements)
//    and stores their 16 code bytes at once; 4 lanes cover a tile row (64
//    contiguous bytes per request), and the lane's two scale bytes go out as
//    one 2-byte store (8 contiguous bytes per row and request);
//  - columnwise: the codes are staged in shared memory, [tile column][m], so
//    that a k-row of the transposed output (kTileRows / 2 bytes: 64 for 128
//    tile rows) is written by 4 lanes with 16-byte stores, and its
//    kTileRows / 16 scale bytes by one lane with one 8-byte (or 4-byte) store;
//  - E2M1 rounding by the min-of-three route (kMin3), mostly FP32 operations;
//    block amaxes as trees (more independent instructions than a chain);
//  - kPacked candidates (11-14): the kernel is bound by instruction issue
//    (~12.5 SASS instructions per element and direction for candidate 2), so
//    the common blocks take packed.h's route: block amax on 16-bit pairs,
//    no saturation step, signs gathered by byte permutes (~11.1; counts by
//    bench/kernels/count_nvfp4_sass.sh). Same bytes: blocks with NaN,
//    infinities or saturation (amax * enc_b >= 7) take formulas.h's route,
//    per warp (one uniform branch per lane's block pair).
// Tile: kTileRows x 128 elements (256 bytes per row), copied into shared
// memory with cp.async; one tile per CTA, several CTAs per SM, so the loads of
// one CTA overlap the arithmetic of the others (as in tile.cuh), or (the
// kPersistent candidates) a loop over tiles with the next tile's copy in
// flight during the current one's arithmetic.
// The shared input tile has cuda_common.cuh's swizzled 256-byte rows: the
// rowwise lanes (8 rows x 16-byte chunks per quarter warp) and the
// columnwise lanes (32 consecutive 4-byte words of one row) read without bank
// conflicts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "nvfp4/backend.h"
#include "nvfp4/cuda_common.cuh"
#include "nvfp4/formulas.h"
#include "nvfp4/packed.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"

namespace te::nvfp4::cuda::fast {

// A candidate shape of the kernel: tile rows, threads per CTA, the CTAs per
// SM that __launch_bounds__ asks registers for (65536 / (threads * min)
// registers per thread), the E2M1 rounding route (kMin3: formulas.h's
// e2m1_nearest_min3_biased, 4 FP32 + 2 integer operations per element
// instead of 2 FP32 + 5 integer ones; the same codes) and the schedule
// (kPersistent: one wave of CTAs loops over the tiles, copying the next tile
// into a second shared buffer while it quantizes the current one; else one
// tile per CTA, the overlap coming from the other CTAs of the SM).
// kPacked: the common blocks take packed.h's route (packed amax, no
// saturation, signs by byte permutes), the others formulas.h's (kMin3).
template <int kTileRowsT, int kThreadsT, int kMinBlocksT, bool kMin3T, bool kPersistentT = false,
          bool kPackedT = false>
struct Config {
  static constexpr int kTileRows = kTileRowsT;
  static constexpr int kThreads = kThreadsT;
  static constexpr int kMinBlocks = kMinBlocksT;
  static constexpr bool kMin3 = kMin3T || kPackedT;
  static constexpr bool kPersistent = kPersistentT;
  static constexpr bool kPacked = kPackedT;
  // Instruction counting only (bench/kernels/nvfp4_count_sass.cu shadows it):
  // the general route of the kPacked candidates is left out. Wrong bytes.
  static constexpr bool kCommonRouteOnly = false;
  static constexpr int kStages = kPersistent ? 2 : 1;
  static_assert(kTileRows == 64 || kTileRows == 128, "tile rows: 64 or 128");
  // Every thread takes the same number of rowwise row groups, columnwise
  // units and columnwise store pieces.
  static_assert(kThreads % 32 == 0 && (kTileRows / 8) % (kThreads / 32) == 0 &&
                    (64 * kTileRows / 16) % kThreads == 0 && (64 * kTileRows / 16) >= kThreads,
                "threads must divide the tile's work evenly");
};

// The candidates measured by bench/kernels/run_nvfp4_variants.sh.
template <int kIndex>
struct Candidate;
template <>
struct Candidate<0> : Config<64, 256, 4, false> {};
template <>
struct Candidate<1> : Config<128, 256, 4, false> {};
template <>
struct Candidate<2> : Config<128, 256, 4, true> {};
template <>
struct Candidate<3> : Config<128, 512, 2, true> {};
template <>
struct Candidate<4> : Config<128, 256, 3, true> {};
template <>
struct Candidate<5> : Config<64, 256, 4, true> {};
template <>
struct Candidate<6> : Config<64, 256, 3, true, true> {};
// (7-10: schedule reshapes measured on an earlier branch, not faster; gone.)
template <>
struct Candidate<11> : Config<128, 256, 4, true, false, true> {};
template <>
struct Candidate<12> : Config<64, 256, 4, true, false, true> {};
template <>
struct Candidate<13> : Config<128, 256, 3, true, false, true> {};
template <>
struct Candidate<14> : Config<128, 512, 2, true, false, true> {};
// The indices that exist, for the measuring driver.
inline constexpr int kCandidateIds[] = {0, 1, 2, 3, 4, 5, 6, 11, 12, 13, 14};

constexpr int kCols = 128;  // tile columns (16-bit elements)
constexpr int kRowBytes = kTileRowBytes;
constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per tile row
constexpr int kWordCols = kCols / 2;     // 32-bit word columns per tile row
constexpr int kEncTable = 128;           // enc_b for every s_b the quantizer writes

struct Args {
  const uint8_t* input;  // [rows, cols] of 16-bit elements
  int64_t rows, cols;
  int64_t tiles_k;
  uint8_t *row_data, *row_scale;  // row_data null: no rowwise output
  int64_t row_scale_cols;
  const float* row_amax;
  uint8_t *col_data, *col_scale;  // col_data null: no columnwise output
  int64_t col_scale_cols;
  const float* col_amax;
  bool row_store16;       // K % 32 == 0: rowwise rows hold whole 16-byte pieces
  bool row_scale_store2;  // rowwise scale pointer 2-byte aligned
  bool col_store16;       // M % 32 == 0: columnwise rows hold whole 16-byte pieces
  bool col_scale_store;   // columnwise scale rows allow kTileRows / 16-byte stores
};

template <int kTileRows, int kStages = 1>
struct Shared {
  static constexpr int kGroups = kTileRows / kBlock;  // columnwise blocks per tile column
  alignas(16) uint8_t data[kStages][kTileRows * kRowBytes];
  // Columnwise codes, [tile column][row group] of 8 bytes, slot g ^ swizzle(c).
  alignas(16) uint8_t col_codes[kCols][kGroups * 8];
  alignas(8) uint8_t col_scales[kCols][kGroups];  // [tile column][row group]
  float enc[2][kEncTable];                        // [rowwise, columnwise][s_b]
};

// Slot of row group g in the staged codes of tile column c. Columns 2w and
// 2w + 1 are written by one lane; the swizzle spreads the 8-byte stores of
// lanes w = 0..7 over 8 slots.
template <int kGroups>
__device__ __forceinline__ int code_slot(int c, int g) {
  return g ^ ((c >> 1) & (kGroups - 1));
}

// max |v_i| with NaN skipped (0 when all are NaN), as block_abs_max, but as a
// tree: fmaxf ignores a NaN operand, and the final max with 0 turns an
// all-NaN block's NaN into 0.
__device__ __forceinline__ float tree_abs_max(const float v[kBlock]) {
  float m[kBlock / 2];
#pragma unroll
  for (int i = 0; i < kBlock / 2; ++i) m[i] = fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1]));
#pragma unroll
  for (int n = kBlock / 4; n >= 1; n /= 2) {
#pragma unroll
    for (int i = 0; i < n; ++i) m[i] = fmaxf(m[i], m[i + n]);
  }
  return fmaxf(m[0], 0.0f);
}

// One block: scale byte and 16 codes (element i in bits 4i..4i+3).
struct Block {
  uint2 codes;
  uint8_t scale;
};

// block_amax: max |v_i| (NaN skipped, 0 when all NaN).
template <bool kMin3>
__device__ __forceinline__ Block quantize_block(const float v[kBlock], float block_amax,
                                                float s_enc, const float* enc) {
  const uint8_t s_b = block_scale(block_amax, s_enc);
  const float e = enc[s_b];
  return Block{
      make_uint2(encode8<false, kMin3>(v, e, nullptr), encode8<false, kMin3>(v + 8, e, nullptr)),
      s_b};
}

// Block b of tile row r (two 16-byte chunks) quantized.
template <class C, class T>
__device__ __forceinline__ Block row_block(const uint8_t* data, int r, int b, float s_enc,
                                           const float* enc) {
  uint32_t w[kBlock / 2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const uint4 c = *reinterpret_cast<const uint4*>(data + tile_chunk_offset(r, 2 * b + q));
    w[4 * q] = c.x;
    w[4 * q + 1] = c.y;
    w[4 * q + 2] = c.z;
    w[4 * q + 3] = c.w;
  }
  float v[kBlock];
#pragma unroll
  for (int i = 0; i < kBlock / 2; ++i) word_to_floats(w[i], v + 2 * i, T{});
  return quantize_block<C::kMin3>(v, tree_abs_max(v), s_enc, enc);
}

// ---- kPacked: packed.h's route for the common blocks ----------------------

template <class T>
struct PackedFormat;
template <>
struct PackedFormat<__nv_bfloat16> {
  using type = packed::Bf16Bits;
};
template <>
struct PackedFormat<__half> {
  using type = packed::Fp16Bits;
};

// The block of 16 elements x[i] by formulas.h's route (any values).
template <class C>
__device__ __forceinline__ Block general_block(const float x[kBlock], float s_enc,
                                               const float* enc) {
  if constexpr (C::kCommonRouteOnly) return Block{};
  return quantize_block<C::kMin3>(x, tree_abs_max(x), s_enc, enc);
}

// The branch between the two routes, taken by the whole warp (a uniform
// branch: no reconvergence bookkeeping): the common route only when every
// active lane's blocks are small.
__device__ __forceinline__ bool warp_all(bool p) { return __all_sync(__activemask(), p); }

__device__ __forceinline__ Block to_block(uint64_t codes, uint8_t scale) {
  return Block{make_uint2(static_cast<uint32_t>(codes), static_cast<uint32_t>(codes >> 32)), scale};
}

// Rowwise blocks 2u and 2u + 1 of tile row r (the lane's pair, as rowwise()).
// One branch for both: small blocks (the common case) by packed.h, else both
// by formulas.h.
template <class C, class T>
__device__ __forceinline__ void row_block_pair(const uint8_t* data, int r, int u, float s_enc,
                                               const float* enc_table, Block& b0, Block& b1) {
  using Fmt = typename PackedFormat<T>::type;
  uint32_t w[2][kBlock / 2];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 c = *reinterpret_cast<const uint4*>(data + tile_chunk_offset(r, 4 * u + q));
    uint32_t* d = &w[q / 2][4 * (q % 2)];
    d[0] = c.x;
    d[1] = c.y;
    d[2] = c.z;
    d[3] = c.w;
  }
  float amax[2], enc[2];
  uint8_t s_b[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    amax[q] = packed::row_block_abs_max_nan(w[q], Fmt{});  // NaN when the block has one
    s_b[q] = block_scale(amax[q], s_enc);
    enc[q] = enc_table[s_b[q]];
  }
  if (warp_all(packed::small_block(amax[0], enc[0]) && packed::small_block(amax[1], enc[1]))) {
    b0 = to_block(packed::small_row_block(w[0], enc[0], Fmt{}), s_b[0]);
    b1 = to_block(packed::small_row_block(w[1], enc[1], Fmt{}), s_b[1]);
  } else {
    float v[kBlock];
#pragma unroll
    for (int i = 0; i < kBlock / 2; ++i) word_to_floats(w[0][i], v + 2 * i, T{});
    b0 = general_block<C>(v, s_enc, enc_table);
#pragma unroll
    for (int i = 0; i < kBlock / 2; ++i) word_to_floats(w[1][i], v + 2 * i, T{});
    b1 = general_block<C>(v, s_enc, enc_table);
  }
}

// Element j (0: low half, 1: high half) of each of the 16 words: one column
// of a columnwise block pair, as FP32.
template <class T>
__device__ __forceinline__ void column_floats(const uint32_t word[kBlock], int j, float x[kBlock]) {
#pragma unroll
  for (int i = 0; i < kBlock; ++i) {
    float pair[2];
    word_to_floats(word[i], pair, T{});
    x[i] = pair[j];
  }
}

// Columnwise blocks of word column w (tile columns 2w, 2w + 1) over the 16
// rows of word[]: small blocks by packed.h, else formulas.h.
template <class C, class T>
__device__ __forceinline__ void column_block_pair(const uint32_t word[kBlock], float s_enc,
                                                  const float* enc_table, Block b[2]) {
  using Fmt = typename PackedFormat<T>::type;
  const uint32_t m = packed::words_abs_max_nan<kBlock>(word, Fmt{});
  const float amax[2] = {fabsf(packed::low_float(m, Fmt{})), fabsf(packed::high_float(m, Fmt{}))};
  float enc[2];
  uint8_t s_b[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    s_b[j] = block_scale(amax[j], s_enc);
    enc[j] = enc_table[s_b[j]];
  }
  if (warp_all(packed::small_block(amax[0], enc[0]) && packed::small_block(amax[1], enc[1]))) {
    uint64_t codes[2];
    packed::small_column_blocks(word, enc[0], enc[1], Fmt{}, codes[0], codes[1]);
    b[0] = to_block(codes[0], s_b[0]);
    b[1] = to_block(codes[1], s_b[1]);
  } else {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float x[kBlock];
      column_floats<T>(word, j, x);
      b[j] = general_block<C>(x, s_enc, enc_table);
    }
  }
}

// Rowwise: lane l of warp w takes, in pass p, tile row 8 (p * warps + w) + l % 8
// and its blocks 2u, 2u + 1 (u = l / 8, columns 32u .. 32u + 31).
template <class C, class T>
__device__ __forceinline__ void rowwise(const Args& a, const Shared<C::kTileRows, C::kStages>& sm,
                                        const uint8_t* data, int64_t m0, int64_t k0, int rows,
                                        int cols, float s_enc) {
  constexpr int kWarps = C::kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, u = lane / 8;
  if (32 * u >= cols) return;  // whole blocks: K % 16 == 0
  const bool second = 32 * u + kBlock < cols;
  const int64_t data_row = a.cols / 2;
#pragma unroll
  for (int p = 0; p < C::kTileRows / 8 / kWarps; ++p) {
    const int r = 8 * (p * kWarps + warp) + lane % 8;
    if (r >= rows) break;  // rows grow with p
    // Past the edge (!second): b1 computed from stale bytes, not stored.
    Block b0, b1;
    if constexpr (C::kPacked) {
      row_block_pair<C, T>(data, r, u, s_enc, sm.enc[0], b0, b1);
    } else {
      b0 = row_block<C, T>(data, r, 2 * u, s_enc, sm.enc[0]);
      b1 = row_block<C, T>(data, r, 2 * u + 1, s_enc, sm.enc[0]);
    }
    uint8_t* out = a.row_data + (m0 + r) * data_row + k0 / 2 + 16 * u;
    uint8_t* scale = a.row_scale + (m0 + r) * a.row_scale_cols + k0 / kBlock + 2 * u;
    if (second && a.row_store16) {
      *reinterpret_cast<uint4*>(out) = make_uint4(b0.codes.x, b0.codes.y, b1.codes.x, b1.codes.y);
    } else {
      *reinterpret_cast<uint2*>(out) = b0.codes;
      if (second) *reinterpret_cast<uint2*>(out + 8) = b1.codes;
    }
    if (second && a.row_scale_store2) {
      *reinterpret_cast<uint16_t*>(scale) = static_cast<uint16_t>(b0.scale | (b1.scale << 8));
    } else {
      scale[0] = b0.scale;
      if (second) scale[1] = b1.scale;
    }
  }
}

// Columnwise, step 1: unit (word column w, row group h) quantizes the blocks
// of tile columns 2w and 2w + 1 over rows 16h .. 16h + 15 into the staging area.
template <class C, class T>
__device__ __forceinline__ void columnwise(Shared<C::kTileRows, C::kStages>& sm,
                                           const uint8_t* data, int rows, int cols, float s_enc) {
  constexpr int kGroups = Shared<C::kTileRows, C::kStages>::kGroups;
#pragma unroll
  for (int it = 0; it < kWordCols * kGroups / C::kThreads; ++it) {
    const int unit = it * C::kThreads + static_cast<int>(threadIdx.x);
    const int w = unit % kWordCols, h = unit / kWordCols;
    if (kBlock * h >= rows || 2 * w >= cols) continue;  // whole blocks: M, K % 16 == 0
    uint32_t word[kBlock];
#pragma unroll
    for (int i = 0; i < kBlock; ++i)
      word[i] = *reinterpret_cast<const uint32_t*>(data + tile_chunk_offset(kBlock * h + i, w / 4) +
                                                   4 * (w % 4));
    Block blocks[2];
    if constexpr (C::kPacked) {
      column_block_pair<C, T>(word, s_enc, sm.enc[1], blocks);
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float x[kBlock];
        column_floats<T>(word, j, x);
        blocks[j] = quantize_block<C::kMin3>(x, tree_abs_max(x), s_enc, sm.enc[1]);
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const Block& b = blocks[j];
      const int c = 2 * w + j;
      *reinterpret_cast<uint2*>(&sm.col_codes[c][8 * code_slot<kGroups>(c, h)]) = b.codes;
      sm.col_scales[c][h] = b.scale;
    }
  }
}

// Columnwise, step 2 (after a barrier): k-row k0 + c of the output gets its
// kTileRows / 2 code bytes from 16-byte pieces (lane (c, piece)) and its
// kTileRows / 16 scale bytes from one lane.
template <class C>
__device__ __forceinline__ void store_columnwise(const Args& a,
                                                 const Shared<C::kTileRows, C::kStages>& sm,
                                                 int64_t m0, int64_t k0, int rows, int cols) {
  constexpr int kGroups = Shared<C::kTileRows, C::kStages>::kGroups;
  constexpr int kPieces = kGroups / 2;
  const int64_t data_row = a.rows / 2;
#pragma unroll
  for (int it = 0; it < kCols * kPieces / C::kThreads; ++it) {
    const int idx = it * C::kThreads + static_cast<int>(threadIdx.x);
    const int c = idx / kPieces, piece = idx % kPieces;
    if (c >= cols || 32 * piece >= rows) continue;
    // Groups 2 piece and 2 piece + 1 sit in one aligned slot pair, swapped
    // when the swizzle is odd.
    const int swz = (c >> 1) & (kGroups - 1);
    const uint4 pair = *reinterpret_cast<const uint4*>(&sm.col_codes[c][16 * (piece ^ (swz >> 1))]);
    const uint2 lo = (swz & 1) ? make_uint2(pair.z, pair.w) : make_uint2(pair.x, pair.y);
    const uint2 hi = (swz & 1) ? make_uint2(pair.x, pair.y) : make_uint2(pair.z, pair.w);
    uint8_t* out = a.col_data + (k0 + c) * data_row + m0 / 2 + 16 * piece;
    if (32 * piece + kBlock < rows) {
      if (a.col_store16) {
        *reinterpret_cast<uint4*>(out) = make_uint4(lo.x, lo.y, hi.x, hi.y);
      } else {
        *reinterpret_cast<uint2*>(out) = lo;
        *reinterpret_cast<uint2*>(out + 8) = hi;
      }
    } else {
      *reinterpret_cast<uint2*>(out) = lo;
    }
  }
  for (int c = threadIdx.x; c < cols; c += C::kThreads) {
    uint8_t* scale = a.col_scale + (k0 + c) * a.col_scale_cols + m0 / kBlock;
    if (rows == C::kTileRows && a.col_scale_store) {
      if constexpr (kGroups == 8) {
        *reinterpret_cast<uint2*>(scale) = *reinterpret_cast<const uint2*>(sm.col_scales[c]);
      } else if constexpr (kGroups == 4) {
        *reinterpret_cast<uint32_t*>(scale) = *reinterpret_cast<const uint32_t*>(sm.col_scales[c]);
      } else {
        for (int g = 0; g < kGroups; ++g) scale[g] = sm.col_scales[c][g];
      }
    } else {
      for (int g = 0; g < kGroups && kBlock * g < rows; ++g) scale[g] = sm.col_scales[c][g];
    }
  }
}

// Where a tile is: its first row and column and its extent.
struct TileView {
  int64_t m0, k0;
  int rows, cols;
};

template <class C>
__device__ __forceinline__ TileView tile_view(const Args& a, int64_t tile) {
  const int64_t m0 = tile / a.tiles_k * C::kTileRows, k0 = tile % a.tiles_k * kCols;
  return TileView{m0, k0, static_cast<int>(a.rows - m0 < C::kTileRows ? a.rows - m0 : C::kTileRows),
                  static_cast<int>(a.cols - k0 < kCols ? a.cols - k0 : kCols)};
}

// Copies the tile into shared memory at dst (a shared-window address) and
// commits the copies as one group: thread t copies chunk t % 16 of rows
// t / 16, t / 16 + threads / 16, ... (16 threads read a 256-byte row run).
template <class C>
__device__ __forceinline__ void load_tile(const Args& a, const TileView& t, uint32_t dst) {
  const int c = threadIdx.x % kChunks;
  if (16 * c < 2 * t.cols) {
    const int64_t row_bytes = 2 * a.cols;
    const uint8_t* src = a.input + t.m0 * row_bytes + 2 * t.k0 + 16 * c;
#pragma unroll 4
    for (int r = threadIdx.x / kChunks; r < t.rows; r += C::kThreads / kChunks)
      copy16_async(dst + tile_chunk_offset(r, c), src + r * row_bytes);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <class C, class T>
__device__ __forceinline__ void quantize_tile(const Args& a, Shared<C::kTileRows, C::kStages>& sm,
                                              const uint8_t* data, const TileView& t,
                                              float row_s_enc, float col_s_enc) {
  if (a.row_data) rowwise<C, T>(a, sm, data, t.m0, t.k0, t.rows, t.cols, row_s_enc);
  if (a.col_data) {
    columnwise<C, T>(sm, data, t.rows, t.cols, col_s_enc);
    __syncthreads();  // staging complete
    store_columnwise<C>(a, sm, t.m0, t.k0, t.rows, t.cols);
  }
}

template <class C, class T>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) quantize_kernel(const Args a) {
  __shared__ Shared<C::kTileRows, C::kStages> sm;
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(sm.data));
  constexpr uint32_t kStageBytes = C::kTileRows * kRowBytes;
  int64_t tile = blockIdx.x;
  TileView t = tile_view<C>(a, tile);
  load_tile<C>(a, t, smem);

  // While the copies fly: global scales and the enc_b tables.
  const float row_s_enc = a.row_data ? global_encode_scale(*a.row_amax) : 1.0f;
  const float col_s_enc = a.col_data ? global_encode_scale(*a.col_amax) : 1.0f;
  for (int i = threadIdx.x; i < 2 * kEncTable; i += C::kThreads) {
    const int dir = i / kEncTable, s_b = i % kEncTable;
    if (dir == 0 ? a.row_data == nullptr : a.col_data == nullptr) continue;  // not read
    sm.enc[dir][s_b] = block_encode_factor(static_cast<uint8_t>(s_b),
                                           global_decode_scale(dir == 0 ? row_s_enc : col_s_enc));
  }

  if constexpr (!C::kPersistent) {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    quantize_tile<C, T>(a, sm, sm.data[0], t, row_s_enc, col_s_enc);
  } else {
    const int64_t tiles = (a.rows + C::kTileRows - 1) / C::kTileRows * a.tiles_k;
    for (int it = 0; tile < tiles; ++it) {
      // Prefetch the next tile into the other stage (free: its readers passed
      // the barrier that ended the previous iteration), then wait for this one.
      const int64_t next = tile + gridDim.x;
      const TileView nt = next < tiles ? tile_view<C>(a, next) : t;
      if (next < tiles) {
        load_tile<C>(a, nt, smem + ((it + 1) % 2) * kStageBytes);
      } else {
        asm volatile("cp.async.commit_group;\n" ::: "memory");  // an empty group
      }
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      __syncthreads();
      quantize_tile<C, T>(a, sm, sm.data[it % 2], t, row_s_enc, col_s_enc);
      __syncthreads();  // the stage and the staging area may be overwritten
      tile = next;
      t = nt;
    }
  }
}

// Whether the fast kernel handles these arguments.
inline bool applies(const QuantizeArgs& q) {
  const Options& o = q.options;
  return (q.input_dtype == TE_DTYPE_BFLOAT16 || q.input_dtype == TE_DTYPE_FLOAT16) && !o.block_2d &&
         !o.stochastic_rounding && !o.random_hadamard;
}

// Launches the fast kernel (scale padding is the caller's; rows, cols > 0).
template <class C>
void launch(const QuantizeArgs& q, cudaStream_t stream) {
  const Direction& rw = q.rowwise;
  const Direction& cw = q.columnwise;
  const int64_t tiles_k = ceil_div(q.cols, kCols);
  const int64_t tiles = ceil_div(q.rows, C::kTileRows) * tiles_k;
  if (tiles > 0x7FFFFFFF)
    fail(TE_ERROR_UNSUPPORTED, "NVFP4 quantize: tensor too large (", tiles, " tiles)");
  constexpr int kGroups = C::kTileRows / kBlock;
  const Args a{
      static_cast<const uint8_t*>(q.input),
      q.rows,
      q.cols,
      tiles_k,
      rw.data,
      rw.scale,
      rw.scale_cols,
      rw.amax,
      cw.data,
      cw.scale,
      cw.scale_cols,
      cw.amax,
      q.cols % 32 == 0,
      rw.data == nullptr || is_aligned(rw.scale, 2),
      q.rows % 32 == 0,
      cw.data == nullptr || (is_aligned(cw.scale, kGroups) && cw.scale_cols % kGroups == 0)};
  auto body = [&](auto tag) {
    const auto kernel = quantize_kernel<C, decltype(tag)>;
    const int64_t grid = C::kPersistent ? persistent_blocks(reinterpret_cast<const void*>(kernel),
                                                            C::kThreads, tiles)
                                        : tiles;
    kernel<<<static_cast<unsigned>(grid), C::kThreads, 0, stream>>>(a);
  };
  if (q.input_dtype == TE_DTYPE_BFLOAT16) {
    body(__nv_bfloat16{});
  } else {
    body(__half{});
  }
  TE_CHECK_LAUNCH();
}

}  // namespace te::nvfp4::cuda::fast
