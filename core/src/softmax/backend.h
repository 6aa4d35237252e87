// The fused softmax family's backends (formulas in te/softmax.h). api.cpp
// validates every argument; which elements of a row are visible is decided
// here, shared by the CPU backend and the CUDA kernels (TE_HD).
//
// Summation order, both backends: element j of a row goes to partial sum
// j % 32 (in order of j), and the 32 partials are added pairwise (16 + 16,
// 8 + 8, ...): the CPU's loop and the CUDA warp's butterfly give the same
// association, so the sums differ only through their terms (expf).
#pragma once

#include <cstdint>

#include "runtime/numerics.h"
#include "te/types.h"

namespace te::softmax {

enum Kind : int {
  kPlain = 0,        // scaled_softmax
  kMasked = 1,       // scaled_masked_softmax (explicit mask)
  kCausal = 2,       // scaled_upper_triang_masked_softmax (j <= i)
  kBottomRight = 3,  // scaled_aligned_causal_masked_softmax (j <= i + sk - sq)
};

struct Args {
  Kind kind;
  bool backward;
  te_dtype dtype;
  const void* in;  // x (forward) or dy (backward)
  const void* y;   // backward only: the forward output
  void* out;       // y (forward) or dx (backward)
  int64_t rows, sk;
  int64_t sq;             // rows per (b, h) matrix (masked and causal kinds)
  int64_t rows_per_mask;  // masked: rows sharing one mask batch (h * sq)
  int64_t mask_batches;   // masked: 1 or b
  const uint8_t* mask;    // masked: [mask_batches, 1, sq, sk]
  float scale;
};

// The number of leading visible elements of a row (causal kinds: the keys up
// to the diagonal; others sk), at most sk, possibly 0.
TE_HD int64_t visible_prefix(const Args& a, int64_t row) {
  if (a.kind != kCausal && a.kind != kBottomRight) return a.sk;
  const int64_t i = row % a.sq;
  const int64_t limit = i + 1 + (a.kind == kBottomRight ? a.sk - a.sq : 0);
  return limit < 0 ? 0 : (limit > a.sk ? a.sk : limit);
}

// The row's mask (masked kind), else null.
TE_HD const uint8_t* mask_row(const Args& a, int64_t row) {
  if (a.kind != kMasked) return nullptr;
  const int64_t mb = a.mask_batches == 1 ? 0 : row / a.rows_per_mask;
  return a.mask + (mb * a.sq + row % a.sq) * a.sk;
}

// max that keeps a NaN (fmax would drop it): a NaN logit makes its row NaN.
TE_HD float nan_max(float m, float v) { return (m != m || v > m || v != v) ? (m != m ? m : v) : m; }

namespace cpu {
void run(const Args& args);
}  // namespace cpu

#ifdef TE_WITH_CUDA
namespace cuda {
void run(const Args& args, te_stream stream);
}  // namespace cuda
#endif

}  // namespace te::softmax
