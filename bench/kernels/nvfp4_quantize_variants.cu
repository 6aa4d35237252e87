// Standalone measurement of the NVFP4 quantize kernels (no Python, no te-core
// library): the general kernel and every candidate configuration of the fast
// kernel (core/src/nvfp4/cuda_quantize_fast.cuh), on one GPU, in one run.
//
//  1. Correctness: every implementation against the CPU backend (cpu.cpp, the
//     executable spec) on small and ragged shapes with hostile values (NaN
//     of both signs, infinities, zeros of both signs, denormals, E2M1 ties,
//     blocks scaled from 2^-130 to 2^120), all three direction choices, one
//     columnwise amax larger than the rowwise one, and unaligned scale
//     buffers. Bytes compared: data and scales, padding included. Prints
//     PASS/FAIL per case; exit status 1 on any failure.
//  2. Speed on 32768x4096 BF16 (RHT off, RNE, 1x16 blocks): rowwise,
//     columnwise and both, CUDA-event medians of 25 runs after 5 warm-ups,
//     each call as the core makes it (padding memsets + kernel). Rates count
//     what bench/bench_nvfp4.py counts: 2 B read per element plus 1/2 + 1/16 B
//     written per direction; the ceiling is cudaMemcpyAsync device to device
//     of the same input bytes, counted read + write.
//
// Build and run: bench/kernels/run_nvfp4_variants.sh (nvcc, about 30 s).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

// The core's quantize translation unit: its internal launchers (the general
// kernel and fast::launch<Candidate<i>>) are callable from here.
#include "nvfp4/cuda_quantize.cu"

using te::nvfp4::Direction;
using te::nvfp4::QuantizeArgs;
using te::nvfp4::scale_shape;
using te::nvfp4::ScaleShape;

namespace {

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

// Implementation ids: -1 the general kernel, 0.. the fast candidates, and
// kCoreDefault the core's own te::nvfp4::cuda::quantize (whatever it picks).
constexpr int kGeneral = -1;
constexpr int kCoreDefault = 100;

std::string impl_name(int impl) {
  if (impl == kGeneral) return "general (old) kernel";
  if (impl == kCoreDefault) return "core default";
  struct Named {
    int id;
    const char* shape;
  };
  static const Named names[] = {{0, "64x256 thr, 4/SM, magic"},
                                {1, "128x256 thr, 4/SM, magic"},
                                {2, "128x256 thr, 4/SM, min3"},
                                {3, "128x512 thr, 2/SM, min3"},
                                {4, "128x256 thr, 3/SM, min3"},
                                {5, "64x256 thr, 4/SM, min3"},
                                {6, "64x256 thr, 3/SM, min3, persistent"},
                                {11, "128x256 thr, 4/SM, packed"},
                                {12, "64x256 thr, 4/SM, packed"},
                                {13, "128x256 thr, 3/SM, packed"},
                                {14, "128x512 thr, 2/SM, packed"}};
  static_assert(sizeof(names) / sizeof(names[0]) == std::size(te::nvfp4::cuda::fast::kCandidateIds),
                "one name per candidate");
  for (const Named& n : names)
    if (n.id == impl) return "fast " + std::to_string(impl) + " (" + n.shape + ")";
  return "fast " + std::to_string(impl);
}

// Launches candidate kCandidateIds[I..] whose index is impl.
template <size_t I>
void launch_candidate(int impl, const QuantizeArgs& a, cudaStream_t s) {
  using namespace te::nvfp4::cuda;
  if constexpr (I < std::size(fast::kCandidateIds)) {
    constexpr int kId = fast::kCandidateIds[I];
    if (impl == kId) return fast::launch<fast::Candidate<kId>>(a, s);
    launch_candidate<I + 1>(impl, a, s);
  }
}

// One quantize call as the core makes it, with the chosen kernel.
void run_impl(int impl, const QuantizeArgs& a, cudaStream_t s) {
  using namespace te::nvfp4::cuda;
  if (impl == kCoreDefault) return quantize(a, s);
  const Direction& rw = a.rowwise;
  const Direction& cw = a.columnwise;
  if (rw.data) clear_scale_padding(rw.scale, a.rows, a.cols / 16, rw.scale_rows, rw.scale_cols, s);
  if (cw.data) clear_scale_padding(cw.scale, a.cols, a.rows / 16, cw.scale_rows, cw.scale_cols, s);
  if (impl == kGeneral || !fast::applies(a)) return launch_general(a, s);
  launch_candidate<0>(impl, a, s);
}

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);  // truncation: any bit pattern is a valid input
}
uint16_t fp16_bits(float f) {
  const __half h = __float2half_rn(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

// Hostile 16-bit input: per 16x16 region a scale 2^e (e in [-130, 120]),
// values normal(0, 1), E2M1 midpoints and grid points times the scale, zeros,
// infinities (with_inf; they make the global amax infinite, so S_enc = 1),
// NaNs with either sign and payloads, denormals.
std::vector<uint16_t> hostile(int64_t rows, int64_t cols, bool fp16, bool with_inf,
                              std::mt19937& g) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp_dist(-130, 120);
  static const float special[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f,
                                  0.5f,  1.0f,  1.5f,  2.0f,  3.0f, 4.0f, 0.0f, 6.5f, 5.5f};
  std::vector<int> region_exp(static_cast<size_t>((rows / 16 + 1) * (cols / 16 + 1)));
  for (int& e : region_exp) e = uni(g) < 0.6f ? 0 : exp_dist(g);
  std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int e = region_exp[static_cast<size_t>((r / 16) * (cols / 16 + 1) + c / 16)];
      const float scale = std::ldexp(1.0f, fp16 ? std::max(e / 8, -14) : e);
      const float p = uni(g);
      float v;
      if (p < 0.70f) {
        v = normal(g) * scale;
      } else if (p < 0.90f) {
        v = special[g() % (sizeof(special) / sizeof(float))] * scale * (uni(g) < 0.5f ? -1 : 1);
      } else if (p < 0.93f) {
        v = uni(g) < 0.5f ? 0.0f : -0.0f;
      } else if (p < 0.95f) {
        v = with_inf ? (uni(g) < 0.5f ? INFINITY : -INFINITY) : normal(g) * scale;
      } else if (p < 0.97f) {
        out[static_cast<size_t>(r * cols + c)] =
            static_cast<uint16_t>((fp16 ? 0x7E01 : 0x7FC1) | (uni(g) < 0.5f ? 0x8000 : 0));
        continue;
      } else {
        out[static_cast<size_t>(r * cols + c)] =
            static_cast<uint16_t>((g() & 0x3F) | (uni(g) < 0.5f ? 0x8000 : 0));  // denormal
        continue;
      }
      out[static_cast<size_t>(r * cols + c)] = fp16 ? fp16_bits(v) : bf16_bits(v);
    }
  }
  // A whole NaN block and a whole zero block when they fit.
  if (rows >= 2 && cols >= 32) {
    for (int i = 0; i < 16; ++i) out[static_cast<size_t>(i)] = fp16 ? 0xFE00 : 0xFFC0;
    for (int i = 16; i < 32; ++i) out[static_cast<size_t>(cols + i)] = 0;
  }
  return out;
}

// Common-block input: per 16x16 region a scale 2^e (e in [-6, 6]), values
// normal(0, 1) or E2M1 grid points and midpoints times the scale; no zeros,
// infinities, NaNs or denormals, so every block takes the kPacked candidates'
// packed route (hostile input sends nearly every warp to the general route).
// nan_every > 0 puts a NaN at every nan_every-th element: then some warps take
// the general route and their neighbours the packed one.
std::vector<uint16_t> common_blocks(int64_t rows, int64_t cols, bool fp16, int64_t nan_every,
                                    std::mt19937& g) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp_dist(-6, 6);
  static const float grid[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f,
                               2.0f,  2.5f, 3.0f,  3.5f, 4.0f,  5.0f, 6.0f};
  std::vector<int> region_exp(static_cast<size_t>((rows / 16 + 1) * (cols / 16 + 1)));
  for (int& e : region_exp) e = exp_dist(g);
  std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    const int64_t r = i / cols, c = i % cols;
    const float scale =
        std::ldexp(1.0f, region_exp[static_cast<size_t>((r / 16) * (cols / 16 + 1) + c / 16)]);
    float v = uni(g) < 0.8f ? normal(g) : grid[g() % (sizeof(grid) / sizeof(float))];
    v *= scale * (uni(g) < 0.5f ? -1.0f : 1.0f);
    out[static_cast<size_t>(i)] = fp16 ? fp16_bits(v) : bf16_bits(v);
    if (nan_every > 0 && i % nan_every == nan_every - 1)
      out[static_cast<size_t>(i)] = fp16 ? 0x7E00 : 0x7FC0;
  }
  return out;
}

struct Buffers {
  uint8_t *row = nullptr, *row_scale = nullptr, *col = nullptr, *col_scale = nullptr;
};

// Device and host outputs of one case; scale_offset shifts the scale buffers
// (1: unaligned, the byte-store fallbacks).
struct Case {
  int64_t rows, cols;
  bool rowwise, columnwise, fp16;
  float col_amax_factor;
  int scale_offset;
  bool with_inf;
  int64_t common = 0;  // > 0: common_blocks input with a NaN every `common - 1` elements (1: none)
};

bool check_case(const Case& k, const std::vector<int>& impls, std::mt19937& g) {
  const int64_t n = k.rows * k.cols;
  const std::vector<uint16_t> x = k.common > 0
                                      ? common_blocks(k.rows, k.cols, k.fp16, k.common - 1, g)
                                      : hostile(k.rows, k.cols, k.fp16, k.with_inf, g);
  const te_dtype dtype = k.fp16 ? TE_DTYPE_FLOAT16 : TE_DTYPE_BFLOAT16;
  float amax[2];
  te::nvfp4::cpu::compute_amax(x.data(), dtype, k.rows, k.cols, &amax[0], &amax[1], {});
  amax[1] *= k.col_amax_factor;
  const ScaleShape rs = scale_shape(k.rows, k.cols), cs = scale_shape(k.cols, k.rows);
  const size_t data_bytes = static_cast<size_t>(n / 2);
  const size_t rs_bytes = static_cast<size_t>(rs.rows * rs.cols);
  const size_t cs_bytes = static_cast<size_t>(cs.rows * cs.cols);

  // CPU reference.
  std::vector<uint8_t> h_row(data_bytes), h_rs(rs_bytes), h_col(data_bytes), h_cs(cs_bytes);
  QuantizeArgs cpu{x.data(), dtype, k.rows, k.cols, {}, {}, {}};
  if (k.rowwise) cpu.rowwise = Direction{h_row.data(), h_rs.data(), rs.rows, rs.cols, &amax[0]};
  if (k.columnwise)
    cpu.columnwise = Direction{h_col.data(), h_cs.data(), cs.rows, cs.cols, &amax[1]};
  te::nvfp4::cpu::quantize(cpu);

  void* d_x;
  float* d_amax;
  uint8_t *d_row, *d_rs, *d_col, *d_cs;
  CHECK(cudaMalloc(&d_x, static_cast<size_t>(n) * 2));
  CHECK(cudaMalloc(&d_amax, 8));
  CHECK(cudaMalloc(&d_row, data_bytes + 16));
  CHECK(cudaMalloc(&d_col, data_bytes + 16));
  CHECK(cudaMalloc(&d_rs, rs_bytes + 16));
  CHECK(cudaMalloc(&d_cs, cs_bytes + 16));
  CHECK(cudaMemcpy(d_x, x.data(), static_cast<size_t>(n) * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_amax, amax, 8, cudaMemcpyHostToDevice));
  bool all_ok = true;
  for (int impl : impls) {
    for (uint8_t* p : {d_row, d_col}) CHECK(cudaMemset(p, 0xA5, data_bytes + 16));
    CHECK(cudaMemset(d_rs, 0xA5, rs_bytes + 16));
    CHECK(cudaMemset(d_cs, 0xA5, cs_bytes + 16));
    QuantizeArgs a{d_x, dtype, k.rows, k.cols, {}, {}, {}};
    if (k.rowwise) a.rowwise = Direction{d_row, d_rs + k.scale_offset, rs.rows, rs.cols, d_amax};
    if (k.columnwise)
      a.columnwise = Direction{d_col, d_cs + k.scale_offset, cs.rows, cs.cols, d_amax + 1};
    run_impl(impl, a, nullptr);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::string bad;
    auto compare = [&](const char* what, const uint8_t* dev, const std::vector<uint8_t>& want) {
      std::vector<uint8_t> got(want.size());
      CHECK(cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != want[i]) {
          char msg[160];
          std::snprintf(msg, sizeof(msg), " %s[%zu] got %#x want %#x;", what, i, got[i], want[i]);
          bad += msg;
          return;
        }
      }
    };
    if (k.rowwise) {
      compare("rowwise", d_row, h_row);
      compare("rowwise_scale", d_rs + k.scale_offset, h_rs);
    }
    if (k.columnwise) {
      compare("columnwise", d_col, h_col);
      compare("columnwise_scale", d_cs + k.scale_offset, h_cs);
    }
    std::printf("%s  %-58s %lldx%lld %s %s%s%s amax_col x%.0f scale+%d%s\n",
                bad.empty() ? "PASS" : "FAIL", impl_name(impl).c_str(),
                static_cast<long long>(k.rows), static_cast<long long>(k.cols),
                k.fp16 ? "fp16" : "bf16", k.rowwise ? "row" : "", k.columnwise ? "+col" : "",
                k.with_inf ? " inf" : "", k.col_amax_factor, k.scale_offset, bad.c_str());
    all_ok = all_ok && bad.empty();
  }
  for (void* p : {d_x, static_cast<void*>(d_amax), static_cast<void*>(d_row),
                  static_cast<void*>(d_col), static_cast<void*>(d_rs), static_cast<void*>(d_cs)})
    CHECK(cudaFree(p));
  return all_ok;
}

template <class F>
float median_ms(F&& f, cudaStream_t s, int warmup = 5, int runs = 25) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(runs));
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  for (int i = 0; i < runs; ++i) {
    CHECK(cudaEventRecord(ev[2 * i], s));
    f();
    CHECK(cudaEventRecord(ev[2 * i + 1], s));
  }
  CHECK(cudaEventSynchronize(ev.back()));
  std::vector<float> ms(static_cast<size_t>(runs));
  for (int i = 0; i < runs; ++i) CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void bench(const std::vector<int>& impls) {
  constexpr int64_t M = 32768, K = 4096, n = M * K;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  std::mt19937 g(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(n));
  for (auto& v : x) v = bf16_bits(normal(g));
  void *d_x, *d_copy;
  float* d_amax;
  uint8_t *d_row, *d_rs, *d_col, *d_cs;
  const ScaleShape rs = scale_shape(M, K), cs = scale_shape(K, M);
  CHECK(cudaMalloc(&d_x, n * 2));
  CHECK(cudaMalloc(&d_copy, n * 2));
  CHECK(cudaMalloc(&d_amax, 8));
  CHECK(cudaMalloc(&d_row, n / 2));
  CHECK(cudaMalloc(&d_col, n / 2));
  CHECK(cudaMalloc(&d_rs, rs.rows * rs.cols));
  CHECK(cudaMalloc(&d_cs, cs.rows * cs.cols));
  CHECK(cudaMemcpy(d_x, x.data(), n * 2, cudaMemcpyHostToDevice));
  te::nvfp4::cuda::compute_amax(d_x, TE_DTYPE_BFLOAT16, M, K, d_amax, d_amax + 1, {}, s);

  const float copy_ms = median_ms(
      [&] { CHECK(cudaMemcpyAsync(d_copy, d_x, n * 2, cudaMemcpyDeviceToDevice, s)); }, s);
  const double copy_gbs = 2.0 * n * 2 / copy_ms / 1e6;
  std::printf("\ncopy ceiling: cudaMemcpyAsync D2D of %lld MB: %.3f ms, %.0f GB/s (read + write)\n",
              static_cast<long long>(n * 2 / 1000000), copy_ms, copy_gbs);
  std::printf("\n%-60s %-11s %9s %9s %7s\n", "NVFP4 quantize 32768x4096 bf16", "directions", "ms",
              "GB/s", "% copy");
  const double per_dir = 0.5 + 1.0 / 16;
  struct Mode {
    const char* name;
    bool row, col;
  };
  for (const Mode mode :
       {Mode{"rowwise", true, false}, Mode{"columnwise", false, true}, Mode{"both", true, true}}) {
    for (int impl : impls) {
      QuantizeArgs a{d_x, TE_DTYPE_BFLOAT16, M, K, {}, {}, {}};
      if (mode.row) a.rowwise = Direction{d_row, d_rs, rs.rows, rs.cols, d_amax};
      if (mode.col) a.columnwise = Direction{d_col, d_cs, cs.rows, cs.cols, d_amax + 1};
      const float ms = median_ms([&] { run_impl(impl, a, s); }, s);
      CHECK(cudaGetLastError());
      const double bytes = n * (2.0 + per_dir * (mode.row + mode.col));
      const double gbs = bytes / ms / 1e6;
      std::printf("%-60s %-11s %9.3f %9.0f %6.1f%%\n", impl_name(impl).c_str(), mode.name, ms, gbs,
                  100.0 * gbs / copy_gbs);
    }
  }
  for (void* p : {d_x, d_copy, static_cast<void*>(d_amax), static_cast<void*>(d_row),
                  static_cast<void*>(d_col), static_cast<void*>(d_rs), static_cast<void*>(d_cs)})
    CHECK(cudaFree(p));
  CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  const bool check_only = argc > 1 && std::string(argv[1]) == "--check-only";
  std::vector<int> impls = {kGeneral};
  for (int id : te::nvfp4::cuda::fast::kCandidateIds) impls.push_back(id);
  impls.push_back(kCoreDefault);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; core default: kFastCandidate = %d\n\n", prop.name,
              prop.multiProcessorCount, te::nvfp4::cuda::kFastCandidate);

  std::mt19937 g(1234);
  const Case cases[] = {
      {48, 160, true, true, false, 1.0f, 0, false},
      {48, 160, true, true, false, 1.0f, 0, true},
      {4112, 4096, true, true, false, 1.0f, 0, false},
      {4112, 4096, true, true, false, 3.0f, 0, false},
      {80, 272, true, true, false, 1.0f, 0, false},
      {16, 16, true, true, false, 1.0f, 0, false},
      {208, 4112, true, true, false, 1.0f, 1, false},
      {208, 4112, true, true, false, 1.0f, 0, true},
      {2048, 528, true, false, false, 1.0f, 0, false},
      {2048, 528, false, true, false, 1.0f, 1, false},
      {5, 160, true, false, false, 1.0f, 0, false},
      {130, 64, true, false, false, 1.0f, 1, false},
      {6160, 1040, true, true, false, 1.0f, 0, false},
      {144, 400, true, true, true, 2.0f, 0, false},
      {4096, 4096, true, true, true, 1.0f, 0, false},
      {4096, 4096, true, true, true, 1.0f, 0, true},
      // The packed route of the kPacked candidates: common blocks, then with a
      // NaN every ~3000 elements (warps of both routes side by side).
      {4112, 4096, true, true, false, 1.0f, 0, false, 1},
      {4112, 4096, true, true, true, 1.0f, 0, false, 1},
      {208, 4112, true, true, false, 1.0f, 0, false, 1},
      {144, 400, true, true, true, 1.0f, 0, false, 1},
      {130, 272, true, false, false, 1.0f, 0, false, 1},
      {272, 48, false, true, true, 1.0f, 1, false, 1},
      {2048, 4096, true, true, false, 3.0f, 0, false, 1},
      {4112, 4096, true, true, false, 1.0f, 0, false, 3002},
      {4112, 4096, true, true, true, 1.0f, 0, false, 3002},
  };
  bool ok = true;
  for (const Case& c : cases) ok = check_case(c, impls, g) && ok;
  std::printf("\ncorrectness: %s\n", ok ? "ALL PASS" : "SOME FAIL");
  if (!check_only) bench(impls);
  return ok ? 0 : 1;
}
