// What the CPU attention passes share (cpu.cpp: forward, cpu_bwd.cpp:
// backward): sequence addressing per layout, the logits of one tile with
// every mask/bias/window rule of te/attention.h, dropout keep factors, and
// row loads/stores in FP32. Tiles are [rows of queries] x [block of keys]:
// no pass ever holds more than one tile row block of S per thread.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/backend.h"

namespace te::attention::cpu_detail {

constexpr int64_t kBlockQ = 32;  // query rows per tile
constexpr int64_t kBlockK = 64;  // keys per tile

// One sequence of the batch.
struct Seq {
  int64_t b;
  int64_t len_q, len_kv;  // its lengths
  int64_t diag;           // diagonal_offset(): key i + diag is query i's position
};

class Problem {
 public:
  explicit Problem(const Inputs& in);

  const Inputs& in() const { return in_; }
  const Dims& dims() const { return in_.dims; }
  Seq seq(int64_t b) const;

  // Token row of query i / key j of sequence b in q, o (resp. k, v).
  int64_t q_row(int64_t b, int64_t i) const;
  int64_t kv_row(int64_t b, int64_t j) const;
  // Element offsets of one head's vector.
  int64_t q_offset(int64_t b, int64_t i, int64_t h) const {
    return (q_row(b, i) * in_.dims.h + h) * in_.dims.d;
  }
  int64_t o_offset(int64_t b, int64_t i, int64_t h) const {
    return (q_row(b, i) * in_.dims.h + h) * in_.dims.dv;
  }
  int64_t k_offset(int64_t b, int64_t j, int64_t hk) const {
    return (kv_row(b, j) * in_.dims.hk + hk) * in_.dims.d;
  }
  int64_t v_offset(int64_t b, int64_t j, int64_t hk) const {
    return (kv_row(b, j) * in_.dims.hk + hk) * in_.dims.dv;
  }
  int64_t lse_index(int64_t b, int64_t h, int64_t i) const;
  // Rows in q/o, and in lse, the batch addresses ([Tq] for thd, else B * Sq).
  int64_t q_tokens() const;

  // Keys [*lo, *hi) that some query of rows [i0, i1) may see (window and
  // causal pruning; a superset of the visible ones).
  void key_range(const Seq& s, int64_t i0, int64_t i1, int64_t* lo, int64_t* hi) const;
  // Queries [*lo, *hi) that may see some key of [j0, j1).
  void query_range(const Seq& s, int64_t j0, int64_t j1, int64_t* lo, int64_t* hi) const;

  // S of query rows i0.. (qt: nq x D, FP32) against keys j0.. (kt: nk x D):
  // s[r * nk + c], -inf where masked.
  void logits(const Seq& s, int64_t h, const float* qt, int64_t i0, int64_t nq, const float* kt,
              int64_t j0, int64_t nk, float* out) const;
  // keep[b, h, i, j] / (1 - p) for keys j0 .. j0 + nk (all 1 without dropout).
  void keep_row(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t nk, float* out) const;

  bool has_sink() const { return in_.softmax_type != TE_SOFTMAX_VANILLA; }
  // The sink logit (off_by_one: 0, learnable: alpha_h).
  float sink_logit(int64_t h) const;

 private:
  float slope(int64_t b, int64_t h) const;

  const Inputs& in_;
  int64_t group_;  // query heads per kv head
  uint32_t threshold_;
  float keep_scale_;  // 1 / (1 - p)
};

// Converts n elements at element offset `offset` of a dtype buffer to FP32.
void load(const void* base, te_dtype dtype, int64_t offset, int64_t n, float* out);
// Rounds n FP32 values to dtype (nearest even) at element offset `offset`.
void store(void* base, te_dtype dtype, int64_t offset, int64_t n, const float* in);
// Writes zeros (all three types: zero bits) to n elements.
void zero(void* base, te_dtype dtype, int64_t n);

// sum_k a[k] * b[k] with eight partial sums in a fixed order (deterministic).
float dot(const float* a, const float* b, int64_t n);
// y += alpha * x
inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t k = 0; k < n; ++k) y[k] += alpha * x[k];
}

}  // namespace te::attention::cpu_detail
