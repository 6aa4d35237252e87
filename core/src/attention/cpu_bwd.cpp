// The CPU attention backward (FlashAttention's): P is recomputed tile by tile
// from S and the saved lse, P = exp(S - lse), and with D_i = dO_i . O_i
//   dV += P'^T dO,  dP' = dO V^T,  dS = P (dP' keep / (1 - p) - D),
//   dQ = scale dS K,  dK = scale dS^T Q,  dbias = dS or scale dS.
// Two passes, so that every output element has one owner and no atomics or
// partial buffers are needed (deterministic for any thread count):
//   pass 1, one task per (batch, kv head, key block): dK and dV of those keys,
//     summed over the query heads of the group and all query rows;
//   pass 2, one task per (bias group, query block): dQ of those rows and the
//     dbias rows, summed over the batches/heads the bias is broadcast over.
// Each pass recomputes S (the price of owning outputs outright).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/backend.h"
#include "attention/cpu_common.h"
#include "runtime/parallel.h"

namespace te::attention {
namespace cpu {
namespace {

using namespace cpu_detail;

// One query block's loaded rows and per-row statistics.
struct QueryBlock {
  std::vector<float> q, d_o, lse, delta;
  explicit QueryBlock(const Dims& d)
      : q(kBlockQ * d.d), d_o(kBlockQ * d.dv), lse(kBlockQ), delta(kBlockQ) {}
};

struct KeyBlock {
  std::vector<float> k, v;
  explicit KeyBlock(const Dims& d) : k(kBlockK * d.d), v(kBlockK * d.dv) {}
};

struct Tile {
  std::vector<float> s, keep, p, ds;
  Tile() : s(kBlockQ * kBlockK), keep(kBlockK), p(kBlockK), ds(kBlockK) {}
};

void load_queries(const BwdArgs& a, const Problem& p, const std::vector<float>& delta, const Seq& s,
                  int64_t h, int64_t i0, int64_t nq, QueryBlock& qb) {
  const Dims& d = a.dims;
  for (int64_t r = 0; r < nq; ++r) {
    load(a.q, a.dtype, p.q_offset(s.b, i0 + r, h), d.d, &qb.q[r * d.d]);
    load(a.d_o, a.dtype, p.o_offset(s.b, i0 + r, h), d.dv, &qb.d_o[r * d.dv]);
    const int64_t idx = p.lse_index(s.b, h, i0 + r);
    qb.lse[r] = a.lse[idx];
    qb.delta[r] = delta[idx];
  }
}

void load_keys(const BwdArgs& a, const Problem& p, const Seq& s, int64_t hk, int64_t j0, int64_t nk,
               KeyBlock& kb) {
  const Dims& d = a.dims;
  for (int64_t c = 0; c < nk; ++c) {
    load(a.k, a.dtype, p.k_offset(s.b, j0 + c, hk), d.d, &kb.k[c * d.d]);
    load(a.v, a.dtype, p.v_offset(s.b, j0 + c, hk), d.dv, &kb.v[c * d.dv]);
  }
}

// Row r of a tile: t.p = P' (after dropout, for dV) and t.ds = dS, both over
// the tile's keys. False when the row has no visible key at all.
bool row_grads(const Problem& p, const Seq& s, int64_t h, int64_t i, int64_t j0, int64_t nk,
               const float* srow, const QueryBlock& qb, int64_t r, const KeyBlock& kb, Tile& t) {
  const float lse = qb.lse[r];
  if (lse == -std::numeric_limits<float>::infinity()) return false;
  const int64_t dv = p.dims().dv;
  const float* d_o = &qb.d_o[r * dv];
  p.keep_row(s.b, h, i, j0, nk, t.keep.data());
  for (int64_t c = 0; c < nk; ++c) {
    const float prob = std::exp(srow[c] - lse);  // 0 where masked (S = -inf)
    if (prob == 0.0f) {
      t.p[c] = t.ds[c] = 0.0f;
      continue;
    }
    t.p[c] = prob * t.keep[c];
    const float dp = dot(d_o, &kb.v[c * dv], dv);
    t.ds[c] = prob * (dp * t.keep[c] - qb.delta[r]);
  }
  return true;
}

// D_i = dO_i . O_i for every query row, indexed like lse (0 outside sequences).
std::vector<float> row_deltas(const BwdArgs& a, const Problem& p) {
  const Dims& d = a.dims;
  std::vector<float> delta(p.q_tokens() * d.h, 0.0f);
  parallel_for(d.b * d.h, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> o(d.dv), d_o(d.dv);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / d.h, h = t % d.h;
      const Seq s = p.seq(b);
      for (int64_t i = 0; i < s.len_q; ++i) {
        load(a.o, a.dtype, p.o_offset(b, i, h), d.dv, o.data());
        load(a.d_o, a.dtype, p.o_offset(b, i, h), d.dv, d_o.data());
        delta[p.lse_index(b, h, i)] = dot(o.data(), d_o.data(), d.dv);
      }
    }
  });
  return delta;
}

// dalpha_h = -sum_{b,i} P_sink[b,h,i] D_i with P_sink = exp(alpha_h - lse_i);
// a fixed-order sum per head (double accumulator).
void softmax_offset_grad(const BwdArgs& a, const Problem& p, const std::vector<float>& delta) {
  const Dims& d = a.dims;
  for (int64_t h = 0; h < d.h; ++h) {
    double sum = 0.0;
    for (int64_t b = 0; b < d.b; ++b) {
      const Seq s = p.seq(b);
      for (int64_t i = 0; i < s.len_q; ++i) {
        const int64_t idx = p.lse_index(b, h, i);
        if (a.lse[idx] == -std::numeric_limits<float>::infinity()) continue;
        sum += static_cast<double>(std::exp(p.sink_logit(h) - a.lse[idx])) * delta[idx];
      }
    }
    a.dsoftmax_offset[h] = static_cast<float>(-sum);
  }
}

// Pass 1: dK, dV of keys j0 .. j0 + nk of (sequence s, kv head hk).
void key_block_grads(const BwdArgs& a, const Problem& p, const std::vector<float>& delta,
                     const Seq& s, int64_t hk, int64_t j0, int64_t nk) {
  const Dims& d = a.dims;
  const int64_t group = d.h / d.hk;
  KeyBlock kb(d);
  QueryBlock qb(d);
  Tile t;
  std::vector<float> dk(nk * d.d, 0.0f), dv(nk * d.dv, 0.0f);
  load_keys(a, p, s, hk, j0, nk, kb);
  int64_t lo, hi;
  p.query_range(s, j0, j0 + nk, &lo, &hi);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t i0 = lo; i0 < hi; i0 += kBlockQ) {
      const int64_t nq = std::min(kBlockQ, hi - i0);
      load_queries(a, p, delta, s, h, i0, nq, qb);
      p.logits(s, h, qb.q.data(), i0, nq, kb.k.data(), j0, nk, t.s.data());
      for (int64_t r = 0; r < nq; ++r) {
        if (!row_grads(p, s, h, i0 + r, j0, nk, &t.s[r * nk], qb, r, kb, t)) continue;
        for (int64_t c = 0; c < nk; ++c) {
          if (t.p[c] != 0.0f) axpy(t.p[c], &qb.d_o[r * d.dv], &dv[c * d.dv], d.dv);
          if (t.ds[c] != 0.0f) axpy(a.scale * t.ds[c], &qb.q[r * d.d], &dk[c * d.d], d.d);
        }
      }
    }
  }
  for (int64_t c = 0; c < nk; ++c) {
    store(a.dk, a.dtype, p.k_offset(s.b, j0 + c, hk), d.d, &dk[c * d.d]);
    store(a.dv, a.dtype, p.v_offset(s.b, j0 + c, hk), d.dv, &dv[c * d.dv]);
  }
}

// Pass 2, one (sequence, head): dQ of rows i0 .. i0 + nq, and their dS added
// into dbias_rows ([kBlockQ, skv]) when given.
void query_block_grads(const BwdArgs& a, const Problem& p, const std::vector<float>& delta,
                       const Seq& s, int64_t h, int64_t i0, int64_t nq, float* dbias_rows) {
  const Dims& d = a.dims;
  const int64_t hk = h / (d.h / d.hk);
  const float bias_factor = a.bias_type == TE_ATTN_BIAS_PRE_SCALE_BIAS ? a.scale : 1.0f;
  KeyBlock kb(d);
  QueryBlock qb(d);
  Tile t;
  std::vector<float> dq(nq * d.d, 0.0f);
  load_queries(a, p, delta, s, h, i0, nq, qb);
  int64_t lo, hi;
  p.key_range(s, i0, i0 + nq, &lo, &hi);
  for (int64_t j0 = lo; j0 < hi; j0 += kBlockK) {
    const int64_t nk = std::min(kBlockK, hi - j0);
    load_keys(a, p, s, hk, j0, nk, kb);
    p.logits(s, h, qb.q.data(), i0, nq, kb.k.data(), j0, nk, t.s.data());
    for (int64_t r = 0; r < nq; ++r) {
      if (!row_grads(p, s, h, i0 + r, j0, nk, &t.s[r * nk], qb, r, kb, t)) continue;
      for (int64_t c = 0; c < nk; ++c) {
        if (t.ds[c] == 0.0f) continue;
        axpy(a.scale * t.ds[c], &kb.k[c * d.d], &dq[r * d.d], d.d);
        if (dbias_rows) dbias_rows[r * d.skv + j0 + c] += bias_factor * t.ds[c];
      }
    }
  }
  for (int64_t r = 0; r < nq; ++r)
    store(a.dq, a.dtype, p.q_offset(s.b, i0 + r, h), d.d, &dq[r * d.d]);
}

// Pass 2 over tasks (bias batch, bias head, query block): the batches and
// heads a broadcast bias covers are summed in a fixed order inside the task.
void query_pass(const BwdArgs& a, const Problem& p, const std::vector<float>& delta) {
  const Dims& d = a.dims;
  const bool dbias = a.dbias != nullptr;
  const int64_t gb = dbias ? a.bias_b : d.b, gh = dbias ? a.bias_h : d.h;
  const int64_t blocks = (d.sq + kBlockQ - 1) / kBlockQ;
  parallel_for(gb * gh * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> rows(dbias ? kBlockQ * d.skv : 0);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t x = t / (gh * blocks), y = (t / blocks) % gh, i0 = (t % blocks) * kBlockQ;
      std::fill(rows.begin(), rows.end(), 0.0f);
      for (int64_t b = (gb == d.b ? x : 0); b < (gb == d.b ? x + 1 : d.b); ++b) {
        const Seq s = p.seq(b);
        if (i0 >= s.len_q) continue;
        for (int64_t h = (gh == d.h ? y : 0); h < (gh == d.h ? y + 1 : d.h); ++h)
          query_block_grads(a, p, delta, s, h, i0, std::min(kBlockQ, s.len_q - i0),
                            dbias ? rows.data() : nullptr);
      }
      if (!dbias) continue;
      const int64_t plane = (x * a.bias_h + y) * d.sq * d.skv;
      for (int64_t r = 0; r < std::min(kBlockQ, d.sq - i0); ++r)
        store(a.dbias, a.dtype, plane + (i0 + r) * d.skv, d.skv, &rows[r * d.skv]);
    }
  });
}

}  // namespace

void backward(const BwdArgs& a) {
  const Problem p(a);
  const Dims& d = a.dims;
  // Rows outside every sequence get zero gradients; so do unreached keys.
  const int64_t kv_tokens = a.qkv_format == TE_QKV_FORMAT_THD ? d.tkv : d.b * d.skv;
  zero(a.dq, a.dtype, p.q_tokens() * d.h * d.d);
  zero(a.dk, a.dtype, kv_tokens * d.hk * d.d);
  zero(a.dv, a.dtype, kv_tokens * d.hk * d.dv);
  if (a.dbias) zero(a.dbias, a.dtype, a.bias_b * a.bias_h * d.sq * d.skv);
  const std::vector<float> delta = row_deltas(a, p);
  if (a.dsoftmax_offset) softmax_offset_grad(a, p, delta);
  const int64_t key_blocks = (d.skv + kBlockK - 1) / kBlockK;
  parallel_for(d.b * d.hk * key_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / (d.hk * key_blocks), hk = (t / key_blocks) % d.hk;
      const int64_t j0 = (t % key_blocks) * kBlockK;
      const Seq s = p.seq(b);
      if (j0 < s.len_kv) key_block_grads(a, p, delta, s, hk, j0, std::min(kBlockK, s.len_kv - j0));
    }
  });
  query_pass(a, p, delta);
}

}  // namespace cpu
}  // namespace te::attention
