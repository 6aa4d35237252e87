// The CPU attention passes' shared pieces (cpu_common.h).
#include "attention/cpu_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "nvfp4/philox.h"
#include "runtime/numerics.h"

namespace te::attention::cpu_detail {

Problem::Problem(const Inputs& in)
    : in_(in),
      group_(in.dims.h / in.dims.hk),
      threshold_(dropout_threshold(in.dropout)),
      keep_scale_(in.dropout > 0.0f ? 1.0f / (1.0f - in.dropout) : 1.0f) {}

Seq Problem::seq(int64_t b) const {
  Seq s{b, in_.dims.sq, in_.dims.skv, 0};
  if (in_.cu_q) s.len_q = in_.cu_q[b + 1] - in_.cu_q[b];
  if (in_.cu_kv) s.len_kv = in_.cu_kv[b + 1] - in_.cu_kv[b];
  s.diag = diagonal_offset(in_.mask_type, s.len_q, s.len_kv);
  return s;
}

int64_t Problem::q_row(int64_t b, int64_t i) const {
  switch (in_.qkv_format) {
    case TE_QKV_FORMAT_BSHD: return b * in_.dims.sq + i;
    case TE_QKV_FORMAT_SBHD: return i * in_.dims.b + b;
    default: return in_.cu_q_padded[b] + i;
  }
}

int64_t Problem::kv_row(int64_t b, int64_t j) const {
  switch (in_.qkv_format) {
    case TE_QKV_FORMAT_BSHD: return b * in_.dims.skv + j;
    case TE_QKV_FORMAT_SBHD: return j * in_.dims.b + b;
    default: return in_.cu_kv_padded[b] + j;
  }
}

int64_t Problem::lse_index(int64_t b, int64_t h, int64_t i) const {
  if (in_.qkv_format == TE_QKV_FORMAT_THD) return q_row(b, i) * in_.dims.h + h;
  return (b * in_.dims.h + h) * in_.dims.sq + i;
}

int64_t Problem::q_tokens() const {
  return in_.qkv_format == TE_QKV_FORMAT_THD ? in_.dims.tq : in_.dims.b * in_.dims.sq;
}

void Problem::key_range(const Seq& s, int64_t i0, int64_t i1, int64_t* lo, int64_t* hi) const {
  *lo = 0;
  *hi = s.len_kv;
  if (in_.window_left >= 0) *lo = std::max<int64_t>(0, i0 + s.diag - in_.window_left);
  if (in_.window_right >= 0) *hi = std::min(s.len_kv, i1 + s.diag + in_.window_right);
  *hi = std::max(*hi, *lo);
}

void Problem::query_range(const Seq& s, int64_t j0, int64_t j1, int64_t* lo, int64_t* hi) const {
  *lo = 0;
  *hi = s.len_q;
  if (in_.window_right >= 0) *lo = std::max<int64_t>(0, j0 - s.diag - in_.window_right);
  if (in_.window_left >= 0) *hi = std::min(s.len_q, j1 + in_.window_left - s.diag);
  *hi = std::max(*hi, *lo);
}

float Problem::slope(int64_t b, int64_t h) const {
  if (in_.alibi_slopes == nullptr) return alibi_default_slope(h, in_.dims.h);
  return in_.alibi_slopes[in_.alibi_per_batch ? b * in_.dims.h + h : h];
}

float Problem::sink_logit(int64_t h) const {
  return in_.softmax_type == TE_SOFTMAX_LEARNABLE ? in_.softmax_offset[h] : 0.0f;
}

void Problem::logits(const Seq& s, int64_t h, const float* qt, int64_t i0, int64_t nq,
                     const float* kt, int64_t j0, int64_t nk, float* out) const {
  const Dims& d = in_.dims;
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t plane = d.sq * d.skv;
  const uint8_t* mask = nullptr;
  if (in_.mask)
    mask =
        in_.mask + ((in_.mask_b == 1 ? 0 : s.b) * in_.mask_h + (in_.mask_h == 1 ? 0 : h)) * plane;
  const int64_t bias_plane =
      in_.bias ? ((in_.bias_b == 1 ? 0 : s.b) * in_.bias_h + (in_.bias_h == 1 ? 0 : h)) * plane : 0;
  const float slope_h = in_.bias_type == TE_ATTN_BIAS_ALIBI ? slope(s.b, h) : 0.0f;
  std::vector<float> bias_row(in_.bias ? nk : 0);
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t i = i0 + r;
    if (in_.bias) load(in_.bias, in_.dtype, bias_plane + i * d.skv + j0, nk, bias_row.data());
    for (int64_t c = 0; c < nk; ++c) {
      const int64_t j = j0 + c;
      float& o = out[r * nk + c];
      if (j >= s.len_kv || !in_window(i, j, s.diag, in_.window_left, in_.window_right) ||
          (mask && mask[i * d.skv + j] != 0)) {
        o = ninf;
        continue;
      }
      const float qk = dot(qt + r * d.d, kt + c * d.d, d.d);
      switch (in_.bias_type) {
        case TE_ATTN_BIAS_PRE_SCALE_BIAS: o = in_.scale * (qk + bias_row[c]); break;
        case TE_ATTN_BIAS_POST_SCALE_BIAS: o = in_.scale * qk + bias_row[c]; break;
        case TE_ATTN_BIAS_ALIBI:
          o = in_.scale * qk + alibi_bias(slope_h, i, j, s.len_q, s.len_kv);
          break;
        default: o = in_.scale * qk;
      }
    }
  }
}

void Problem::keep_row(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t nk, float* out) const {
  if (in_.dropout == 0.0f) {
    std::fill(out, out + nk, 1.0f);
    return;
  }
  const nvfp4::RandomStream stream{in_.seed, in_.offset};
  const uint64_t first = dropout_index(in_.dims, b, h, i, j0);
  uint64_t cached = ~uint64_t{0};
  nvfp4::PhiloxWords words{};
  for (int64_t c = 0; c < nk; ++c) {
    const uint64_t n = first + static_cast<uint64_t>(c);
    if ((n >> 2) != cached) {  // one Philox call serves four consecutive keys
      cached = n >> 2;
      words = stream.block(cached);
    }
    out[c] = words.w[n & 3] >= threshold_ ? keep_scale_ : 0.0f;
  }
}

void load(const void* base, te_dtype dtype, int64_t offset, int64_t n, float* out) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32:
      std::memcpy(out, static_cast<const float*>(base) + offset, n * sizeof(float));
      return;
    case TE_DTYPE_BFLOAT16: {
      const auto* p = static_cast<const uint16_t*>(base) + offset;
      for (int64_t k = 0; k < n; ++k) out[k] = bf16_to_float(p[k]);
      return;
    }
    default: {
      const auto* p = static_cast<const uint16_t*>(base) + offset;
      for (int64_t k = 0; k < n; ++k) out[k] = fp16_to_float(p[k]);
    }
  }
}

void store(void* base, te_dtype dtype, int64_t offset, int64_t n, const float* in) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32:
      std::memcpy(static_cast<float*>(base) + offset, in, n * sizeof(float));
      return;
    case TE_DTYPE_BFLOAT16: {
      auto* p = static_cast<uint16_t*>(base) + offset;
      for (int64_t k = 0; k < n; ++k) p[k] = float_to_bf16(in[k]);
      return;
    }
    default: {
      auto* p = static_cast<uint16_t*>(base) + offset;
      for (int64_t k = 0; k < n; ++k) p[k] = float_to_fp16(in[k]);
    }
  }
}

void zero(void* base, te_dtype dtype, int64_t n) {
  std::memset(base, 0, static_cast<size_t>(n) * (dtype == TE_DTYPE_FLOAT32 ? 4 : 2));
}

float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[k + l] * b[k + l];
  float tail = 0.0f;
  for (; k < n; ++k) tail += a[k] * b[k];
  return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

}  // namespace te::attention::cpu_detail
