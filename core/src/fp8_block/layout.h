// Where the scale of a stored FP8 element lives, for every FP8-block layout
// (te/fp8_block.h). Shared by the validation, both backends and the kernels.
#pragma once

#include <cstdint>

#include "runtime/numerics.h"  // TE_HD
#include "te/fp8_block.h"

namespace te::fp8_block {

constexpr int64_t kBlock = TE_FP8_BLOCK_SIZE;

TE_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
TE_HD int64_t pad4(int64_t n) { return (n + 3) / 4 * 4; }

// For a stored FP8 matrix [rows, cols], element (r, c) belongs to the block
// (r / block_rows, c / block_cols) whose scale_inv is at
//     (r / block_rows) * stride_r + (c / block_cols) * stride_c
// of an FP32 array of shape [shape0, shape1]. In each row of that array the
// entries [valid1, shape1) are padding.
struct ScaleMap {
  int64_t block_rows, block_cols;  // 1 or kBlock each
  int64_t stride_r, stride_c;
  int64_t shape0, shape1, valid1;

  TE_HD int64_t index(int64_t r, int64_t c) const {
    return (r / block_rows) * stride_r + (c / block_cols) * stride_c;
  }
};

// The scale map of one stored matrix [rows, cols]. `columnwise` matters only
// for 1-D compact data (blocks down the rows); GEMM-ready columnwise data is
// stored transposed, so its map is the rowwise map of that transposed matrix.
inline ScaleMap scale_map(int64_t rows, int64_t cols, te_fp8_block_dim dim,
                          te_fp8_block_layout layout, bool columnwise) {
  const int64_t rb = cdiv(rows, kBlock), cb = cdiv(cols, kBlock);
  if (dim == TE_FP8_BLOCK_2D) {
    const int64_t inner = layout == TE_FP8_BLOCK_GEMM_READY ? pad4(cb) : cb;
    return {kBlock, kBlock, inner, 1, rb, inner, cb};
  }
  if (layout == TE_FP8_BLOCK_GEMM_READY) {  // [cdiv(cols, b), pad4(rows)], row-block index major
    return {1, kBlock, 1, pad4(rows), cb, pad4(rows), rows};
  }
  if (columnwise) return {kBlock, 1, cols, 1, rb, cols, cols};  // [cdiv(rows, b), cols]
  return {1, kBlock, cb, 1, rows, cb, cb};                      // [rows, cdiv(cols, b)]
}

// The scale map of a quantize output of the logical [M, K] input.
inline ScaleMap output_scale_map(int64_t m, int64_t k, te_fp8_block_dim dim,
                                 te_fp8_block_layout layout, bool columnwise) {
  if (columnwise && layout == TE_FP8_BLOCK_GEMM_READY) return scale_map(k, m, dim, layout, false);
  return scale_map(m, k, dim, layout, columnwise);
}

// Entry (i, j) of the 2-D columnwise scale array, from the rowwise scales of
// the same [M, K] tensor (te_fp8_block_transpose_2d). GEMM-ready columnwise
// entry (i, j) is tile (j, i) of the rowwise array, compact is the same tile;
// padding entries are 0.
TE_HD float columnwise_2d_scale(const float* rowwise_scales, const ScaleMap& row_map,
                                const ScaleMap& col_map, bool gemm_ready, int64_t i, int64_t j) {
  if (j >= col_map.valid1) return 0.0f;
  return gemm_ready ? rowwise_scales[row_map.index(j * kBlock, i * kBlock)]
                    : rowwise_scales[row_map.index(i * kBlock, j * kBlock)];
}

}  // namespace te::fp8_block
