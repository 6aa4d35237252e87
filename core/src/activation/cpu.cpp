// CPU backend of the activation family: the executable spec. Each row is
// widened to FP32, its values are computed with the shared formulas
// (functions.h), and one writer stores them to every requested output, so all
// output types see the same FP32 values.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "activation/backend.h"
#include "runtime/element.h"
#include "runtime/parallel.h"

namespace te::activation::cpu {
namespace {

// n elements of a high-precision buffer, starting at offset, as FP32.
void widen(const void* base, te_dtype dtype, int64_t offset, int64_t n, float* out) {
  dispatch_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(base) + offset;
    for (int64_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
  });
}

// Stores FP32 values to the outputs of one [rows, cols] matrix.
class Writer {
 public:
  Writer(const OutputArgs& out, int64_t rows, int64_t cols)
      : out_(out),
        rows_(rows),
        cols_(cols),
        fmt_(fp8_format(out.fp8_dtype)),
        scale_(out.scale ? *out.scale : 1.0f),
        rowwise_fp8_(is_fp8(out.rowwise_dtype)) {}

  // Row r of values v[0, cols); returns the row's amax (NaN skipped).
  float store_row(int64_t r, const float* v) const {
    float amax = 0.0f;
    for (int64_t c = 0; c < cols_; ++c) amax = std::fmax(amax, std::fabs(v[c]));
    if (out_.rowwise != nullptr) {
      if (rowwise_fp8_) {
        uint8_t* q = static_cast<uint8_t*>(out_.rowwise) + r * cols_;
        for (int64_t c = 0; c < cols_; ++c) q[c] = float_to_fp8(v[c] * scale_, fmt_);
      } else {
        dispatch_float_type(out_.rowwise_dtype, [&](auto tag) {
          using T = typename decltype(tag)::type;
          T* o = static_cast<T*>(out_.rowwise) + r * cols_;
          for (int64_t c = 0; c < cols_; ++c) o[c] = from_float<T>(v[c]);
        });
      }
    }
    if (out_.columnwise != nullptr) {
      for (int64_t c = 0; c < cols_; ++c)
        out_.columnwise[c * rows_ + r] = float_to_fp8(v[c] * scale_, fmt_);
    }
    return amax;
  }

  // scale_inv and amax, once every row is stored.
  void finish(float amax) const {
    if (out_.scale_inv != nullptr) *out_.scale_inv = 1.0f / scale_;
    // A high-precision output's amax is that of the stored (rounded) values.
    const bool rounded = out_.rowwise != nullptr && !rowwise_fp8_;
    if (rounded) amax = stored_amax(amax, out_.rowwise_dtype);
    if (out_.amax != nullptr) *out_.amax = std::fmax(*out_.amax, amax);
  }

 private:
  const OutputArgs& out_;
  int64_t rows_, cols_;
  const Fp8Format& fmt_;
  float scale_;
  bool rowwise_fp8_;
};

// Runs body(first_chunk, end_chunk) over 64-row chunks on the worker threads
// and combines the per-thread amax values.
template <class Body>
float for_chunks(int64_t rows, Body&& body) {
  float amax = 0.0f;
  std::mutex amax_mutex;
  parallel_for(dbias_chunks(rows), 1, [&](int64_t t0, int64_t t1) {
    const float local = body(t0, t1);
    std::lock_guard<std::mutex> lock(amax_mutex);
    amax = std::fmax(amax, local);
  });
  return amax;
}

}  // namespace

void forward(const ForwardArgs& a) {
  const int64_t in_cols = input_cols(a.kind, a.cols);
  const Writer writer(a.out, a.rows, a.cols);
  float amax = 0.0f;
  with_kind(a.kind, [&](auto kind) {
    constexpr te_activation K = decltype(kind)::value;
    amax = for_chunks(a.rows, [&](int64_t t0, int64_t t1) {
      std::vector<float> x(in_cols), v(a.cols);
      float local = 0.0f;
      const int64_t r1 = std::min(a.rows, t1 * kDbiasChunkRows);
      for (int64_t r = t0 * kDbiasChunkRows; r < r1; ++r) {
        widen(a.input, a.input_dtype, r * in_cols, in_cols, x.data());
        for (int64_t j = 0; j < a.cols; ++j) {
          const float b = Kind<K>::gated ? x[a.cols + j] : 0.0f;
          v[j] = forward_value<K>(x[j], b, a.params);
        }
        local = std::fmax(local, writer.store_row(r, v.data()));
      }
      return local;
    });
  });
  writer.finish(amax);
}

// The forward output's columnwise copy of te_activation_bwd_with_fwd_columnwise:
// its spec is the forward pass itself (FP32 values quantized directly), or the
// forward into a BF16/FP16 output that is then quantized (q = fp8(x * scale),
// as te_cast_quantize_fp8 does). The CUDA backend fuses it into the backward's pass.
static void forward_columnwise(const BackwardArgs& a) {
  ForwardArgs f{a.kind, a.params, a.input, a.input_dtype, a.rows, a.cols, a.fwd};
  if (a.fwd_values_dtype == TE_DTYPE_FLOAT32) {
    forward(f);
    return;
  }
  std::vector<uint16_t> stored(static_cast<size_t>(a.rows * a.cols));  // BF16/FP16 bits
  f.out = OutputArgs{};
  f.out.rowwise = stored.data();
  f.out.rowwise_dtype = a.fwd_values_dtype;
  forward(f);
  const Fp8Format& fmt = fp8_format(a.fwd.fp8_dtype);
  const float scale = *a.fwd.scale;
  parallel_for(a.rows, kDbiasChunkRows, [&](int64_t r0, int64_t r1) {
    std::vector<float> v(a.cols);
    for (int64_t r = r0; r < r1; ++r) {
      widen(stored.data(), a.fwd_values_dtype, r * a.cols, a.cols, v.data());
      for (int64_t c = 0; c < a.cols; ++c)
        a.fwd.columnwise[c * a.rows + r] = float_to_fp8(v[c] * scale, fmt);
    }
  });
  if (a.fwd.scale_inv != nullptr) *a.fwd.scale_inv = 1.0f / scale;
}

void backward(const BackwardArgs& a) {
  // (Asked for when fwd.scale is set, as on CUDA: an empty fwd_columnwise may
  // have no data pointer, and its fwd_scale_inv is written all the same.)
  if (a.fwd.scale != nullptr) forward_columnwise(a);
  const int64_t in_cols = input_cols(a.kind, a.cols);
  const int64_t chunks = dbias_chunks(a.rows);
  const Writer writer(a.out, a.rows, in_cols);
  // partial[t * in_cols + j]: chunk t's sum of column j (te/activation.h): the
  // chunk's 4-row groups, each summed in row order, added in group order.
  std::vector<float> partial(a.dbias ? chunks * in_cols : 0, 0.0f);
  float amax = 0.0f;
  with_kind(a.kind, [&](auto kind) {
    constexpr te_activation K = decltype(kind)::value;
    amax = for_chunks(a.rows, [&](int64_t t0, int64_t t1) {
      std::vector<float> g(a.cols), x(in_cols), d(in_cols), group(in_cols, 0.0f);
      float local = 0.0f;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t r1 = std::min(a.rows, (t + 1) * kDbiasChunkRows);
        for (int64_t r = t * kDbiasChunkRows; r < r1; ++r) {
          widen(a.grad, a.input_dtype, r * a.cols, a.cols, g.data());
          widen(a.input, a.input_dtype, r * in_cols, in_cols, x.data());
          for (int64_t j = 0; j < a.cols; ++j) {
            const float b = Kind<K>::gated ? x[a.cols + j] : 0.0f;
            const GradPair gp = backward_value<K>(g[j], x[j], b, a.params);
            d[j] = gp.da;
            if (Kind<K>::gated) d[a.cols + j] = gp.db;
          }
          local = std::fmax(local, writer.store_row(r, d.data()));
          if (a.dbias == nullptr) continue;
          for (int64_t j = 0; j < in_cols; ++j) group[j] += d[j];
          if (r % kDbiasGroupRows == kDbiasGroupRows - 1 || r + 1 == r1) {  // the group is complete
            float* p = partial.data() + t * in_cols;
            for (int64_t j = 0; j < in_cols; ++j) p[j] += group[j];
            std::fill(group.begin(), group.end(), 0.0f);
          }
        }
      }
      return local;
    });
  });
  writer.finish(amax);
  if (a.dbias == nullptr) return;
  dispatch_float_type(a.dbias_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dbias = static_cast<T*>(a.dbias);
    for (int64_t j = 0; j < in_cols; ++j) {
      float sum = 0.0f;
      for (int64_t t = 0; t < chunks; ++t) sum += partial[t * in_cols + j];
      dbias[j] = from_float<T>(canonical(sum));
    }
  });
}

}  // namespace te::activation::cpu
