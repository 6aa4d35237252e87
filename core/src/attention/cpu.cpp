// The CPU attention forward: the readable spec of te/attention.h. One task
// per (batch, query head, block of kBlockQ query rows) runs an online
// softmax over blocks of kBlockK keys (FlashAttention's forward): the running
// maximum m, the running denominator l and the unnormalized output are
// rescaled whenever m grows, so a task holds one [kBlockQ, kBlockK] tile of S,
// never a whole row of S. FP32 throughout; fixed summation orders, so the
// result is the same run to run and for any number of threads.
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

struct FwdScratch {
  std::vector<float> q, k, v, s, keep, acc, m, l;
  std::vector<char> seen;
  FwdScratch(const Dims& d)
      : q(kBlockQ * d.d),
        k(kBlockK * d.d),
        v(kBlockK * d.dv),
        s(kBlockQ * kBlockK),
        keep(kBlockK),
        acc(kBlockQ * d.dv),
        m(kBlockQ),
        l(kBlockQ),
        seen(kBlockQ) {}
};

// Folds one tile of logits into the running (m, l, acc) of its rows.
void online_update(const Problem& p, const Seq& s, int64_t h, int64_t i0, int64_t nq, int64_t j0,
                   int64_t nk, FwdScratch& w) {
  const int64_t dv = p.dims().dv;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < nq; ++r) {
    const float* row = w.s.data() + r * nk;
    float mx = ninf;
    for (int64_t c = 0; c < nk; ++c) mx = std::max(mx, row[c]);
    if (mx == ninf) continue;  // no visible key in this tile
    w.seen[r] = 1;
    const float m_new = std::max(w.m[r], mx);
    const float correction = std::exp(w.m[r] - m_new);  // 0 when m was -inf
    float* acc = w.acc.data() + r * dv;
    w.l[r] *= correction;
    for (int64_t k = 0; k < dv; ++k) acc[k] *= correction;
    p.keep_row(s.b, h, i0 + r, j0, nk, w.keep.data());
    for (int64_t c = 0; c < nk; ++c) {
      if (row[c] == ninf) continue;
      const float e = std::exp(row[c] - m_new);
      w.l[r] += e;  // the denominator is of P before dropout
      const float weight = e * w.keep[c];
      if (weight != 0.0f) axpy(weight, w.v.data() + c * dv, acc, dv);
    }
    w.m[r] = m_new;
  }
}

// Rows i0 .. i0 + nq of (sequence s, head h).
void forward_block(const FwdArgs& a, const Problem& p, const Seq& s, int64_t h, int64_t i0,
                   int64_t nq, FwdScratch& w) {
  const Dims& d = a.dims;
  const int64_t hk = h / (d.h / d.hk);
  for (int64_t r = 0; r < nq; ++r)
    load(a.q, a.dtype, p.q_offset(s.b, i0 + r, h), d.d, &w.q[r * d.d]);
  // A sink is one more logit with no value vector: it starts the running
  // maximum and contributes exp(0) = 1 to the denominator.
  const float m0 = p.has_sink() ? p.sink_logit(h) : -std::numeric_limits<float>::infinity();
  std::fill(w.m.begin(), w.m.end(), m0);
  std::fill(w.l.begin(), w.l.end(), p.has_sink() ? 1.0f : 0.0f);
  std::fill(w.acc.begin(), w.acc.end(), 0.0f);
  std::fill(w.seen.begin(), w.seen.end(), 0);
  int64_t lo, hi;
  p.key_range(s, i0, i0 + nq, &lo, &hi);
  for (int64_t j0 = lo; j0 < hi; j0 += kBlockK) {
    const int64_t nk = std::min(kBlockK, hi - j0);
    for (int64_t c = 0; c < nk; ++c) {
      load(a.k, a.dtype, p.k_offset(s.b, j0 + c, hk), d.d, &w.k[c * d.d]);
      load(a.v, a.dtype, p.v_offset(s.b, j0 + c, hk), d.dv, &w.v[c * d.dv]);
    }
    p.logits(s, h, w.q.data(), i0, nq, w.k.data(), j0, nk, w.s.data());
    online_update(p, s, h, i0, nq, j0, nk, w);
  }
  for (int64_t r = 0; r < nq; ++r) {
    if (!w.seen[r]) continue;  // stays a masked row: O = 0, lse = -inf
    float* acc = &w.acc[r * d.dv];
    for (int64_t k = 0; k < d.dv; ++k) acc[k] /= w.l[r];
    store(a.o, a.dtype, p.o_offset(s.b, i0 + r, h), d.dv, acc);
    a.lse[p.lse_index(s.b, h, i0 + r)] = w.m[r] + std::log(w.l[r]);
  }
}

}  // namespace

void forward(const FwdArgs& a) {
  const Problem p(a);
  const Dims& d = a.dims;
  // Rows outside every sequence (padding, thd gaps) are masked rows.
  zero(a.o, a.dtype, p.q_tokens() * d.h * d.dv);
  std::fill(a.lse, a.lse + p.q_tokens() * d.h, -std::numeric_limits<float>::infinity());
  const int64_t blocks = (d.sq + kBlockQ - 1) / kBlockQ;
  parallel_for(d.b * d.h * blocks, 1, [&](int64_t begin, int64_t end) {
    FwdScratch w(d);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / (d.h * blocks), h = (t / blocks) % d.h, i0 = (t % blocks) * kBlockQ;
      const Seq s = p.seq(b);
      if (i0 < s.len_q) forward_block(a, p, s, h, i0, std::min(kBlockQ, s.len_q - i0), w);
    }
  });
}

}  // namespace cpu
}  // namespace te::attention
