// CPU backend of the fused softmax family: the readable spec of te/softmax.h.
// Rows are independent and run in parallel; every row sum uses the blocked
// order of backend.h (32 partial sums, then pairwise).
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/element.h"
#include "runtime/parallel.h"
#include "softmax/backend.h"

namespace te::softmax::cpu {
namespace {

constexpr float kInf = INFINITY;

// sum_{j < n} term(j): partial j % 32 in order, then the pairwise tree.
template <class Term>
float sum_fp32(int64_t n, Term term) {
  float acc[32] = {};
  for (int64_t j = 0; j < n; ++j) acc[j % 32] += term(j);
  for (int width = 16; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}

bool is_visible(const uint8_t* mask, int64_t prefix, int64_t j) {
  return j < prefix && (mask == nullptr || mask[j] == 0);
}

template <class T>
void forward_row(const Args& a, int64_t row, std::vector<float>& e) {
  const T* x = static_cast<const T*>(a.in) + row * a.sk;
  T* y = static_cast<T*>(a.out) + row * a.sk;
  const int64_t prefix = visible_prefix(a, row);
  const uint8_t* mask = mask_row(a, row);
  float m = -kInf;
  for (int64_t j = 0; j < a.sk; ++j) {
    e[j] = is_visible(mask, prefix, j) ? to_float(x[j]) * a.scale : -kInf;
    m = nan_max(m, e[j]);
  }
  if (m == -kInf) {  // no visible element, or all of them -inf
    for (int64_t j = 0; j < a.sk; ++j) y[j] = from_float<T>(0.0f);
    return;
  }
  // Masked elements hold -inf: exp(-inf - m) = 0 for any m that is not +inf
  // or NaN; those give a NaN row anyway, as the formula does.
  for (int64_t j = 0; j < a.sk; ++j) e[j] = is_visible(mask, prefix, j) ? std::exp(e[j] - m) : 0.0f;
  const float sum = sum_fp32(a.sk, [&](int64_t j) { return e[j]; });
  for (int64_t j = 0; j < a.sk; ++j) y[j] = from_float<T>(e[j] / sum);
}

template <class T>
void backward_row(const Args& a, int64_t row) {
  const T* dy = static_cast<const T*>(a.in) + row * a.sk;
  const T* y = static_cast<const T*>(a.y) + row * a.sk;
  T* dx = static_cast<T*>(a.out) + row * a.sk;
  const float dot = sum_fp32(a.sk, [&](int64_t j) { return to_float(dy[j]) * to_float(y[j]); });
  for (int64_t j = 0; j < a.sk; ++j)
    dx[j] = from_float<T>(a.scale * (to_float(y[j]) * (to_float(dy[j]) - dot)));
}

template <class T>
void run_typed(const Args& a) {
  parallel_for(a.rows, std::max<int64_t>(1, 8192 / a.sk), [&](int64_t r0, int64_t r1) {
    std::vector<float> e(static_cast<size_t>(a.sk));
    for (int64_t r = r0; r < r1; ++r) {
      if (a.backward) {
        backward_row<T>(a, r);
      } else {
        forward_row<T>(a, r, e);
      }
    }
  });
}

}  // namespace

void run(const Args& a) {
  dispatch_float_type(a.dtype, [&](auto tag) { run_typed<typename decltype(tag)::type>(a); });
}

}  // namespace te::softmax::cpu
