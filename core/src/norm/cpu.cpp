// CPU backend of the norm family: the readable spec of te/norm.h. Rows are
// independent and run in parallel. Every row sum uses the same FP32 blocked
// order (sum_fp32 below), and the column sums of the backward (dgamma, dbeta)
// use fixed row chunks combined in chunk order, so results do not depend on
// the number of threads.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "norm/backend.h"
#include "runtime/element.h"
#include "runtime/parallel.h"

namespace te::norm::cpu {
namespace {

// Rows of one chunk of the backward's column sums: chunk c sums its rows in
// order into partial[c]; the partials are then added in chunk order.
constexpr int64_t kRowsPerPartial = 32;

// sum_{i < n} term(i) in FP32. Element i goes to accumulator i % 32; the 32
// accumulators are then added pairwise. A term passes through at most
// ceil(n / 32) + 5 additions, which bounds the rounding error (numerics.md).
template <class Term>
float sum_fp32(int64_t n, Term term) {
  float acc[32] = {};
  for (int64_t i = 0; i < n; ++i) acc[i % 32] += term(i);
  for (int width = 16; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}

// Elements of any FP32/BF16/FP16 buffer as floats (widening is exact).
std::vector<float> to_floats(const void* data, te_dtype dtype, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dispatch_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(data);
    for (int64_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
  });
  return out;
}

// The weight used by the formulas: gamma, or 1 + gamma rounded to FP32.
std::vector<float> weight(const void* gamma, te_dtype dtype, int64_t n, bool zero_centered) {
  std::vector<float> g = to_floats(gamma, dtype, n);
  if (zero_centered)
    for (float& v : g) v = 1.0f + v;
  return g;
}

void row_to_floats(const void* data, te_dtype dtype, int64_t row, int64_t cols, float* out) {
  dispatch_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(data) + row * cols;
    for (int64_t i = 0; i < cols; ++i) out[i] = to_float(in[i]);
  });
}

struct RowStats {
  float mu;  // 0 for RMSNorm
  float rsigma;
};

// The statistics of backend.h, with the kStatScale retry of an overflowing sum.
RowStats row_stats(bool layernorm, const float* x, int64_t H, float eps) {
  const float n = static_cast<float>(H);
  float mu = 0.0f;
  if (layernorm) {
    mu = sum_fp32(H, [&](int64_t i) { return x[i]; }) / n;
    if (!std::isfinite(mu))  // inf, or NaN from inf + -inf partial sums of a finite row
      mu = sum_fp32(H, [&](int64_t i) { return x[i] * kStatScale; }) / n * kStatUnscale;
  }
  const float sum_sq = sum_fp32(H, [&](int64_t i) {
    const float d = x[i] - mu;
    return d * d;
  });
  if (!std::isinf(sum_sq)) return {mu, 1.0f / std::sqrt(sum_sq / n + eps)};
  const float scaled = sum_fp32(H, [&](int64_t i) {
    const float d = (x[i] - mu) * kStatScale;
    return d * d;
  });
  // 1 / sqrt(var + eps) = 2^-100 / sqrt(var * 2^-200 + eps * 2^-200).
  const float eps_scaled = eps * kStatScale * kStatScale;
  return {mu, 1.0f / std::sqrt(scaled / n + eps_scaled) * kStatScale};
}

// The FP32 y of one row. Every output type goes through this one function, so
// a fused FP8 output quantizes exactly the values an FP32 output would hold.
void normalize_row(const float* x, int64_t H, RowStats s, const float* g, const float* beta,
                   float* y) {
  for (int64_t i = 0; i < H; ++i) {
    const float scaled = (x[i] - s.mu) * s.rsigma * g[i];
    y[i] = beta ? scaled + beta[i] : scaled;
  }
}

// Stores an FP32 row into y's type; returns max|y_fp32| (NaN ignored).
float store_row(const float* y, int64_t H, const FwdArgs& a, int64_t row) {
  float amax = 0.0f;
  if (is_fp8(a.y_dtype)) {
    const Fp8Format& fmt = fp8_format(a.y_dtype);
    const float scale = *a.y_scale;
    uint8_t* out = static_cast<uint8_t*>(a.y) + row * H;
    for (int64_t i = 0; i < H; ++i) {
      amax = std::fmax(amax, std::fabs(y[i]));
      out[i] = float_to_fp8(y[i] * scale, fmt);
    }
    return amax;
  }
  dispatch_float_type(a.y_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(a.y) + row * H;
    for (int64_t i = 0; i < H; ++i) {
      amax = std::fmax(amax, std::fabs(y[i]));
      out[i] = from_float<T>(y[i]);
    }
  });
  return amax;
}

}  // namespace

void forward(const FwdArgs& a) {
  const int64_t H = a.cols;
  const std::vector<float> g = weight(a.gamma, a.w_dtype, H, a.zero_centered_gamma);
  std::vector<float> beta;
  if (a.layernorm) beta = to_floats(a.beta, a.w_dtype, H);
  float amax = 0.0f;
  std::mutex amax_mutex;
  parallel_for(a.rows, std::max<int64_t>(1, 16384 / H), [&](int64_t r0, int64_t r1) {
    std::vector<float> x(H), y(H);
    float local_amax = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      row_to_floats(a.x, a.x_dtype, r, H, x.data());
      const RowStats s = row_stats(a.layernorm, x.data(), H, a.eps);
      if (a.mu) a.mu[r] = s.mu;
      if (a.rsigma) a.rsigma[r] = s.rsigma;
      normalize_row(x.data(), H, s, g.data(), a.layernorm ? beta.data() : nullptr, y.data());
      local_amax = std::fmax(local_amax, store_row(y.data(), H, a, r));
    }
    std::lock_guard<std::mutex> lock(amax_mutex);
    amax = std::fmax(amax, local_amax);  // max is order-independent: deterministic
  });
  if (is_fp8(a.y_dtype) && a.y_scale_inv) *a.y_scale_inv = 1.0f / *a.y_scale;
  // FP8: amax of the unrounded y; otherwise of y as stored (te::stored_amax).
  if (a.y_amax) *a.y_amax = std::fmax(*a.y_amax, stored_amax(amax, a.y_dtype));
}

void backward(const BwdArgs& a) {
  const int64_t H = a.cols;
  const float n = static_cast<float>(H);
  const std::vector<float> g = weight(a.gamma, a.w_dtype, H, a.zero_centered_gamma);
  const int64_t chunks = (a.rows + kRowsPerPartial - 1) / kRowsPerPartial;
  // Column sums per chunk of rows: dgamma partials, then dbeta partials.
  std::vector<float> dgamma_part(static_cast<size_t>(chunks * H), 0.0f);
  std::vector<float> dbeta_part(a.layernorm ? static_cast<size_t>(chunks * H) : 0, 0.0f);

  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> x(H), dz(H), xhat(H), dy(H), dx(H);
    for (int64_t c = c0; c < c1; ++c) {
      float* dgamma_c = dgamma_part.data() + c * H;
      float* dbeta_c = a.layernorm ? dbeta_part.data() + c * H : nullptr;
      const int64_t r_end = std::min(a.rows, (c + 1) * kRowsPerPartial);
      for (int64_t r = c * kRowsPerPartial; r < r_end; ++r) {
        row_to_floats(a.x, a.x_dtype, r, H, x.data());
        row_to_floats(a.dz, a.x_dtype, r, H, dz.data());
        const float mu = a.layernorm ? a.mu[r] : 0.0f;
        const float rsigma = a.rsigma[r];
        for (int64_t i = 0; i < H; ++i) {
          xhat[i] = (x[i] - mu) * rsigma;
          dy[i] = dz[i] * g[i];
        }
        const float mean_dy =
            a.layernorm ? sum_fp32(H, [&](int64_t i) { return dy[i]; }) / n : 0.0f;
        const float mean_dy_xhat = sum_fp32(H, [&](int64_t i) { return dy[i] * xhat[i]; }) / n;
        for (int64_t i = 0; i < H; ++i) {
          dx[i] = rsigma * (dy[i] - mean_dy - xhat[i] * mean_dy_xhat);
          dgamma_c[i] += dz[i] * xhat[i];
          if (dbeta_c) dbeta_c[i] += dz[i];
        }
        dispatch_float_type(a.x_dtype, [&](auto tag) {
          using T = typename decltype(tag)::type;
          T* out = static_cast<T*>(a.dx) + r * H;
          for (int64_t i = 0; i < H; ++i) out[i] = from_float<T>(dx[i]);
        });
      }
    }
  });

  // Partials added in chunk order; then rounded to gamma's type.
  auto finish = [&](const std::vector<float>& part, void* out_data) {
    dispatch_float_type(a.w_dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* out = static_cast<T*>(out_data);
      for (int64_t i = 0; i < H; ++i) {
        float total = 0.0f;
        for (int64_t c = 0; c < chunks; ++c) total += part[c * H + i];
        out[i] = from_float<T>(total);
      }
    });
  };
  finish(dgamma_part, a.dgamma);
  if (a.layernorm) finish(dbeta_part, a.dbeta);
}

}  // namespace te::norm::cpu
