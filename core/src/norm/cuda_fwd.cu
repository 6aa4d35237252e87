// CUDA backend of the norm family: LayerNorm / RMSNorm forward (te/norm.h).
//
// Design (norm_fwd_kernel, rows of up to 16384 elements). The forward is a
// pure stream (read x once, write y once), so its speed is the number of bytes
// each SM keeps in flight. The kernel therefore
//  - keeps the row in registers PACKED in x's type: 16 bytes (one chunk of
//    E = 16 / sizeof(x) elements: 8 BF16/FP16, 4 FP32) per 4 registers, and
//    widens to FP32 on the fly in each pass (mean, variance, output). A lane
//    holds at most 16 chunks = 64 registers of row, e.g. 128 BF16 elements;
//  - gives each row one warp when it fits (BF16/FP16 H <= 4096, FP32 H <=
//    2048), otherwise 2, 4 or 8 warps. Lane t of a row's group holds chunks
//    t, t + 32w, t + 64w, ...: every warp-wide access is 512 contiguous bytes;
//  - issues all of a lane's 16-byte loads (LDG.E.128) before the first
//    reduction, and writes y with one vector store per chunk (16 bytes for
//    a BF16 y, 32 for FP32, 8 for FP8);
//  - runs rows independently: one-warp rows use warp shuffles only, no block
//    barrier after the weights are staged, so while one warp reduces, the
//    other warps of the SM have their loads in flight. Multi-warp rows add
//    the warp totals through shared memory behind a named barrier of their
//    own row group (bar.sync 1 + group), never a block-wide one;
//  - stages g (= gamma or 1 + gamma, FP32) and beta once per block in shared
//    memory, laid out so that a lane reads its chunk's weights as float4s at
//    consecutive addresses across the warp (no bank conflicts);
//  - is persistent: one wave of blocks walks the rows grid-stride.
// At H = 4096 BF16 a lane keeps 64 registers of row; ptxas reports 96 in all
// (no spills, sm_90): 5 blocks of 4 warps per SM, 20 rows of 8 KiB in flight.
// To keep it that low, the per-pass unpacking is volatile asm (the compiler
// would otherwise keep the 128 widened floats live across the reductions),
// the per-chunk row-end tests are recomputed in each pass (opaque()), and the
// element-wise path is a separate instantiation (kVec = false). Helpers shared
// with the backward are in cuda_common.cuh.
//
// Summation order (rows): each chunk's E values are added as a balanced tree
// (((v0+v1)+(v2+v3))+((v4+v5)+(v6+v7))), a lane adds its chunk sums in chunk
// order, a butterfly over the warp gives every lane the same total, and the
// w warp totals are added in warp order. A term passes through at most
// log2(E) + ceil(H / (32 w E)) + 5 + (w - 1) roundings, within the
// ceil(H/32) + 16 of the documented bounds (docs/numerics.md). The scalar
// path (H % E != 0, or a misaligned x or y) keeps exactly the same chunk
// structure and order, only with element loads/stores: the same bytes.
//
// norm_fwd_looped_kernel (longer rows): one block per row, three passes over
// the row in global memory (sum, squares, output), weights read from global.
#include <type_traits>

#include "norm/cuda_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/cuda_elem.cuh"

namespace te::norm::cuda {
namespace {

// The register-resident forward handles rows up to this long (also bounds the
// shared memory of the staged weights: 2 x 64 KiB for LayerNorm).
constexpr int64_t kMaxResidentRow = 16384;

// A row group of kWarps warps; each lane holds up to kVecs chunks of x.
template <class Tx, int kWarps_, int kVecs_>
struct FwdShape {
  static constexpr int kWarps = kWarps_;
  static constexpr int kVecs = kVecs_;
  static constexpr int kE = 16 / static_cast<int>(sizeof(Tx));  // elements per chunk
  static constexpr int kThreads = 32 * kWarps;                  // per row
  static constexpr int kBlockWarps = kWarps == 1 ? 4 : (kWarps > 8 ? kWarps : 8);
  static constexpr int kRows = kBlockWarps / kWarps;  // row groups per block
  static constexpr int kBlockThreads = 32 * kBlockWarps;
  static constexpr int64_t kCapacity = int64_t{kThreads} * kVecs * kE;
};

// f(FwdShape{}) for the smallest shape whose capacity holds H; false when H is
// longer than kMaxResidentRow.
template <class Tx, class F>
bool with_fwd_shape(int64_t H, F&& f) {
  if (H > kMaxResidentRow) return false;
  if (H <= FwdShape<Tx, 1, 1>::kCapacity) return f(FwdShape<Tx, 1, 1>{}), true;
  if (H <= FwdShape<Tx, 1, 2>::kCapacity) return f(FwdShape<Tx, 1, 2>{}), true;
  if (H <= FwdShape<Tx, 1, 4>::kCapacity) return f(FwdShape<Tx, 1, 4>{}), true;
  if (H <= FwdShape<Tx, 1, 8>::kCapacity) return f(FwdShape<Tx, 1, 8>{}), true;
  if (H <= FwdShape<Tx, 1, 12>::kCapacity) return f(FwdShape<Tx, 1, 12>{}), true;
  if (H <= FwdShape<Tx, 1, 16>::kCapacity) return f(FwdShape<Tx, 1, 16>{}), true;
  if (H <= FwdShape<Tx, 2, 16>::kCapacity) return f(FwdShape<Tx, 2, 16>{}), true;
  if (H <= FwdShape<Tx, 4, 16>::kCapacity) return f(FwdShape<Tx, 4, 16>{}), true;
  static_assert(FwdShape<Tx, 8, 16>::kCapacity >= kMaxResidentRow, "8 warps hold the longest row");
  return f(FwdShape<Tx, 8, 16>{}), true;
}

// Balanced-tree sum of a chunk's values (the order of the header comment).
template <int kE>
__device__ __forceinline__ float tree_sum(const float (&v)[kE]) {
  const float a = __fadd_rn(__fadd_rn(v[0], v[1]), __fadd_rn(v[2], v[3]));
  if constexpr (kE == 4) {
    return a;
  } else {
    return __fadd_rn(a, __fadd_rn(__fadd_rn(v[4], v[5]), __fadd_rn(v[6], v[7])));
  }
}

// ---------------------------------------------------------------------------
// y chunks: E values rounded to y's type and packed into 32-bit words, then
// one vector store (vec: y aligned to the chunk's bytes, up to 16) or
// element stores of the chunk's elements in the row (`left` of them, if < E).

enum class YKind { kF32, kBF16, kF16, kE4M3, kE5M2 };
template <YKind kY>
using YTag = std::integral_constant<YKind, kY>;

template <YKind kY>
constexpr int y_bytes() {
  return kY == YKind::kF32 ? 4 : (kY == YKind::kBF16 || kY == YKind::kF16) ? 2 : 1;
}

template <YKind kY, int kE>
struct YChunk {
  static constexpr int kBytes = kE * y_bytes<kY>();
  static constexpr int kWords = kBytes / 4;
  uint32_t w[kWords];
};

template <YKind kY, int kE>
__device__ __forceinline__ YChunk<kY, kE> pack_y(const float (&y)[kE], float scale) {
  YChunk<kY, kE> c;
  if constexpr (kY == YKind::kF32) {
#pragma unroll
    for (int j = 0; j < kE; ++j) c.w[j] = __float_as_uint(y[j]);
  } else if constexpr (kY == YKind::kBF16) {
#pragma unroll
    for (int i = 0; i < kE / 2; ++i) {
      const __nv_bfloat162 p = __floats2bfloat162_rn(y[2 * i], y[2 * i + 1]);
      c.w[i] = *reinterpret_cast<const uint32_t*>(&p);
    }
  } else if constexpr (kY == YKind::kF16) {
#pragma unroll
    for (int i = 0; i < kE / 2; ++i) {
      const __half2 p = __floats2half2_rn(y[2 * i], y[2 * i + 1]);
      c.w[i] = *reinterpret_cast<const uint32_t*>(&p);
    }
  } else {
    constexpr bool kE5M2 = kY == YKind::kE5M2;
#pragma unroll
    for (int i = 0; i < kE / 4; ++i) {
      const uint32_t lo =
          cuda_elem::fp8x2<kE5M2>(__fmul_rn(y[4 * i], scale), __fmul_rn(y[4 * i + 1], scale));
      const uint32_t hi =
          cuda_elem::fp8x2<kE5M2>(__fmul_rn(y[4 * i + 2], scale), __fmul_rn(y[4 * i + 3], scale));
      c.w[i] = lo | (hi << 16);
    }
  }
  return c;
}

template <YKind kY, int kE>
__device__ __forceinline__ void store_y(uint8_t* p, int left, bool vec, const YChunk<kY, kE>& c) {
  constexpr int kB = y_bytes<kY>();
  if (vec) {
    if constexpr (YChunk<kY, kE>::kWords >= 4) {
#pragma unroll
      for (int i = 0; i < YChunk<kY, kE>::kWords / 4; ++i)
        reinterpret_cast<uint4*>(p)[i] =
            make_uint4(c.w[4 * i], c.w[4 * i + 1], c.w[4 * i + 2], c.w[4 * i + 3]);
    } else if constexpr (YChunk<kY, kE>::kWords == 2) {
      *reinterpret_cast<uint2*>(p) = make_uint2(c.w[0], c.w[1]);
    } else {
      *reinterpret_cast<uint32_t*>(p) = c.w[0];
    }
    return;
  }
  // Element j is bytes [j * kB, (j + 1) * kB) of the words (little endian).
#pragma unroll
  for (int j = 0; j < kE; ++j) {
    if (j >= left) break;
    const uint32_t word = c.w[j * kB / 4];
    const int shift = (j * kB % 4) * 8;
    if constexpr (kB == 4) {
      reinterpret_cast<uint32_t*>(p)[j] = word;
    } else if constexpr (kB == 2) {
      reinterpret_cast<unsigned short*>(p)[j] = static_cast<unsigned short>(word >> shift);
    } else {
      p[j] = static_cast<uint8_t>(word >> shift);
    }
  }
}

// rsigma from a sum of squares of terms scaled by kStatScale (backend.h):
// 1 / sqrt(var + eps) = 2^-100 / sqrt(var * 2^-200 + eps * 2^-200), as on the CPU.
__device__ __forceinline__ float scaled_rsigma(float scaled_ss, float n, float eps) {
  const float eps_scaled = __fmul_rn(__fmul_rn(eps, kStatScale), kStatScale);
  return __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(scaled_ss, n), eps_scaled))),
                   kStatScale);
}

// mu and rsigma from a kernel's two row sums, each called with the factor of
// its terms: 1, then kStatScale to redo a sum that was not finite (backend.h).
template <bool kLayerNorm, class SumX, class SumSquares>
__device__ __forceinline__ void row_statistics(SumX sum_x, SumSquares sum_squares, float n,
                                               float eps, float& mu, float& rsigma) {
  mu = 0.0f;
  if constexpr (kLayerNorm) {
    mu = __fdiv_rn(sum_x(1.0f), n);
    if (!isfinite(mu)) mu = __fmul_rn(__fdiv_rn(sum_x(kStatScale), n), kStatUnscale);
  }
  const float ss = sum_squares(mu, 1.0f);
  rsigma = isinf(ss) ? scaled_rsigma(sum_squares(mu, kStatScale), n, eps)
                     : __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, n), eps)));
}

// The FP32 y of one element: ((x - mu) * rsigma) * g (+ beta), each step rounded.
template <bool kLayerNorm>
__device__ __forceinline__ float y_value(float x, float mu, float rsigma, float g, float b) {
  const float scaled = __fmul_rn(__fmul_rn(kLayerNorm ? __fsub_rn(x, mu) : x, rsigma), g);
  return kLayerNorm ? __fadd_rn(scaled, b) : scaled;
}

// After the rows: the block's amax (one atomic; a high-precision y's amax is
// that of its stored values, te::stored_amax) and scale_inv (FP8, block 0).
__device__ __forceinline__ void finish(const FwdArgs& a, float amax) {
  if (a.y_amax != nullptr) {  // uniform over the grid
    amax = block_max(amax);
    if (threadIdx.x == 0) atomic_fmax(a.y_amax, cuda_elem::stored_amax(amax, a.y_dtype));
  }
  if (!is_fp8_code(a.y_dtype)) return;  // uniform over the grid
  if (a.y_scale_inv != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    *a.y_scale_inv = __fdiv_rn(1.0f, *a.y_scale);
}

// Barrier over the kThreads threads of one row group only (ids 1.., 0 is
// __syncthreads'), so the other row groups of the block never wait.
__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The row total of v over the row group, in every lane: butterfly, then the
// warp totals in warp order. The exchange alternates between two halves
// (`parity`), so one barrier per call suffices: a warp rewrites a half only
// after every warp of its group has passed the barrier of the call that
// followed its last read of that half.
template <class S>
struct GroupSum {
  float (*exchange)[S::kRows][S::kWarps];  // [2][kRows][kWarps]
  int group, warp_in_row, lane;
  int parity = 0;

  __device__ __forceinline__ float operator()(float v) {
    v = warp_sum(v);
    if constexpr (S::kWarps > 1) {
      if (lane == 0) exchange[parity][group][warp_in_row] = v;
      group_barrier(1 + group, S::kThreads);
      v = exchange[parity][group][0];
#pragma unroll
      for (int w = 1; w < S::kWarps; ++w) v = __fadd_rn(v, exchange[parity][group][w]);
      parity ^= 1;
    }
    return v;
  }
};

// Pass 3 of a row for one output type: y = ((x - mu) * rsigma) * g (+ beta),
// stored chunk by chunk, |y| of the row's elements folded into amax.
// The lane's chunk k starts k * kStride elements after its first one, which
// starts `rem` elements before the end of the row (rem may be <= 0).
template <YKind kY, class Tx, class S, bool kLayerNorm>
__device__ __forceinline__ void write_row(const uint32_t (&w)[S::kVecs][4], const FwdArgs& a,
                                          int64_t row, int t, int rem, bool vec, float mu,
                                          float rsigma, const float* g_s, const float* b_s,
                                          int part, float scale, float& amax) {
  constexpr int kE = S::kE;
  constexpr int kStride = S::kThreads * kE;
  uint8_t* y_lane = static_cast<uint8_t*>(a.y) + (row * a.cols + int64_t{t} * kE) * y_bytes<kY>();
  const float* g_lane = g_s + 4 * t;
  const float* b_lane = b_s + 4 * t;
#pragma unroll
  for (int k = 0; k < S::kVecs; ++k) {
    const int left = rem - k * kStride;
    if (left <= 0) break;  // the later chunks are past the row too
    float x[kE], g[kE], b[kE], y[kE];
    unpack(w[k], x, Tx{});
    load_weights(g_lane + 4 * k * S::kThreads, part, g);
    if constexpr (kLayerNorm) load_weights(b_lane + 4 * k * S::kThreads, part, b);
#pragma unroll
    for (int j = 0; j < kE; ++j)
      y[j] = y_value<kLayerNorm>(x[j], mu, rsigma, g[j], kLayerNorm ? b[j] : 0.0f);
    // Every output type (FP8 quantizes with it; a high-precision y's amax is
    // rounded once in finish). Past the row g = beta = 0, so y is +-0 or NaN
    // there: no mask needed.
#pragma unroll
    for (int j = 0; j < kE; ++j) amax = fmaxf(amax, fabsf(y[j]));  // fmaxf drops NaN
    store_y<kY, kE>(y_lane + k * kStride * y_bytes<kY>(), left, vec, pack_y<kY, kE>(y, scale));
  }
}

// kVec: vector accesses (see launch); a separate instantiation, so that the
// vector kernel's register count is not that of the element-wise path.
template <class Tx, class S, bool kLayerNorm, bool kVec>
__global__ void __launch_bounds__(S::kBlockThreads) norm_fwd_kernel(const FwdArgs a) {
  constexpr bool vec = kVec;
  constexpr int kE = S::kE;
  constexpr int kVecs = S::kVecs;
  constexpr int kStride = S::kThreads * kE;         // elements between a lane's chunks
  extern __shared__ __align__(16) float weights[];  // g, then beta (LayerNorm)
  __shared__ float exchange[2][S::kRows][S::kWarps];
  const int H = static_cast<int>(a.cols);  // <= kMaxResidentRow: int indices within a row
  const int chunks = (H + kE - 1) / kE;
  const int part = 4 * chunks;  // the per-chunk layout of cuda_common.cuh
  float* g_s = weights;
  float* b_s = weights + chunks * kE;
  stage_weights<kE>(g_s, H,
                    [&](int i) { return weight_at(a.gamma, a.w_dtype, i, a.zero_centered_gamma); });
  if (kLayerNorm) stage_weights<kE>(b_s, H, [&](int i) { return load_any(a.beta, a.w_dtype, i); });
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / S::kWarps, warp_in_row = warp % S::kWarps;
  const int t = warp_in_row * 32 + lane;  // thread index within the row group
  const int rem = H - t * kE;             // row elements from the lane's first chunk on
  GroupSum<S> row_sum{exchange, group, warp_in_row, lane};
  const float n = static_cast<float>(H);
  const float scale = is_fp8_code(a.y_dtype) ? *a.y_scale : 1.0f;
  float amax = 0.0f;
  const Tx* x = static_cast<const Tx*>(a.x);

  // The warps of a row group share its rows, hence its trip count and barriers.
  for (int64_t row = int64_t{blockIdx.x} * S::kRows + group; row < a.rows;
       row += int64_t{gridDim.x} * S::kRows) {
    uint32_t w[kVecs][4];
    const Tx* x_lane = x + row * a.cols + t * kE;
    int r = opaque(rem);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) load_packed(x_lane + k * kStride, r - k * kStride, vec, w[k]);

    // The row sums with every term multiplied by `mul`: 1 (exact, the usual
    // case) or kStatScale when the first try overflowed (backend.h). The
    // totals are the same in every lane of the group, so the retries are uniform.
    auto sum_x = [&](float mul) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        float v[kE];
        unpack(w[k], v, Tx{});
#pragma unroll
        for (int j = 0; j < kE; ++j) v[j] = __fmul_rn(v[j], mul);
        s = __fadd_rn(s, tree_sum(v));  // 0 past the row
      }
      return row_sum(s);
    };
    // Sum of squares of (x - mu) * mul; elements past the row count 0. With vec a
    // chunk is wholly in or out of the row; otherwise the last one may be split.
    auto sum_squares = [&](float mu, float mul) {
      float ss = 0.0f;
      const int r2 = opaque(rem);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int left = r2 - k * kStride;
        float v[kE];
        unpack(w[k], v, Tx{});
#pragma unroll
        for (int j = 0; j < kE; ++j) {
          const float d = __fmul_rn(kLayerNorm ? __fsub_rn(v[j], mu) : v[j], mul);
          v[j] = __fmul_rn(d, d);
        }
        if (kLayerNorm && !vec && left < kE) {
#pragma unroll
          for (int j = 0; j < kE; ++j)
            if (j >= left) v[j] = 0.0f;
        }
        const float sq = tree_sum(v);
        ss = __fadd_rn(ss, left > 0 ? sq : 0.0f);
      }
      return row_sum(ss);
    };
    float mu, rsigma;
    row_statistics<kLayerNorm>(sum_x, sum_squares, n, a.eps, mu, rsigma);
    if (t == 0) {
      if (a.mu != nullptr) a.mu[row] = mu;
      if (a.rsigma != nullptr) a.rsigma[row] = rsigma;
    }
    auto write = [&](auto kind) {
      write_row<decltype(kind)::value, Tx, S, kLayerNorm>(w, a, row, t, opaque(rem), vec, mu,
                                                          rsigma, g_s, b_s, part, scale, amax);
    };
    switch (a.y_dtype) {  // uniform
      case TE_DTYPE_FLOAT32: write(YTag<YKind::kF32>{}); break;
      case TE_DTYPE_BFLOAT16: write(YTag<YKind::kBF16>{}); break;
      case TE_DTYPE_FLOAT16: write(YTag<YKind::kF16>{}); break;
      case TE_DTYPE_FLOAT8E4M3: write(YTag<YKind::kE4M3>{}); break;
      default: write(YTag<YKind::kE5M2>{}); break;
    }
  }
  finish(a, amax);
}

// Rounds and stores one element of y and folds |y| into the thread's amax.
__device__ __forceinline__ void store_y_element(const FwdArgs& a, int64_t i, float y, float scale,
                                                float& amax) {
  amax = fmaxf(amax, fabsf(y));
  switch (a.y_dtype) {
    case TE_DTYPE_FLOAT32: static_cast<float*>(a.y)[i] = y; return;
    case TE_DTYPE_BFLOAT16: static_cast<__nv_bfloat16*>(a.y)[i] = __float2bfloat16_rn(y); return;
    case TE_DTYPE_FLOAT16: static_cast<__half*>(a.y)[i] = __float2half_rn(y); return;
    default: break;
  }
  static_cast<uint8_t*>(a.y)[i] = fp8_byte(__fmul_rn(y, scale), a.y_dtype == TE_DTYPE_FLOAT8E5M2);
}

template <class Tx, bool kLayerNorm>
__global__ void __launch_bounds__(kLoopThreads) norm_fwd_looped_kernel(const FwdArgs a) {
  __shared__ float exchange[32];
  const int64_t H = a.cols;
  const float n = static_cast<float>(H);
  const float scale = is_fp8_code(a.y_dtype) ? *a.y_scale : 1.0f;
  const Tx* x = static_cast<const Tx*>(a.x);
  float amax = 0.0f;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const Tx* xr = x + row * H;
    // Terms times `mul`: 1, or kStatScale to retry an overflowed sum (backend.h).
    auto sum_x = [&](float mul) {
      float s = 0.0f;
      for (int64_t i = threadIdx.x; i < H; i += kLoopThreads)
        s = __fadd_rn(s, __fmul_rn(to_f32(xr[i]), mul));
      return block_sum(s, exchange);
    };
    auto sum_squares = [&](float mu, float mul) {
      float ss = 0.0f;
      for (int64_t i = threadIdx.x; i < H; i += kLoopThreads) {
        const float d = __fmul_rn(kLayerNorm ? __fsub_rn(to_f32(xr[i]), mu) : to_f32(xr[i]), mul);
        ss = __fadd_rn(ss, __fmul_rn(d, d));
      }
      return block_sum(ss, exchange);
    };
    float mu, rsigma;
    row_statistics<kLayerNorm>(sum_x, sum_squares, n, a.eps, mu, rsigma);
    if (threadIdx.x == 0) {
      if (a.mu != nullptr) a.mu[row] = mu;
      if (a.rsigma != nullptr) a.rsigma[row] = rsigma;
    }
    for (int64_t i = threadIdx.x; i < H; i += kLoopThreads) {
      const float g = weight_at(a.gamma, a.w_dtype, i, a.zero_centered_gamma);
      const float b = kLayerNorm ? load_any(a.beta, a.w_dtype, i) : 0.0f;
      store_y_element(a, row * H + i, y_value<kLayerNorm>(to_f32(xr[i]), mu, rsigma, g, b), scale,
                      amax);
    }
  }
  finish(a, amax);
}

template <class Tx, bool kLayerNorm>
void launch(const FwdArgs& a, cudaStream_t stream) {
  const int64_t H = a.cols;
  const bool fits = with_fwd_shape<Tx>(H, [&](auto shape) {
    using S = decltype(shape);
    // Vector accesses need whole chunks in every row (then every row starts
    // as aligned as the buffer), x 16-byte aligned and y aligned to its
    // chunk's bytes (16 at most). Otherwise every access is per element.
    const int y_size = is_fp8_code(a.y_dtype) ? 1 : a.y_dtype == TE_DTYPE_FLOAT32 ? 4 : 2;
    const int y_chunk = S::kE * y_size;
    const bool vec =
        H % S::kE == 0 && is_aligned(a.x, 16) && is_aligned(a.y, y_chunk < 16 ? y_chunk : 16);
    auto kernel =
        vec ? norm_fwd_kernel<Tx, S, kLayerNorm, true> : norm_fwd_kernel<Tx, S, kLayerNorm, false>;
    const size_t smem = sizeof(float) * ceil_div(H, S::kE) * S::kE * (kLayerNorm ? 2 : 1);
    const int64_t grid = resident_grid(reinterpret_cast<const void*>(kernel), S::kBlockThreads,
                                       smem, ceil_div(a.rows, S::kRows));
    kernel<<<grid, S::kBlockThreads, smem, stream>>>(a);
  });
  if (!fits) {
    auto kernel = norm_fwd_looped_kernel<Tx, kLayerNorm>;
    const int64_t grid =
        resident_grid(reinterpret_cast<const void*>(kernel), kLoopThreads, 0, a.rows);
    kernel<<<grid, kLoopThreads, 0, stream>>>(a);
  }
  TE_CHECK_LAUNCH();
}

}  // namespace

void forward(const FwdArgs& a, te_stream stream) {
  dispatch_x(a.x_dtype, [&](auto x_tag) {
    using Tx = decltype(x_tag);
    if (a.layernorm) {
      launch<Tx, true>(a, cuda_stream(stream));
    } else {
      launch<Tx, false>(a, cuda_stream(stream));
    }
  });
}

}  // namespace te::norm::cuda
