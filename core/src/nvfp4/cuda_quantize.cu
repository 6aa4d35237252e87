// The general NVFP4 quantize kernel (every option and input type; the common
// case, 16-bit input with 1x16 blocks, RNE and no RHT, takes the kernel of
// cuda_quantize_fast.cuh): one pass over the input writes the rowwise and
// the columnwise (transposed) outputs with their scales. Byte-identical to the
// CPU backend: the element and scale arithmetic is formulas.h, the RHT
// hadamard.h and the random words philox.h, the same code on both sides.
//
// Why it is shaped this way (32768x4096 BF16 on an H200): a direction costs
// ~12 instructions per element (E2M1 rounding ~9, amax, conversion), so both
// directions take about as long to issue as the copy takes to move the bytes.
// The kernel therefore overlaps the two: it is persistent (one wave of CTAs
// loops over the tiles) and copies the next tile into shared memory with
// cp.async while it computes the current one (two stages), so the loads never
// wait for the arithmetic. Everything else avoids redundant work: the block
// encode factors enc_b = 1 / (float(s_b) * S_dec) (an IEEE division) come from
// a 128-entry table per direction built once per CTA, and with 16x16 blocks
// the columnwise codes are the rowwise ones (when both directions have the
// same amax), transposed in registers.
//
// Tile: 64 rows x 256 bytes (BF16/FP16: 64 x 128, FP32: 64 x 64), 256 threads.
// Shared memory row r holds its 16-byte chunk c at chunk c ^ (r % 8) (an XOR
// swizzle), which keeps both access patterns below free of bank conflicts.
//  1. Rowwise: a warp takes 8 rows x 4 blocks (16 rows x 2 blocks with 16x16
//     blocks); each lane reads one 16-element block (16-byte reads), takes
//     its amax (16x16: the tile amax, reduced over the 16 lanes with
//     shuffles), quantizes it and stores 8 bytes of data and its scale byte.
//  2. Columnwise: a thread takes one 32-bit word column (2 BF16/FP16 columns
//     or 1 FP32 column) of 16 rows: 16 4-byte reads, RHT'd when asked, one
//     block per column. Its 8 code bytes per column go to a staging area.
//     (16x16: step 1 already produced them, transposed across the lanes.)
//  3. After a barrier, lane pairs store each column's 32 code bytes (64 rows)
//     as 16-byte stores (8 when M % 32 != 0) and its 4 scale bytes at once.
// Traffic per element: sizeof(x) read, 1/2 + 1/2 byte written, + 2/16 scale
// bytes. No atomics, no host synchronization, no allocation; padding of the
// scale buffers is cleared by memset nodes.
#include "nvfp4/backend.h"
#include "nvfp4/cuda_common.cuh"
#include "nvfp4/cuda_quantize_fast.cuh"
#include "nvfp4/hadamard.h"
#include "nvfp4/philox.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"

namespace te::nvfp4::cuda {
namespace {

constexpr int kTileRows = 64;
constexpr int kRowBytes = kTileRowBytes;        // bytes of a tile row
constexpr int kChunks = kRowBytes / 16;         // 16-byte chunks of a tile row
constexpr int kRowGroups = kTileRows / kBlock;  // columnwise blocks per tile column
constexpr int kStages = 2;
constexpr int kWarps = kThreads / 32;
constexpr int kEncTable = 128;  // enc_b for every s_b the quantizer writes (0x00..0x7E)

template <class T>
struct Tile {
  static constexpr int kCols = kRowBytes / static_cast<int>(sizeof(T));              // 128 or 64
  static constexpr int kBlocksPerRow = kCols / kBlock;                               // 8 or 4
  static constexpr int kChunksPerBlock = kBlock * static_cast<int>(sizeof(T)) / 16;  // 2 or 4
  static constexpr int kWordCols = 4 / static_cast<int>(sizeof(T));  // columns per 32-bit word
  static constexpr int kWords = kCols / kWordCols;                   // 64 words per row
  static_assert(kWords * kRowGroups == kThreads, "one (word column, row group) per thread");
};

struct SharedTile {
  alignas(16) uint8_t data[kStages][kTileRows * kRowBytes];
  alignas(16) uint8_t col_codes[kRowGroups][128 * 8];  // [row group][column]: 16 codes
  alignas(4) uint8_t col_scales[128][kRowGroups];      // [column][row group]
  float enc[2][kEncTable];                             // [rowwise, columnwise][s_b]
};

__device__ __forceinline__ void commit_async() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void wait_async_but_one() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// One direction's output as the kernel sees it.
struct Out {
  uint8_t* data;  // null: direction not requested
  uint8_t* scale;
  int64_t scale_cols;
  const float* amax;
};

struct KernelArgs {
  const void* input;
  int64_t rows, cols, tiles_k, tiles;
  Out row, col;
  uint32_t sign_mask;
  const int64_t* rng_state;  // (seed, offset), device memory; SR only
  bool col_store16;          // M % 32 == 0: 16-byte columnwise data stores
  bool col_scale_store4;     // columnwise scale pointer 4-byte aligned
};

// The 16 codes of a block with encode factor enc (RNE, or SR with 16 words).
template <bool kSR>
__device__ __forceinline__ uint2 encode16(const float v[kBlock], float enc,
                                          const uint32_t* random) {
  return make_uint2(encode8<kSR>(v, enc, random),
                    encode8<kSR>(v + 8, enc, kSR ? random + 8 : nullptr));
}

// Transposes a 16x16 tile of nibbles held by 16 lanes (lane l of the group:
// row l, nibble j = column j, as {lo: nibbles 0-7, hi: 8-15}); afterwards lane
// l holds column l (nibble i = row i). Four swap steps of the recursive block
// transpose: for s = 8, 4, 2, 1 the lanes l and l ^ s exchange the
// off-diagonal s x s blocks of every 2s x 2s block. Every lane must call it.
__device__ __forceinline__ uint2 transpose16_nibbles(uint2 t) {
  const int lane = threadIdx.x & 31;
  uint32_t lo = t.x, hi = t.y;
  // s = 8: 32-bit halves.
  {
    const bool b = lane & 8;
    const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, b ? lo : hi, 8);
    if (b)
      lo = got;
    else
      hi = got;
  }
  // s = 4: the upper 16 bits of each half go to the partner (lane bit 2 clear),
  // or the lower ones (set).
  {
    const bool b = lane & 4;
    const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, __byte_perm(lo, hi, b ? 0x5410 : 0x7632), 4);
    lo = __byte_perm(lo, got, b ? 0x3254 : 0x5410);
    hi = __byte_perm(hi, got, b ? 0x3276 : 0x7610);
  }
  // s = 2: odd bytes (bit 1 clear) or even bytes (set) of each 16-bit quarter.
  {
    const bool b = lane & 2;
    const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, __byte_perm(lo, hi, b ? 0x6420 : 0x7531), 2);
    lo = __byte_perm(lo, got, b ? 0x3514 : 0x5240);
    hi = __byte_perm(hi, got, b ? 0x3716 : 0x7260);
  }
  // s = 1: high nibbles (bit 0 clear) or low nibbles (set) of every byte.
  {
    const bool b = lane & 1;
    constexpr uint32_t kLow = 0x0F0F0F0Fu, kHigh = 0xF0F0F0F0u;
    const uint32_t send = b ? (lo & kLow) | ((hi << 4) & kHigh) : ((lo >> 4) & kLow) | (hi & kHigh);
    const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, send, 1);
    if (b) {
      lo = (lo & kHigh) | (got & kLow);
      hi = (hi & kHigh) | ((got >> 4) & kLow);
    } else {
      lo = (lo & kLow) | ((got << 4) & kHigh);
      hi = (hi & kLow) | (got & kHigh);
    }
  }
  return make_uint2(lo, hi);
}

// Per-CTA constants of one direction.
struct DirectionScales {
  float s_enc;
  const float* enc;  // shared-memory table enc[s_b]
  __device__ uint8_t scale(float block_amax) const { return block_scale(block_amax, s_enc); }
};

// Where the current tile is: its first row and column, how many of its rows
// and columns exist, and its corner in each output.
struct TileView {
  int64_t m0, k0;
  int rows, cols;        // min(M - m0, 64), min(K - k0, kCols)
  const uint8_t* input;  // &input[m0][k0]
  const uint8_t* data;   // the shared-memory stage holding it
  uint8_t* row_data;     // &rowwise[m0][k0]
  uint8_t* row_scale;    // &rowwise_scale[m0][k0 / 16]
  uint8_t* col_data;     // &columnwise[k0][m0]
  uint8_t* col_scale;    // &columnwise_scale[k0][m0 / 16]
};

// Step 1 (rowwise blocks; with 16x16 blocks also the columnwise codes). Pass
// p of warp w: unit p * 8 + w, R rows x (32 / R) blocks; lane l takes row
// l % R and block l / R of it.
template <class T, bool k2D>
struct RowwiseLane {
  static constexpr int R = k2D ? kBlock : 8;
  static constexpr int kUnitBlocks = 32 / R;
  static constexpr int kUnitsPerRow = Tile<T>::kBlocksPerRow / kUnitBlocks;
  static constexpr int kPasses = kTileRows / R * kUnitsPerRow / kWarps;
  int r[kPasses], b[kPasses];
  int64_t data_off[kPasses], scale_off[kPasses], word_off[kPasses];  // tile-invariant offsets

  __device__ RowwiseLane(const KernelArgs& a) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int unit = p * kWarps + warp;
      r[p] = unit / kUnitsPerRow * R + lane % R;
      b[p] = unit % kUnitsPerRow * kUnitBlocks + lane / R;
      word_off[p] = r[p] * a.cols + b[p] * kBlock;
      data_off[p] = word_off[p] / 2;
      scale_off[p] = r[p] * a.row.scale_cols + b[p];
    }
  }
};

template <class T, bool kSR, bool k2D>
__device__ __forceinline__ void rowwise_pass(const KernelArgs& a, SharedTile& sm, const TileView& t,
                                             const RowwiseLane<T, k2D>& lane_map,
                                             const DirectionScales& rd, const DirectionScales& cd,
                                             bool same_scales, const RandomStream& rs) {
  using S = Tile<T>;
  using L = RowwiseLane<T, k2D>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int p = 0; p < L::kPasses; ++p) {
    const int r = lane_map.r[p], b = lane_map.b[p];
    const bool valid = r < t.rows && b * kBlock < t.cols;  // 16x16: the same for a tile's 16 lanes
    float v[kBlock];
#pragma unroll
    for (int q = 0; q < S::kChunksPerBlock; ++q) {
      const uint4 chunk = *reinterpret_cast<const uint4*>(
          t.data + tile_chunk_offset(r, b * S::kChunksPerBlock + q));
      constexpr int kPer = kBlock / S::kChunksPerBlock;  // elements per chunk
      word_to_floats(chunk.x, v + q * kPer, T{});
      word_to_floats(chunk.y, v + q * kPer + kPer / 4, T{});
      word_to_floats(chunk.z, v + q * kPer + kPer / 2, T{});
      word_to_floats(chunk.w, v + q * kPer + 3 * kPer / 4, T{});
    }
    float amax = block_abs_max(v);
    if constexpr (k2D) {  // the 16x16 tile's amax: lanes l % 16 are its 16 rows
#pragma unroll
      for (int s = 1; s < kBlock; s *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, s));
    }
    uint32_t random[kSR ? kBlock : 1];
    if constexpr (kSR) {
      if (valid)
        rs.aligned_block_words(static_cast<uint64_t>(t.m0 * a.cols + t.k0 + lane_map.word_off[p]),
                               random);
    }
    uint2 codes = make_uint2(0, 0);
    uint8_t s_b = 0;
    if (a.row.data && valid) {
      s_b = rd.scale(amax);
      codes = encode16<kSR>(v, rd.enc[s_b], random);
      *reinterpret_cast<uint2*>(t.row_data + lane_map.data_off[p]) = codes;
      t.row_scale[lane_map.scale_off[p]] = s_b;
    }
    if constexpr (k2D) {
      if (a.col.data) {
        // Both outputs round the same values with the same words; only the
        // global scale can differ. Lanes of one tile take the same branch.
        if (!same_scales && valid) {
          s_b = cd.scale(amax);
          codes = encode16<kSR>(v, cd.enc[s_b], random);
        }
        codes = transpose16_nibbles(codes);  // lane l % 16: column 16 b + l % 16
        if (valid) {
          const int c = b * kBlock + lane % kBlock, g = r / kBlock;
          *reinterpret_cast<uint2*>(&sm.col_codes[g][c * 8]) = codes;
          sm.col_scales[c][g] = s_b;
        }
      }
    }
  }
}

// Step 2 with 1x16 blocks: the columnwise blocks of one word column.
template <class T, bool kSR, bool kRHT>
__device__ __forceinline__ void columnwise_pass(const KernelArgs& a, SharedTile& sm,
                                                const TileView& t, const DirectionScales& cd,
                                                const RandomStream& rs) {
  using S = Tile<T>;
  const int word = threadIdx.x % S::kWords, h = threadIdx.x / S::kWords;
  if (h * kBlock >= t.rows || word * S::kWordCols >= t.cols)
    return;  // whole blocks: M, K % 16 == 0
  uint32_t w[kBlock];
#pragma unroll
  for (int i = 0; i < kBlock; ++i)
    w[i] = *reinterpret_cast<const uint32_t*>(t.data + tile_chunk_offset(h * kBlock + i, word / 4) +
                                              4 * (word % 4));
  const int64_t M = a.rows;
  uint32_t packed[2 * S::kWordCols];
#pragma unroll
  for (int j = 0; j < S::kWordCols; ++j) {
    float x[kBlock];
#pragma unroll
    for (int i = 0; i < kBlock; ++i) {
      float pair[S::kWordCols];
      word_to_floats(w[i], pair, T{});
      x[i] = pair[j];
    }
    if constexpr (kRHT) random_hadamard_16(x, a.sign_mask);
    const uint8_t s_b = cd.scale(block_abs_max(x));
    uint32_t random[kSR ? kBlock : 1];
    if constexpr (kSR) {
      // Word indices continue after the M*K rowwise ones: column k, rows m..m+15.
      const int64_t k = t.k0 + word * S::kWordCols + j, m = t.m0 + h * kBlock;
      rs.aligned_block_words(static_cast<uint64_t>(M * a.cols + k * M + m), random);
    }
    const uint2 codes = encode16<kSR>(x, cd.enc[s_b], random);
    packed[2 * j] = codes.x;
    packed[2 * j + 1] = codes.y;
    sm.col_scales[word * S::kWordCols + j][h] = s_b;
  }
  uint8_t* dst = &sm.col_codes[h][word * S::kWordCols * 8];
  if constexpr (S::kWordCols == 2) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  } else {
    *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
  }
}

// Step 3: columnwise codes and scales from the staging area to global memory.
// Thread pair (2c, 2c + 1) writes the 32 code bytes of column c (rows m0..m0+63).
template <class T>
__device__ __forceinline__ void store_columnwise(const KernelArgs& a, const SharedTile& sm,
                                                 const TileView& t) {
  constexpr int kCols = Tile<T>::kCols;
  const int64_t M = a.rows;
  for (int idx = threadIdx.x; idx < 2 * kCols; idx += kThreads) {
    const int c = idx / 2, half = idx % 2;
    if (c >= t.cols || 32 * half >= t.rows) continue;
    const uint2 first = *reinterpret_cast<const uint2*>(&sm.col_codes[2 * half][c * 8]);
    uint8_t* out = t.col_data + c * (M / 2) + 16 * half;
    if (32 * half + kBlock < t.rows) {
      const uint2 second = *reinterpret_cast<const uint2*>(&sm.col_codes[2 * half + 1][c * 8]);
      if (a.col_store16) {
        *reinterpret_cast<uint4*>(out) = make_uint4(first.x, first.y, second.x, second.y);
      } else {
        *reinterpret_cast<uint2*>(out) = first;
        *reinterpret_cast<uint2*>(out + 8) = second;
      }
    } else {
      *reinterpret_cast<uint2*>(out) = first;
    }
    if (half == 1) continue;
    uint8_t* scale = t.col_scale + c * a.col.scale_cols;
    if (t.rows == kTileRows && a.col_scale_store4) {
      *reinterpret_cast<uint32_t*>(scale) = *reinterpret_cast<const uint32_t*>(sm.col_scales[c]);
    } else {
      for (int g = 0; g < kRowGroups && g * kBlock < t.rows; ++g) scale[g] = sm.col_scales[c][g];
    }
  }
}

// The tile grid, set up once per thread: tile (tm, tk) covers rows 64 tm..
// and columns kCols tk..; view() finds its corners with one 32x64-bit
// multiply-add per pointer (no 64-bit division in the loop).
template <class T>
struct TileGrid {
  int tiles_m, tiles_k, last_rows, last_cols;
  uint64_t in_m, row_data_m, row_scale_m, col_scale_m;  // steps per tile row
  uint64_t col_data_k, col_scale_k;                     // steps per tile column

  __device__ explicit TileGrid(const KernelArgs& a) {
    const uint64_t M = static_cast<uint64_t>(a.rows), K = static_cast<uint64_t>(a.cols);
    tiles_k = static_cast<int>(a.tiles_k);
    tiles_m = static_cast<int>(a.tiles / a.tiles_k);
    last_rows = static_cast<int>(a.rows - static_cast<int64_t>(tiles_m - 1) * kTileRows);
    last_cols = static_cast<int>(a.cols - static_cast<int64_t>(tiles_k - 1) * Tile<T>::kCols);
    in_m = kTileRows * K * sizeof(T);
    row_data_m = kTileRows / 2 * K;
    row_scale_m = kTileRows * static_cast<uint64_t>(a.row.scale_cols);
    col_scale_m = kTileRows / kBlock;
    col_data_k = Tile<T>::kCols * M / 2;
    col_scale_k = Tile<T>::kCols * static_cast<uint64_t>(a.col.scale_cols);
  }

  __device__ TileView view(const KernelArgs& a, int tm, int tk) const {
    constexpr int kCols = Tile<T>::kCols;
    TileView t;
    t.m0 = static_cast<int64_t>(tm) * kTileRows;
    t.k0 = static_cast<int64_t>(tk) * kCols;
    t.rows = tm == tiles_m - 1 ? last_rows : kTileRows;
    t.cols = tk == tiles_k - 1 ? last_cols : kCols;
    const uint64_t m = static_cast<uint64_t>(tm), k = static_cast<uint64_t>(tk);
    t.input = static_cast<const uint8_t*>(a.input) + m * in_m + k * (kCols * sizeof(T));
    t.row_data = a.row.data ? a.row.data + m * row_data_m + k * (kCols / 2) : nullptr;
    t.row_scale = a.row.data ? a.row.scale + m * row_scale_m + k * (kCols / kBlock) : nullptr;
    t.col_data = a.col.data ? a.col.data + k * col_data_k + m * (kTileRows / 2) : nullptr;
    t.col_scale = a.col.data ? a.col.scale + k * col_scale_k + m * col_scale_m : nullptr;
    return t;
  }
};

template <class T, bool kSR, bool kRHT, bool k2D>
__global__ void __launch_bounds__(kThreads, kSR ? 2 : 4) quantize_kernel(const KernelArgs a) {
  using S = Tile<T>;
  __shared__ SharedTile sm;
  const bool has_row = a.row.data != nullptr, has_col = a.col.data != nullptr;
  const TileGrid<T> grid(a);

  // Tiles are visited in steps of gridDim.x tiles.
  const int step_m = static_cast<int>(gridDim.x) / grid.tiles_k;
  const int step_k = static_cast<int>(gridDim.x) % grid.tiles_k;
  auto advance = [&](int& tm, int& tk) {
    tm += step_m;
    tk += step_k;
    if (tk >= grid.tiles_k) {
      tk -= grid.tiles_k;
      ++tm;
    }
  };

  // A tile's 1024 chunks, 4 per thread: rows 16 i + tid / 16, chunk tid % 16.
  // Out-of-range chunks are skipped: no block reads them.
  constexpr int kLoadRows = kThreads / kChunks;  // rows one round of the CTA copies
  const int load_r = threadIdx.x / kChunks, load_c = threadIdx.x % kChunks;
  const uint64_t row_bytes = static_cast<uint64_t>(a.cols) * sizeof(T);
  const uint64_t load_off = load_r * row_bytes + load_c * 16;
  // tile_chunk_offset(r + 16 i, c) = tile_chunk_offset(r, c) + 16 i * kRowBytes: the swizzle
  // repeats every 8 rows.
  const uint32_t load_dst = static_cast<uint32_t>(__cvta_generic_to_shared(sm.data[0])) +
                            static_cast<uint32_t>(tile_chunk_offset(load_r, load_c));
  auto load_tile = [&](const TileView& t, int stage) {
    if (load_c * 16 >= t.cols * static_cast<int>(sizeof(T))) return;
    const uint8_t* src = t.input + load_off;
    const uint32_t dst = load_dst + stage * (kTileRows * kRowBytes);
#pragma unroll
    for (int i = 0; i < kTileRows / kLoadRows; ++i)
      if (i * kLoadRows + load_r < t.rows)
        copy16_async(dst + i * kLoadRows * kRowBytes, src + i * kLoadRows * row_bytes);
  };
  int tm = static_cast<int>(blockIdx.x) / grid.tiles_k,
      tk = static_cast<int>(blockIdx.x) % grid.tiles_k;
  TileView t = grid.view(a, tm, tk);
  load_tile(t, 0);
  commit_async();

  // Per-CTA constants: global scales, enc_b tables, the random stream.
  const float row_s_enc = has_row ? global_encode_scale(*a.row.amax) : 1.0f;
  const float col_s_enc = has_col ? global_encode_scale(*a.col.amax) : 1.0f;
  {
    const int dir = threadIdx.x / kEncTable, s_b = threadIdx.x % kEncTable;
    if (dir < 2)
      sm.enc[dir][s_b] = block_encode_factor(static_cast<uint8_t>(s_b),
                                             global_decode_scale(dir == 0 ? row_s_enc : col_s_enc));
  }
  const DirectionScales rd{row_s_enc, sm.enc[0]}, cd{col_s_enc, sm.enc[1]};
  const bool same_scales = has_row && row_s_enc == col_s_enc;
  RandomStream rs{0, 0};
  if constexpr (kSR)
    rs = RandomStream{static_cast<uint64_t>(__ldg(a.rng_state)),
                      static_cast<uint64_t>(__ldg(a.rng_state + 1))};
  const RowwiseLane<T, k2D> row_lane(a);

  for (int it = 0; tm < grid.tiles_m; ++it) {
    int next_m = tm, next_k = tk;
    advance(next_m, next_k);
    // Prefetch the next tile into the other stage (freed by the barrier that
    // ended the previous iteration), then wait for this one.
    const bool has_next = next_m < grid.tiles_m;
    const TileView next = has_next ? grid.view(a, next_m, next_k) : t;
    if (has_next) load_tile(next, (it + 1) % kStages);
    commit_async();
    wait_async_but_one();
    __syncthreads();
    t.data = sm.data[it % kStages];
    if (has_row || (k2D && has_col))
      rowwise_pass<T, kSR, k2D>(a, sm, t, row_lane, rd, cd, same_scales, rs);
    if (!k2D && has_col) columnwise_pass<T, kSR, kRHT>(a, sm, t, cd, rs);
    __syncthreads();  // staging written; the stage may be refilled
    if (has_col) store_columnwise<T>(a, sm, t);
    tm = next_m;
    tk = next_k;
    t = next;
  }
}

template <class T, bool kSR, bool kRHT, bool k2D>
void launch(const KernelArgs& k, cudaStream_t stream) {
  const auto kernel = quantize_kernel<T, kSR, kRHT, k2D>;
  const int64_t grid = persistent_blocks(reinterpret_cast<const void*>(kernel), kThreads, k.tiles);
  kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(k);
  TE_CHECK_LAUNCH();
}

// Picks the instantiation for the runtime options (RHT and 2-D exclude each other).
template <class T>
void launch_for_options(const KernelArgs& k, const Options& o, cudaStream_t s) {
  if (o.block_2d) {
    o.stochastic_rounding ? launch<T, true, false, true>(k, s)
                          : launch<T, false, false, true>(k, s);
  } else if (o.random_hadamard) {
    o.stochastic_rounding ? launch<T, true, true, false>(k, s)
                          : launch<T, false, true, false>(k, s);
  } else {
    o.stochastic_rounding ? launch<T, true, false, false>(k, s)
                          : launch<T, false, false, false>(k, s);
  }
}

// The general kernel for any arguments (rows, cols > 0).
void launch_general(const QuantizeArgs& a, cudaStream_t stream) {
  const Direction& rw = a.rowwise;
  const Direction& cw = a.columnwise;
  dispatch_float(a.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t tiles_k = ceil_div(a.cols, Tile<T>::kCols);
    const int64_t tiles = ceil_div(a.rows, kTileRows) * tiles_k;
    if (tiles > 0x7FFFFFFF - 0x100000)  // tile indices and their steps stay in int
      fail(TE_ERROR_UNSUPPORTED, "NVFP4 quantize: tensor too large (", tiles, " tiles)");
    const KernelArgs k{a.input,
                       a.rows,
                       a.cols,
                       tiles_k,
                       tiles,
                       Out{rw.data, rw.scale, rw.scale_cols, rw.amax},
                       Out{cw.data, cw.scale, cw.scale_cols, cw.amax},
                       a.options.rht_sign_mask,
                       a.options.rng_state,
                       a.rows % 32 == 0,
                       cw.data == nullptr || is_aligned(cw.scale, 4)};
    launch_for_options<T>(k, a.options, stream);
  });
}

// The candidate of cuda_quantize_fast.cuh that the common case uses (-1: the
// general kernel for everything). Chosen by measurement:
// bench/kernels/run_nvfp4_variants.sh times every candidate on the GPU and
// checks its bytes against the CPU backend, on common blocks (which take the
// packed route) as well as on NaN-laced and extreme ones. On the H200
// (2026-11-30), rowwise + columnwise of 32768x4096 BF16: candidate 11 (packed
// block maxima, unsaturated codes for small blocks) 66.0% of a same-size copy,
// candidate 2 62.8%.
constexpr int kFastCandidate = 11;

}  // namespace

void quantize(const QuantizeArgs& a, te_stream stream) {
  const Direction& rw = a.rowwise;
  const Direction& cw = a.columnwise;
  if (rw.data)
    clear_scale_padding(rw.scale, a.rows, a.cols / kBlock, rw.scale_rows, rw.scale_cols, stream);
  if (cw.data)
    clear_scale_padding(cw.scale, a.cols, a.rows / kBlock, cw.scale_rows, cw.scale_cols, stream);
  if (a.rows == 0 || a.cols == 0) return;
  if constexpr (kFastCandidate >= 0) {
    if (fast::applies(a)) {
      fast::launch<fast::Candidate<kFastCandidate>>(a, cuda_stream(stream));
      return;
    }
  }
  launch_general(a, cuda_stream(stream));
}

}  // namespace te::nvfp4::cuda
