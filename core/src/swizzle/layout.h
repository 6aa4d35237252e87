// Offsets of the GEMM ("swizzled") block-scale layout, shared by the swizzle
// family and by the quantizers that write swizzled scales directly (MXFP8,
// NVFP4). te/swizzle.h states the layout.
#pragma once

#include <cstdint>

#include "runtime/numerics.h"  // TE_HD

namespace te::swizzle {

constexpr int64_t kTileRows = 128;  // along the GEMM outer dimension (M or N)
constexpr int64_t kTileCols = 4;    // along K, in scales
constexpr int64_t kTileBytes = kTileRows * kTileCols;

// Offset of the scale of outer index `outer` and K-block `inner` in a swizzled
// buffer whose compact form has inner_padded (a multiple of 4) scales per row.
TE_HD int64_t swizzled_offset(int64_t outer, int64_t inner, int64_t inner_padded) {
  const int64_t tile = (outer / kTileRows) * (inner_padded / kTileCols) + inner / kTileCols;
  const int64_t in_tile = (outer % 32) * 16 + ((outer % kTileRows) / 32) * 4 + inner % kTileCols;
  return tile * kTileBytes + in_tile;
}

// Offset in the swizzled buffer of element [r, c] of a compact [rows, cols]
// scale matrix. Rowwise: r is the outer index, c the K-block. Columnwise: the
// compact matrix is [K-blocks, outer], so the roles swap.
TE_HD int64_t swizzled_offset_of(int64_t r, int64_t c, int64_t rows, int64_t cols,
                                 bool columnwise) {
  return columnwise ? swizzled_offset(c, r, rows) : swizzled_offset(r, c, cols);
}

}  // namespace te::swizzle
