// CPU backend of te_gemm: the executable spec of the GEMM family.
//
// Every operand element is first turned into FP32 exactly (BF16/FP16 widened,
// FP8 dequantized as float(q) * scale_inv), then
//     v = (alpha * sum_k op(A)[m, k] op(B)[k, n] + beta * C[m, n]) + bias[n]
// is computed with FP32 accumulation (the summation order is the only
// difference from exact arithmetic on the dequantized operands), and the
// epilogue stores pre_gelu_out = v, D = gelu(v) or v, rounded to each output's
// type (FP8 D: saturate(RNE(v * d_scale)), amax over |v|).
//
// Structure (the classic packed-panel GEMM): C is cut into kMC x kNC tiles that
// workers take from a shared counter; for each kKC slice of K a worker packs
// op(A) into kMR-row micro-panels and op(B) into NR-column micro-panels (FP32,
// zero-padded), and a register-blocked micro-kernel accumulates kMR x NR blocks
// of the tile. The micro-kernel is written with GCC vector extensions, so it
// vectorizes on any target; on x86 an AVX2+FMA copy is picked at run time.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "gemm/backend.h"
#include "runtime/element.h"
#include "runtime/numerics.h"
#include "runtime/parallel.h"
#include "runtime/tensor.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define TE_GEMM_X86_DISPATCH 1
#else
#define TE_GEMM_X86_DISPATCH 0
#endif

namespace te::gemm::cpu {
namespace {

constexpr int kMR = 6;                   // rows of a micro-tile
constexpr int64_t kKC = 256;             // K slice: a packed B micro-panel (kKC x NR) stays in L1
constexpr int64_t kMC = 120;             // tile rows (multiple of kMR): packed A block stays in L2
constexpr int64_t kNC = 512;             // tile cols (multiple of every NR)
constexpr double kFlopsPerWorker = 4e6;  // below this, one more thread costs more than it saves

// ---------------------------------------------------------------------------
// Element loading. Each source kind turns element i of a buffer into FP32.

enum Kind { kF32, kBF16, kF16, kFP8 };

Kind kind_of(te_dtype dtype) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: return kF32;
    case TE_DTYPE_BFLOAT16: return kBF16;
    case TE_DTYPE_FLOAT16: return kF16;
    default: return kFP8;
  }
}

// FP16 -> FP32 by bit manipulation: the same (exact) map as te::fp16_to_float,
// fast enough for packing.
inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t bits = h & 0x7FFFu;
  if (bits >= 0x7C00u)  // inf / NaN: all-ones exponent, payload kept
    return bit_cast_value<float>(sign | 0x7F800000u | ((bits & 0x3FFu) << 13));
  if (bits >= 0x0400u)  // normal: rebias the exponent from 15 to 127
    return bit_cast_value<float>(sign | ((bits + ((127 - 15) << 10)) << 13));
  const float v = static_cast<float>(bits) * 5.9604644775390625e-08f;  // denormal: bits * 2^-24
  return sign ? -v : v;
}

// A stored row-major matrix read as op(X): element (r, c) of op(X) is
// X[r * ld + c], or X[c * ld + r] when trans; ld is the stored row length.
struct Matrix {
  const void* data;
  int64_t ld;
  bool trans;
  const float* lut;  // FP8: the 256 dequantized values
};

template <Kind K>
inline float load(const Matrix& x, int64_t i) {
  if constexpr (K == kF32) {
    return static_cast<const float*>(x.data)[i];
  } else if constexpr (K == kBF16) {
    return bf16_to_float(static_cast<const uint16_t*>(x.data)[i]);
  } else if constexpr (K == kF16) {
    return half_bits_to_float(static_cast<const uint16_t*>(x.data)[i]);
  } else {
    return x.lut[static_cast<const uint8_t*>(x.data)[i]];
  }
}

template <Kind K>
inline float at(const Matrix& x, int64_t r, int64_t c) {
  return x.trans ? load<K>(x, c * x.ld + r) : load<K>(x, r * x.ld + c);
}

// The 256 values of an FP8 operand: float(q) * scale_inv, rounded to FP32.
std::vector<float> fp8_table(te_dtype dtype, float scale_inv) {
  std::vector<float> lut(256);
  const Fp8Format& fmt = fp8_format(dtype);
  for (int q = 0; q < 256; ++q) lut[q] = fp8_to_float(static_cast<uint8_t>(q), fmt) * scale_inv;
  return lut;
}

// Rows of high-precision tensors as FP32 (epilogue inputs and outputs).
void load_row(const void* base, te_dtype dtype, int64_t offset, int64_t n, float* out) {
  dispatch_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(base) + offset;
    for (int64_t i = 0; i < n; ++i) out[i] = to_float(p[i]);
  });
}

void store_row(void* base, te_dtype dtype, int64_t offset, int64_t n, const float* in) {
  if (is_fp8(dtype)) fail(TE_ERROR_INTERNAL, "store_row cannot write FP8");
  dispatch_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(base) + offset;
    for (int64_t i = 0; i < n; ++i) p[i] = from_float<T>(in[i]);
  });
}

// ---------------------------------------------------------------------------
// Packing. A block op(A)[m0 : m0+mc, k0 : k0+kc] becomes ceil(mc / kMR)
// micro-panels, each kc x kMR (k-major); op(B)[k0 : k0+kc, n0 : n0+nc] becomes
// ceil(nc / NR) micro-panels, each kc x NR. Missing rows/cols are zeros.

template <Kind K>
void pack_a(const Matrix& a, int64_t m0, int64_t mc, int64_t k0, int64_t kc, float* out) {
  for (int64_t p = 0; p < mc; p += kMR) {
    float* dst = out + p * kc;
    const int rows = static_cast<int>(std::min<int64_t>(kMR, mc - p));
    if (!a.trans) {  // each row of op(A) is contiguous: walk kMR rows
      for (int i = 0; i < kMR; ++i) {
        if (i < rows) {
          for (int64_t k = 0; k < kc; ++k) dst[k * kMR + i] = at<K>(a, m0 + p + i, k0 + k);
        } else {
          for (int64_t k = 0; k < kc; ++k) dst[k * kMR + i] = 0.0f;
        }
      }
    } else {  // A stored [K, M]: the kMR values of one k are contiguous
      for (int64_t k = 0; k < kc; ++k)
        for (int i = 0; i < kMR; ++i)
          dst[k * kMR + i] = i < rows ? at<K>(a, m0 + p + i, k0 + k) : 0.0f;
    }
  }
}

template <Kind K, int NR>
void pack_b(const Matrix& b, int64_t k0, int64_t kc, int64_t n0, int64_t nc, float* out) {
  for (int64_t q = 0; q < nc; q += NR) {
    float* dst = out + q * kc;
    const int cols = static_cast<int>(std::min<int64_t>(NR, nc - q));
    if (!b.trans) {  // B stored [K, N]: the NR values of one k are contiguous
      for (int64_t k = 0; k < kc; ++k)
        for (int j = 0; j < NR; ++j)
          dst[k * NR + j] = j < cols ? at<K>(b, k0 + k, n0 + q + j) : 0.0f;
    } else {  // B stored [N, K]: walk NR rows of B
      for (int j = 0; j < NR; ++j) {
        if (j < cols) {
          for (int64_t k = 0; k < kc; ++k) dst[k * NR + j] = at<K>(b, k0 + k, n0 + q + j);
        } else {
          for (int64_t k = 0; k < kc; ++k) dst[k * NR + j] = 0.0f;
        }
      }
    }
  }
}

using PackA = void (*)(const Matrix&, int64_t, int64_t, int64_t, int64_t, float*);

template <int NR>
using PackB = void (*)(const Matrix&, int64_t, int64_t, int64_t, int64_t, float*);

PackA pack_a_for(Kind kind) {
  switch (kind) {
    case kF32: return pack_a<kF32>;
    case kBF16: return pack_a<kBF16>;
    case kF16: return pack_a<kF16>;
    default: return pack_a<kFP8>;
  }
}

template <int NR>
PackB<NR> pack_b_for(Kind kind) {
  switch (kind) {
    case kF32: return pack_b<kF32, NR>;
    case kBF16: return pack_b<kBF16, NR>;
    case kF16: return pack_b<kF16, NR>;
    default: return pack_b<kFP8, NR>;
  }
}

// ---------------------------------------------------------------------------
// Micro-kernel: c[kMR x NR] (row stride ldc) += A micro-panel x B micro-panel.
// NR = 2 vectors of W floats; 2 * kMR accumulators stay in registers (12 of
// the 16 vector registers of SSE2/AVX2, leaving room for the B vectors).

typedef float v4f __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));

// Vectors move through memcpy (unaligned, no aliasing issues) and never cross
// a function boundary by value (that would change the ABI between targets).
template <class V, int W>
__attribute__((always_inline)) inline void micro_kernel_body(int64_t kc, const float* ap,
                                                             const float* bp, float* c,
                                                             int64_t ldc) {
  constexpr int NR = 2 * W;
  V acc[kMR][2];
  for (int i = 0; i < kMR; ++i) {
    std::memcpy(&acc[i][0], c + i * ldc, sizeof(V));
    std::memcpy(&acc[i][1], c + i * ldc + W, sizeof(V));
  }
  for (int64_t k = 0; k < kc; ++k) {
    V b0, b1;
    std::memcpy(&b0, bp + k * NR, sizeof(V));
    std::memcpy(&b1, bp + k * NR + W, sizeof(V));
#pragma GCC unroll 6
    for (int i = 0; i < kMR; ++i) {
      const float a = ap[k * kMR + i];
      acc[i][0] += a * b0;
      acc[i][1] += a * b1;
    }
  }
  for (int i = 0; i < kMR; ++i) {
    std::memcpy(c + i * ldc, &acc[i][0], sizeof(V));
    std::memcpy(c + i * ldc + W, &acc[i][1], sizeof(V));
  }
}

using MicroKernel = void (*)(int64_t, const float*, const float*, float*, int64_t);

void micro_kernel_generic(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc) {
  micro_kernel_body<v4f, 4>(kc, ap, bp, c, ldc);
}

#if TE_GEMM_X86_DISPATCH
// AVX2 + FMA: 8-wide vectors; contraction into FMA is allowed (no
// -ffast-math; FMA only removes a rounding, it never adds one).
__attribute__((target("avx2,fma"), optimize("fp-contract=fast"))) void micro_kernel_avx2(
    int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc) {
  micro_kernel_body<v8f, 8>(kc, ap, bp, c, ldc);
}

bool cpu_has_avx2_fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}
#endif

// ---------------------------------------------------------------------------
// Epilogue on one finished tile (FP32 sums of op(A) op(B), row stride ldt).

inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

struct Epilogue {
  const GemmArgs& g;
  std::vector<float> bias;  // bias as FP32, empty when absent
  float d_scale = 1.0f;

  explicit Epilogue(const GemmArgs& args) : g(args) {
    if (g.bias.present()) {
      bias.resize(static_cast<size_t>(g.n));
      load_row(g.bias.data, g.bias.dtype, 0, g.n, bias.data());
    }
    if (g.fp8_output()) d_scale = *g.d_scale;
  }

  // Rows [m0, m0 + mc) x cols [n0, n0 + nc); returns the amax of the values.
  float apply(const float* tile, int64_t ldt, int64_t m0, int64_t mc, int64_t n0, int64_t nc,
              std::vector<float>& v, std::vector<float>& c_row) const {
    float amax = 0.0f;
    v.resize(static_cast<size_t>(nc));
    c_row.resize(static_cast<size_t>(nc));
    const Fp8Format& fmt = fp8_format(g.d_dtype);
    for (int64_t r = 0; r < mc; ++r) {
      const int64_t row_offset = (m0 + r) * g.n + n0;
      const float* acc = tile + r * ldt;
      for (int64_t j = 0; j < nc; ++j) v[j] = g.alpha * acc[j];
      if (g.c.present()) {
        load_row(g.c.data, g.c.dtype, row_offset, nc, c_row.data());
        for (int64_t j = 0; j < nc; ++j) v[j] += g.beta * c_row[j];
      }
      if (!bias.empty())
        for (int64_t j = 0; j < nc; ++j) v[j] += bias[n0 + j];
      if (g.pre_gelu_out.present()) {
        store_row(const_cast<void*>(g.pre_gelu_out.data), g.pre_gelu_out.dtype, row_offset, nc,
                  v.data());
        for (int64_t j = 0; j < nc; ++j) v[j] = gelu_tanh(v[j]);
      }
      if (g.fp8_output()) {
        uint8_t* d = static_cast<uint8_t*>(g.d) + row_offset;
        for (int64_t j = 0; j < nc; ++j) {
          amax = std::fmax(amax, std::fabs(v[j]));  // fmax ignores NaN
          d[j] = float_to_fp8(v[j] * d_scale, fmt);
        }
      } else {
        store_row(g.d, g.d_dtype, row_offset, nc, v.data());
      }
    }
    return amax;
  }
};

// ---------------------------------------------------------------------------
// Driver.

struct Operands {
  Matrix a, b;
  Kind a_kind, b_kind;
  std::vector<float> a_lut, b_lut;
};

Matrix make_matrix(const Operand& op, int64_t stored_row_length, std::vector<float>& lut) {
  if (is_fp8(op.dtype)) lut = fp8_table(op.dtype, *op.scale_inv);
  return Matrix{op.data, stored_row_length, op.trans, lut.empty() ? nullptr : lut.data()};
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

template <int NR>
void run_tiles(const GemmArgs& g, const Operands& ops, const Epilogue& ep, MicroKernel kernel) {
  const PackA pack_a_fn = pack_a_for(ops.a_kind);
  const PackB<NR> pack_b_fn = pack_b_for<NR>(ops.b_kind);
  const int64_t m_tiles = (g.m + kMC - 1) / kMC, n_tiles = (g.n + kNC - 1) / kNC;
  const int64_t tiles = m_tiles * n_tiles;
  const double flops =
      2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  const int64_t workers =
      std::max<int64_t>(1, std::min<int64_t>({static_cast<int64_t>(cpu_num_threads()), tiles,
                                              static_cast<int64_t>(flops / kFlopsPerWorker) + 1}));
  // Buffer sizes for the largest tile this problem has.
  const int64_t kc_max = std::max<int64_t>(1, std::min(kKC, g.k));
  const int64_t mc_max = std::min(kMC, round_up(g.m, kMR));
  const int64_t nc_max = std::min(kNC, round_up(g.n, NR));

  std::atomic<int64_t> next_tile{0};
  std::mutex amax_mutex;
  float amax = 0.0f;
  // parallel_for over `workers` items of one each: one call per worker thread,
  // which then takes tiles from the shared counter (balances ragged edges).
  parallel_for(workers, 1, [&](int64_t, int64_t) {
    std::vector<float> a_pack(static_cast<size_t>(mc_max * kc_max));
    std::vector<float> b_pack(static_cast<size_t>(kc_max * nc_max));
    std::vector<float> tile(static_cast<size_t>(mc_max * nc_max));
    std::vector<float> v, c_row;
    float local_amax = 0.0f;
    for (int64_t t = next_tile++; t < tiles; t = next_tile++) {
      const int64_t m0 = (t / n_tiles) * kMC, n0 = (t % n_tiles) * kNC;
      const int64_t mc = std::min(kMC, g.m - m0), nc = std::min(kNC, g.n - n0);
      const int64_t mcp = round_up(mc, kMR), ncp = round_up(nc, NR);
      std::fill(tile.begin(), tile.begin() + mcp * ncp, 0.0f);
      for (int64_t k0 = 0; k0 < g.k; k0 += kKC) {
        const int64_t kc = std::min(kKC, g.k - k0);
        pack_b_fn(ops.b, k0, kc, n0, nc, b_pack.data());
        pack_a_fn(ops.a, m0, mc, k0, kc, a_pack.data());
        for (int64_t q = 0; q < ncp; q += NR)
          for (int64_t p = 0; p < mcp; p += kMR)
            kernel(kc, a_pack.data() + p * kc, b_pack.data() + q * kc, tile.data() + p * ncp + q,
                   ncp);
      }
      local_amax = std::fmax(local_amax, ep.apply(tile.data(), ncp, m0, mc, n0, nc, v, c_row));
    }
    std::lock_guard<std::mutex> lock(amax_mutex);
    amax = std::fmax(amax, local_amax);
  });
  if (g.d_amax) *g.d_amax = std::fmax(*g.d_amax, amax);
}

// bias_grad[m] = sum_k op(A)[m, k], FP32 accumulation, rounded to its type.
template <Kind K>
void bias_grad_typed(const GemmArgs& g, const Matrix& a) {
  std::vector<float> sums(static_cast<size_t>(g.m), 0.0f);
  const int64_t min_chunk = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, g.k));
  parallel_for(g.m, min_chunk, [&](int64_t begin, int64_t end) {
    if (!a.trans) {  // rows of op(A) are contiguous
      for (int64_t m = begin; m < end; ++m) {
        float s = 0.0f;
        for (int64_t k = 0; k < g.k; ++k) s += at<K>(a, m, k);
        sums[m] = s;
      }
    } else {  // A stored [K, M]: sweep its rows, accumulating this chunk of M
      for (int64_t k = 0; k < g.k; ++k)
        for (int64_t m = begin; m < end; ++m) sums[m] += at<K>(a, m, k);
    }
  });
  store_row(const_cast<void*>(g.bias_grad.data), g.bias_grad.dtype, 0, g.m, sums.data());
}

void bias_grad(const GemmArgs& g, const Matrix& a, Kind kind) {
  switch (kind) {
    case kF32: bias_grad_typed<kF32>(g, a); break;
    case kBF16: bias_grad_typed<kBF16>(g, a); break;
    case kF16: bias_grad_typed<kF16>(g, a); break;
    default: bias_grad_typed<kFP8>(g, a); break;
  }
}

}  // namespace

void gemm(const GemmArgs& g) {
  Operands ops;
  ops.a_kind = kind_of(g.a.dtype);
  ops.b_kind = kind_of(g.b.dtype);
  // Stored row lengths: A is [M, K] or [K, M]; B is [K, N] or [N, K].
  ops.a = make_matrix(g.a, g.a.trans ? g.m : g.k, ops.a_lut);
  ops.b = make_matrix(g.b, g.b.trans ? g.k : g.n, ops.b_lut);
  if (g.bias_grad.present() && g.m > 0) bias_grad(g, ops.a, ops.a_kind);
  if (g.m == 0 || g.n == 0) return;
  const Epilogue ep(g);
#if TE_GEMM_X86_DISPATCH
  if (cpu_has_avx2_fma()) {
    run_tiles<16>(g, ops, ep, micro_kernel_avx2);
    return;
  }
#endif
  run_tiles<8>(g, ops, ep, micro_kernel_generic);
}

}  // namespace te::gemm::cpu
