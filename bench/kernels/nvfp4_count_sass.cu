// Instruction counts of the NVFP4 fast quantize kernel's per-tile work, for
// comparing candidates without a GPU (bench/kernels/count_nvfp4_sass.sh).
// One kernel per candidate runs quantize_tile on a full tile with every
// runtime condition of the common case fixed at compile time (full tile,
// aligned stores, both directions, BF16), so that its SASS holds the path
// that the 32768x4096 benchmark executes and little else; with
// kCommonRouteOnly, the kPacked candidates' general-route branch (taken only
// by blocks with NaN, infinities or saturation) is left out.
// Never run: the bytes are wrong by construction.
#include "nvfp4/cuda_quantize_fast.cuh"

namespace te::nvfp4::cuda::fast {

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    count_tile(uint8_t* row, uint8_t* row_scale, uint8_t* col, uint8_t* col_scale, float row_s_enc,
               float col_s_enc) {
  __shared__ Shared<C::kTileRows, C::kStages> sm;
  constexpr int64_t kRows = 32768, kCols = 4096;
  const Args a{nullptr, kRows,     kCols,      kCols / 128, row,  row_scale, kCols / 16, nullptr,
               col,     col_scale, kRows / 16, nullptr,     true, true,      true,       true};
  __builtin_assume(threadIdx.x <
                   C::kThreads);  // (else a loop over columns is unrolled for nothing)
  const int64_t tile = blockIdx.x;
  const TileView t{tile / a.tiles_k * C::kTileRows, tile % a.tiles_k * 128, C::kTileRows, 128};
  quantize_tile<C, __nv_bfloat16>(a, sm, sm.data[0], t, row_s_enc, col_s_enc);
}

struct Counted : Candidate<CANDIDATE> {
  static constexpr bool kCommonRouteOnly = true;
};

template __global__ void count_tile<Counted>(uint8_t*, uint8_t*, uint8_t*, uint8_t*, float, float);

}  // namespace te::nvfp4::cuda::fast
