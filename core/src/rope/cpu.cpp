// CPU backend of the RoPE family: the readable spec of te/rope.h. Tokens are
// independent and run in parallel; each computes the sin/cos of its freqs row
// once (FP32 sinf/cosf) and applies them to every head.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "rope/backend.h"
#include "runtime/element.h"
#include "runtime/parallel.h"

namespace te::rope::cpu {
namespace {

template <class T>
void run_typed(const Args& a) {
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  const int64_t row = a.h * a.d;  // elements of one token
  parallel_for(a.tokens, std::max<int64_t>(1, 4096 / std::max<int64_t>(row, 1)),
               [&](int64_t t0, int64_t t1) {
                 std::vector<float> c(a.d2), s(a.d2), x(a.d);
                 for (int64_t tok = t0; tok < t1; ++tok) {
                   const Place pl = place(a, tok);
                   const T* src = in + tok * row;
                   T* dst = out + tok * row;
                   if (!pl.in_sequence) {
                     for (int64_t e = 0; e < row; ++e) dst[e] = src[e];
                     continue;
                   }
                   // api.cpp checked every position of a CPU call; -1 cannot occur here,
                   // but a NaN is the CUDA backend's answer to it, so give the same.
                   const float nan = std::numeric_limits<float>::quiet_NaN();
                   for (int64_t i = 0; i < a.d2; ++i) {
                     const float f = pl.pos >= 0 ? a.freqs[pl.pos * a.d2 + i] : nan;
                     c[i] = std::cos(f);
                     s[i] = std::sin(f);
                   }
                   for (int64_t hh = 0; hh < a.h; ++hh) {
                     const T* xs = src + hh * a.d;
                     T* ys = dst + hh * a.d;
                     for (int64_t i = 0; i < a.d; ++i) x[i] = to_float(xs[i]);
                     for (int64_t i = 0; i < a.d2; ++i) {
                       float sign = 0.0f;
                       const int64_t p = partner(i, a.d2, a.interleaved, &sign);
                       const float angle_sin = a.backward ? s[p] : s[i];
                       ys[i] = from_float<T>(rotate(x[i], x[p], c[i], angle_sin, sign, a.backward));
                     }
                     for (int64_t i = a.d2; i < a.d; ++i) ys[i] = xs[i];
                   }
                 }
               });
}

}  // namespace

void run(const Args& a) {
  dispatch_float_type(a.dtype, [&](auto tag) { run_typed<typename decltype(tag)::type>(a); });
}

}  // namespace te::rope::cpu
