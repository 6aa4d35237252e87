// CUDA transpose of the [M, K] matrix view: out[k][m] = in[m][k].
//  - 1-byte elements (FP8 data): the byte-tile transposer of tile.cuh (128x64
//    tiles, 16-byte accesses on both sides, register byte transposes).
//  - 2-, 4- and 8-byte elements: 32x32 tiles through padded shared memory
//    (33 columns, so the column reads hit distinct banks), 32x8 threads, each
//    moving 4 elements; reads and writes are coalesced along rows.
// Ragged edges are bounds-checked; the grid is 1-D over tiles (K tiles fastest).
#include "runtime/cuda_check.h"
#include "runtime/cuda_launch.h"
#include "transpose/backend.h"
#include "transpose/tile.cuh"

namespace te::transpose::cuda {
namespace {

// The identity Op of the byte-tile transposer.
struct BytePack {
  __device__ void begin() {}
  __device__ __forceinline__ uint2 convert(const Vec<uint8_t, 8>& v, float&) const {
    return *reinterpret_cast<const uint2*>(&v);
  }
  __device__ void finish(float) const {}
};

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

template <class T>
__global__ void __launch_bounds__(kTile* kRowsPerPass)
    transpose_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t cols,
                     int64_t tiles_k) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) / tiles_k) * kTile;
  const int64_t k0 = (static_cast<int64_t>(blockIdx.x) % tiles_k) * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
  for (int i = ty; i < kTile; i += kRowsPerPass) {
    const int64_t m = m0 + i, k = k0 + tx;
    if (m < rows && k < cols) tile[i][tx] = in[m * cols + k];
  }
  __syncthreads();
#pragma unroll
  for (int i = ty; i < kTile; i += kRowsPerPass) {
    const int64_t k = k0 + i, m = m0 + tx;
    if (k < cols && m < rows) out[k * rows + m] = tile[tx][i];
  }
}

template <class T>
void launch(const void* input, void* output, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t tiles_k = ceil_div(cols, kTile);
  const int64_t blocks = ceil_div(rows, kTile) * tiles_k;
  if (blocks == 0) return;
  transpose_kernel<T><<<blocks, dim3(kTile, kRowsPerPass), 0, stream>>>(
      static_cast<const T*>(input), static_cast<T*>(output), rows, cols, tiles_k);
  TE_CHECK_LAUNCH();
}

}  // namespace

void transpose(const void* input, void* output, int64_t rows, int64_t cols, int element_bytes,
               te_stream stream) {
  cudaStream_t s = cuda_stream(stream);
  switch (element_bytes) {
    case 1: {
      if (rows == 0 || cols == 0) return;
      const auto* in = static_cast<const uint8_t*>(input);
      const auto args =
          tile::make_tile_args(in, rows, cols, nullptr, static_cast<uint8_t*>(output));
      tile::cast_transpose_kernel<uint8_t, BytePack, false>
          <<<tile::num_tiles(rows, cols), tile::kThreads, 0, s>>>(args, BytePack{});
      TE_CHECK_LAUNCH();
      return;
    }
    case 2: launch<uint16_t>(input, output, rows, cols, s); return;
    case 4: launch<uint32_t>(input, output, rows, cols, s); return;
    default: launch<uint64_t>(input, output, rows, cols, s); return;
  }
}

}  // namespace te::transpose::cuda
