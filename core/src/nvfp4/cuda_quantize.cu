// The NVFP4 quantize kernel: one pass over the input writes the rowwise and
// the columnwise (transposed) outputs with their scales. Byte-identical to the
// CPU backend: the element and scale arithmetic is formulas.h, the RHT
// hadamard.h and the random words philox.h, the same code on both sides.
//
// Tile: 256 bytes of each of kRows rows (BF16/FP16: 64 rows x 128 columns,
// FP32: 128 x 64), 256 threads, the tile kept in shared memory (16/32 KB).
//  1. Thread t loads two rowwise blocks (16 elements: 2 or 4 16-byte loads;
//     8 threads cover a 256-byte row run), takes their amaxes and copies them
//     to shared memory. In 1-D mode it quantizes them right away: 8 bytes of
//     data (one store) and a scale byte each.
//  2. After a barrier (and, for 16x16 tiles, a second one once the tile amaxes
//     are known), thread t takes column t % kCols of the tile and 32
//     consecutive rows: two columnwise blocks, gathered from shared memory
//     (consecutive lanes read consecutive columns: no bank conflicts), RHT'd
//     when asked, quantized to 16 bytes that are contiguous in the [K, M]
//     output (one 16-byte store when aligned, else two 8-byte stores).
// Traffic per element: sizeof(x) read, 1/2 + 1/2 byte written, + 2/16 scale
// bytes. No atomics, no host synchronization; padding of the scale buffers is
// cleared by memset nodes.
#include "nvfp4/backend.h"
#include "nvfp4/cuda_common.cuh"
#include "nvfp4/hadamard.h"
#include "nvfp4/philox.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"

namespace te::nvfp4::cuda {
namespace {

template <class T>
struct Tile {
  static constexpr int kCols = 256 / static_cast<int>(sizeof(T));  // 128 or 64
  static constexpr int kRows = 8192 / kCols;                        // 64 or 128
  static constexpr int kBlocksPerRow = kCols / kBlock;              // 8 or 4
  static constexpr int kRowBlocksPerThread = kRows * kBlocksPerRow / kThreads;  // 2
  static_assert(kCols * (kRows / 32) == kThreads, "one (column, 32 rows) unit per thread");
  static_assert(kRowBlocksPerThread * kThreads == kRows * kBlocksPerRow, "even rowwise split");
};

// One direction's output as the kernel sees it.
struct Out {
  uint8_t* data;  // null: direction not requested
  uint8_t* scale;
  int64_t scale_cols;
  const float* amax;
};

struct KernelArgs {
  const void* input;
  int64_t rows, cols, tiles_k;
  Out row, col;
  uint32_t sign_mask;
  const int64_t* rng_state;  // (seed, offset), device memory; SR only
};

// Quantizes one block (RNE or SR) with the given block amax; returns its 16
// codes packed and writes the scale byte.
template <bool kSR>
__device__ __forceinline__ uint64_t quantize_block(const float v[kBlock], float block_amax,
                                                   float s_enc, float s_dec,
                                                   const RandomStream& rs, uint64_t first,
                                                   uint64_t stride, uint8_t* scale_out) {
  const uint8_t s_b = block_scale(block_amax, s_enc);
  *scale_out = s_b;
  const float enc = block_encode_factor(s_b, s_dec);
  if constexpr (kSR) {
    uint32_t random[kBlock];
    rs.block_words(first, stride, random);
    return encode_block(v, enc, random);
  } else {
    return encode_block(v, enc, nullptr);
  }
}

__device__ __forceinline__ void store_8(uint8_t* p, uint64_t packed) {
  *reinterpret_cast<uint2*>(p) = make_uint2(static_cast<uint32_t>(packed),
                                            static_cast<uint32_t>(packed >> 32));
}

template <class T, bool kSR, bool kRHT, bool k2D>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const KernelArgs a) {
  using Shape = Tile<T>;
  constexpr int kCols = Shape::kCols, kRows = Shape::kRows, kPer = Shape::kRowBlocksPerThread;
  __shared__ __align__(16) T tile[kRows][kCols];
  // 16x16 mode: the amax of each 16-element row block, then of each tile.
  __shared__ float block_amax_smem[k2D ? kRows : 1][Shape::kBlocksPerRow];
  __shared__ float tile_amax_smem[k2D ? kRows / kBlock : 1][Shape::kBlocksPerRow];

  const int64_t M = a.rows, K = a.cols;
  const int64_t m0 = blockIdx.x / a.tiles_k * kRows, k0 = blockIdx.x % a.tiles_k * kCols;
  RandomStream rs{0, 0};
  if constexpr (kSR)
    rs = RandomStream{static_cast<uint64_t>(a.rng_state[0]), static_cast<uint64_t>(a.rng_state[1])};
  const float row_s_enc = a.row.data ? global_encode_scale(*a.row.amax) : 1.0f;
  const float row_s_dec = global_decode_scale(row_s_enc);

  // 1. Rowwise blocks: load, amax, copy to shared memory, (1-D) quantize.
  float v[kPer][kBlock];
  float amax[kPer];
  bool valid[kPer];
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int idx = threadIdx.x + p * kThreads;
    const int r = idx / Shape::kBlocksPerRow, b = idx % Shape::kBlocksPerRow;
    const int64_t m = m0 + r, k = k0 + b * kBlock;
    valid[p] = m < M && k < K;
    amax[p] = 0.0f;
    if (valid[p]) {
      const Vec<T, kBlock> raw = load_vec<T, kBlock>(static_cast<const T*>(a.input) + m * K + k);
      if (a.col.data) store_vec(&tile[r][b * kBlock], raw);
#pragma unroll
      for (int i = 0; i < kBlock; ++i) v[p][i] = to_float(raw.v[i]);
      amax[p] = block_abs_max(v[p]);
    }
    if constexpr (k2D) block_amax_smem[r][b] = amax[p];
  }

  auto quantize_rowwise = [&]() {
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      if (!valid[p]) continue;
      const int idx = threadIdx.x + p * kThreads;
      const int r = idx / Shape::kBlocksPerRow, b = idx % Shape::kBlocksPerRow;
      const int64_t m = m0 + r, k = k0 + b * kBlock;
      const float block_amax = k2D ? tile_amax_smem[r / kBlock][b] : amax[p];
      const uint64_t packed =
          quantize_block<kSR>(v[p], block_amax, row_s_enc, row_s_dec, rs,
                              static_cast<uint64_t>(m * K + k), 1,
                              a.row.scale + m * a.row.scale_cols + k / kBlock);
      store_8(a.row.data + (m * K + k) / 2, packed);
    }
  };

  if (!k2D && a.row.data) quantize_rowwise();
  if (!k2D && !a.col.data) return;  // uniform over the block: no barrier skipped by some threads
  __syncthreads();
  if constexpr (k2D) {
    for (int t = threadIdx.x; t < (kRows / kBlock) * Shape::kBlocksPerRow; t += kThreads) {
      const int tr = t / Shape::kBlocksPerRow, b = t % Shape::kBlocksPerRow;
      float m = 0.0f;
      for (int i = 0; i < kBlock; ++i) m = fmaxf(m, block_amax_smem[tr * kBlock + i][b]);
      tile_amax_smem[tr][b] = m;
    }
    __syncthreads();
    if (a.row.data) quantize_rowwise();
  }
  if (!a.col.data) return;

  // 2. Columnwise: column c of the tile, rows [32 h, 32 h + 32).
  const int c = threadIdx.x % kCols, h = threadIdx.x / kCols;
  const int64_t k = k0 + c;
  if (k >= K) return;
  const float col_s_enc = global_encode_scale(*a.col.amax);
  const float col_s_dec = global_decode_scale(col_s_enc);
  uint64_t packed[2];
  bool have[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r0 = h * 32 + half * kBlock;  // first tile row of the block
    const int64_t m = m0 + r0;
    have[half] = m < M;  // M % 16 == 0: a block is in or out as a whole
    if (!have[half]) continue;
    float x[kBlock];
#pragma unroll
    for (int i = 0; i < kBlock; ++i) x[i] = to_float(tile[r0 + i][c]);
    if constexpr (kRHT) random_hadamard_16(x, a.sign_mask);
    const float block_amax = k2D ? tile_amax_smem[r0 / kBlock][c / kBlock] : block_abs_max(x);
    // Word indices: 1-D after the M*K rowwise words; 2-D the input element's own.
    const uint64_t first = k2D ? static_cast<uint64_t>(m * K + k)
                               : static_cast<uint64_t>(M * K + k * M + m);
    const uint64_t stride = k2D ? static_cast<uint64_t>(K) : 1;
    packed[half] = quantize_block<kSR>(x, block_amax, col_s_enc, col_s_dec, rs, first, stride,
                                       a.col.scale + k * a.col.scale_cols + m / kBlock);
  }
  uint8_t* out = a.col.data + (k * M + m0 + h * 32) / 2;
  if (have[0] && have[1] && (reinterpret_cast<uintptr_t>(out) & 15) == 0) {
    *reinterpret_cast<uint4*>(out) =
        make_uint4(static_cast<uint32_t>(packed[0]), static_cast<uint32_t>(packed[0] >> 32),
                   static_cast<uint32_t>(packed[1]), static_cast<uint32_t>(packed[1] >> 32));
  } else {
    if (have[0]) store_8(out, packed[0]);
    if (have[1]) store_8(out + 8, packed[1]);
  }
}

template <class T, bool kSR, bool kRHT, bool k2D>
void launch(const KernelArgs& k, int64_t tiles, cudaStream_t stream) {
  quantize_kernel<T, kSR, kRHT, k2D><<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(k);
  TE_CHECK_LAUNCH();
}

// Picks the instantiation for the runtime options (RHT and 2-D exclude each other).
template <class T>
void launch_for_options(const KernelArgs& k, const Options& o, int64_t tiles, cudaStream_t s) {
  if (o.block_2d) {
    o.stochastic_rounding ? launch<T, true, false, true>(k, tiles, s)
                          : launch<T, false, false, true>(k, tiles, s);
  } else if (o.random_hadamard) {
    o.stochastic_rounding ? launch<T, true, true, false>(k, tiles, s)
                          : launch<T, false, true, false>(k, tiles, s);
  } else {
    o.stochastic_rounding ? launch<T, true, false, false>(k, tiles, s)
                          : launch<T, false, false, false>(k, tiles, s);
  }
}

}  // namespace

void quantize(const QuantizeArgs& a, te_stream stream) {
  const Direction& rw = a.rowwise;
  const Direction& cw = a.columnwise;
  if (rw.data)
    clear_scale_padding(rw.scale, a.rows, a.cols / kBlock, rw.scale_rows, rw.scale_cols, stream);
  if (cw.data)
    clear_scale_padding(cw.scale, a.cols, a.rows / kBlock, cw.scale_rows, cw.scale_cols, stream);
  if (a.rows == 0 || a.cols == 0) return;
  dispatch_float(a.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t tiles_k = ceil_div(a.cols, Tile<T>::kCols);
    const int64_t tiles = ceil_div(a.rows, Tile<T>::kRows) * tiles_k;
    if (tiles > 0x7FFFFFFF) fail(TE_ERROR_UNSUPPORTED, "NVFP4 quantize: tensor too large");
    const KernelArgs k{a.input,
                       a.rows,
                       a.cols,
                       tiles_k,
                       Out{rw.data, rw.scale, rw.scale_cols, rw.amax},
                       Out{cw.data, cw.scale, cw.scale_cols, cw.amax},
                       a.options.rht_sign_mask,
                       a.options.rng_state};
    launch_for_options<T>(k, a.options, tiles, cuda_stream(stream));
  });
}

}  // namespace te::nvfp4::cuda
