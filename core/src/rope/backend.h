// The RoPE family's backends (formulas in te/rope.h). api.cpp validates every
// argument; the position rule and the per-element formula live here, shared
// by the CPU backend and the CUDA kernels (TE_HD), so both backends compute
// the same expression in the same order.
#pragma once

#include <cstdint>

#include "runtime/numerics.h"
#include "te/types.h"

namespace te::rope {

enum Format : int { kBshd = 0, kSbhd = 1, kThd = 2 };

struct Args {
  bool backward;
  te_dtype dtype;  // t's (and out's) type: FP32, BF16 or FP16
  const void* in;  // t (forward) or d_out (backward)
  void* out;       // out (forward) or d_t (backward)
  int format;
  int64_t b, s;      // batch and sequence length (thd: s unused, b = sequences)
  int64_t tokens;    // thd: the packed token count; else b * s
  int64_t h, d, d2;  // heads, head dimension, rotary dimension (even, <= d)
  const float* freqs;
  int64_t freq_rows;               // S
  const int32_t* cu_seqlens;       // thd only, b + 1 entries
  const int32_t* start_positions;  // may be null
  bool interleaved;
  int cp_size, cp_rank;
};

// The freqs row of local index i in a local sequence of L tokens (te/rope.h).
TE_HD int64_t position(int64_t i, int64_t L, int64_t start, int cp_size, int cp_rank) {
  if (cp_size <= 1) return i + start;
  const int64_t half = L / 2;
  if (i < half) return i + cp_rank * half;
  return cp_size * L - (cp_rank + 1) * half + (i - half);
}

// Index of the partner element whose value enters element i, and the sign of
// its term: forward r_i = sign * x_partner.
TE_HD int64_t partner(int64_t i, int64_t d2, bool interleaved, float* sign) {
  if (interleaved) {
    *sign = (i % 2 == 0) ? -1.0f : 1.0f;
    return (i % 2 == 0) ? i + 1 : i - 1;
  }
  const int64_t half = d2 / 2;
  *sign = i < half ? -1.0f : 1.0f;
  return i < half ? i + half : i - half;
}

// One rotated element in FP32, each product and the sum rounded once (the
// CUDA backend uses the same _rn operations, so no FMA on either side).
//   forward:  x_i c_i + sign x_p s_i
//   backward: g_i c_i - sign g_p s_p    (the transpose: the partner's angle)
TE_HD float rotate(float xi, float xp, float ci, float si_or_sp, float sign, bool backward) {
  const float signed_p = (backward ? -sign : sign) * xp;  // exact
#ifdef __CUDA_ARCH__
  return __fadd_rn(__fmul_rn(xi, ci), __fmul_rn(signed_p, si_or_sp));
#else
  const float a = xi * ci;
  const float b = signed_p * si_or_sp;
  return a + b;
#endif
}

// Where a token sits: whether it belongs to a sequence (thd tokens past the
// last one do not, and pass through) and its freqs row. A position outside
// [0, freq_rows) (possible only with device-resident cu_seqlens or
// start_positions the host could not check) is reported as pos = -1.
struct Place {
  bool in_sequence;
  int64_t pos;
};

TE_HD Place place(const Args& a, int64_t tok) {
  int64_t seq = 0, i = 0, L = a.s;
  if (a.format == kThd) {
    const int64_t cp = a.cp_size;
    if (a.b < 1 || tok < a.cu_seqlens[0] / cp) return {false, 0};
    int64_t lo = 0, hi = a.b;  // the last sequence k with cu_seqlens[k] / cp <= tok
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (a.cu_seqlens[mid] / cp <= tok)
        lo = mid;
      else
        hi = mid;
    }
    const int64_t begin = a.cu_seqlens[lo] / cp, end = a.cu_seqlens[lo + 1] / cp;
    if (tok >= end) return {false, 0};
    seq = lo;
    i = tok - begin;
    L = end - begin;
  } else if (a.format == kBshd) {
    seq = tok / a.s;
    i = tok % a.s;
  } else {
    seq = tok % a.b;
    i = tok / a.b;
  }
  const int64_t start = a.start_positions ? a.start_positions[seq] : 0;
  if (a.cp_size > 1 && L % 2 != 0) return {true, -1};
  const int64_t p = position(i, L, start, a.cp_size, a.cp_rank);
  return {true, (p >= 0 && p < a.freq_rows) ? p : -1};
}

namespace cpu {
void run(const Args& args);
}  // namespace cpu

#ifdef TE_WITH_CUDA
namespace cuda {
void run(const Args& args, te_stream stream);
}  // namespace cuda
#endif

}  // namespace te::rope
