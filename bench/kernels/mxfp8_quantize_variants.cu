// Standalone driver: times the MXFP8 quantize kernels of the core (the warp-tile
// kernel that was the only one before, and candidate shapes of the tiled kernel)
// on 32768 x 4096 BF16 against a device-to-device copy, and checks every
// candidate's bytes against the CPU backend (te::mxfp8::cpu::quantize) first.
// Built and run by run_mxfp8_variants.sh. Byte counting as bench/bench_mxfp8.py:
// 2 B read + per direction 1 B written and 1/32 B of scales, per element; the
// copy ceiling counts read + write of a 1 GiB copy (bench_core.py).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "mxfp8/backend.h"
#include "mxfp8/numerics.h"
#include "mxfp8/quantize_tile.cuh"
#include "mxfp8/quantize_warp.cuh"

using namespace te::mxfp8;
using cuda::tiled::Shape;

#define CHECK(expr)                                                                                \
  do {                                                                                             \
    const cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

namespace {

using Launch = void (*)(const QuantizeArgs&, cudaStream_t);

template <class In, bool kE5M2>
void run_warp(const QuantizeArgs& a, cudaStream_t s) {
  cuda::warp::launch_quantize<In, kE5M2, true>(a, s);  // with its cudaMemsetAsync of the padding
}
template <class In, bool kE5M2, class S>
void run_tiled(const QuantizeArgs& a, cudaStream_t s) {
  if (!cuda::tiled::fits(a)) {
    std::fprintf(stderr, "tiled kernel: unaligned pointer\n");
    std::exit(2);
  }
  cuda::tiled::launch_quantize<In, kE5M2, S>(a, s);
}

// The candidates, BF16 -> E4M3. The core runs tiled::DefaultShape
// (quantize_tile.cuh), the first tiled one here; to switch, change it there.
struct Variant {
  const char* name;
  Launch launch;
};
const Variant kVariants[] = {
    {"old warp-tile (32x64/warp, 256 thr)", run_warp<__nv_bfloat16, false>},
    {"tiled 64x128, 128 thr, col 8 lanes",
     run_tiled<__nv_bfloat16, false, Shape<64, 128, 128, 8, 8>>},
    {"tiled 128x128, 256 thr, col 8 lanes",
     run_tiled<__nv_bfloat16, false, Shape<128, 128, 256, 4, 8>>},
    {"tiled 128x64, 128 thr, col 8 lanes",
     run_tiled<__nv_bfloat16, false, Shape<128, 64, 128, 8, 8>>},
    {"tiled 128x128, 256 thr, col 16 lanes",
     run_tiled<__nv_bfloat16, false, Shape<128, 128, 256, 3, 16>>},
    {"tiled 64x128, 128 thr, 2 stages",
     run_tiled<__nv_bfloat16, false, Shape<64, 128, 128, 6, 8, 2>>},
    {"tiled 64x64, 128 thr, 2 stages",
     run_tiled<__nv_bfloat16, false, Shape<64, 64, 128, 8, 8, 2>>},
    {"tiled 128x128, 256 thr, row blk/thr",
     run_tiled<__nv_bfloat16, false, Shape<128, 128, 256, 4, 8, 1, true>>},
    {"tiled 64x128, 128 thr, 2 st, row blk/thr",
     run_tiled<__nv_bfloat16, false, Shape<64, 128, 128, 6, 8, 2, true>>},
};
using cuda::tiled::DefaultShape;
static_assert(std::is_same_v<DefaultShape, Shape<64, 128, 128, 8, 8>>,
              "keep kVariants[1] the core's default");

// Other inputs and E5M2, for the default shape only (correctness).
struct Extra {
  const char* name;
  te_dtype in, fp8;
  Launch launch;
};
const Extra kExtras[] = {
    {"default shape, fp32 -> e4m3", TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT8E4M3,
     run_tiled<float, false, DefaultShape>},
    {"old warp-tile, fp32 -> e4m3", TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT8E4M3, run_warp<float, false>},
    {"default shape, fp16 -> e5m2", TE_DTYPE_FLOAT16, TE_DTYPE_FLOAT8E5M2,
     run_tiled<__half, true, DefaultShape>},
    {"default shape, bf16 -> e5m2", TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8E5M2,
     run_tiled<__nv_bfloat16, true, DefaultShape>},
};

struct Mode {
  const char* name;
  bool row, col, two_d, swizzled;
  double bytes_per_elem;  // bench_mxfp8.py's count, BF16 input
};
const Mode kModes[] = {
    {"rowwise", true, false, false, false, 2 + 1 + 1 / 32.0},
    {"columnwise", false, true, false, false, 2 + 1 + 1 / 32.0},
    {"both", true, true, false, false, 2 + 2 + 2 / 32.0},
    {"both, swizzled", true, true, false, true, 2 + 2 + 2 / 32.0},
    {"2-D both", true, true, true, false, 2 + 2 + 2 / 32.0},
    {"2-D rowwise", true, false, true, false, 2 + 1 + 1 / 32.0},
    {"2-D columnwise", false, true, true, false, 2 + 1 + 1 / 32.0},
};

int elem_size(te_dtype t) { return t == TE_DTYPE_FLOAT32 ? 4 : 2; }

// A quantize problem: input and outputs on host (CPU reference) and device.
struct Problem {
  int64_t rows, cols;
  te_dtype in_dtype, fp8;
  std::vector<uint8_t> input;  // host bytes
  void* d_input = nullptr;
  uint8_t *d_out[2] = {}, *d_scales[2] = {};
  int64_t scale_rows[2], scale_cols[2];

  Problem(int64_t m, int64_t k, te_dtype in, te_dtype f) : rows(m), cols(k), in_dtype(in), fp8(f) {
    rowwise_scale_shape(m, k, &scale_rows[0], &scale_cols[0]);
    columnwise_scale_shape(m, k, &scale_rows[1], &scale_cols[1]);
    input.resize(m * k * elem_size(in));
    CHECK(cudaMalloc(&d_input, input.size() + 16));
    for (int d = 0; d < 2; ++d) {
      CHECK(cudaMalloc(&d_out[d], m * k));
      CHECK(cudaMalloc(&d_scales[d], scale_rows[d] * scale_cols[d] + 16));
    }
  }
  ~Problem() {
    cudaFree(d_input);
    for (int d = 0; d < 2; ++d) cudaFree(d_out[d]), cudaFree(d_scales[d]);
  }
  void upload() { CHECK(cudaMemcpy(d_input, input.data(), input.size(), cudaMemcpyHostToDevice)); }

  QuantizeArgs args(const Mode& m, void* input_ptr, uint8_t* const (&out)[2],
                    uint8_t* const (&sc)[2]) const {
    QuantizeArgs a{};
    a.input = input_ptr;
    a.input_dtype = in_dtype;
    a.rows = rows;
    a.cols = cols;
    a.fp8_dtype = fp8;
    if (m.row) {
      a.rowwise = out[0], a.rowwise_scales = sc[0];
      a.row_scale_rows = scale_rows[0], a.row_scale_cols = scale_cols[0];
    }
    if (m.col) {
      a.columnwise = out[1], a.columnwise_scales = sc[1];
      a.col_scale_rows = scale_rows[1], a.col_scale_cols = scale_cols[1];
    }
    a.use_2d_blocks = m.two_d;
    a.swizzled = m.swizzled;
    return a;
  }
  QuantizeArgs device_args(const Mode& m) const { return args(m, d_input, d_out, d_scales); }
};

// ---- hostile inputs ------------------------------------------------------------

uint64_t rng_state = 0x9E3779B97F4A7C15ull;
uint32_t next_u32() {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return static_cast<uint32_t>(rng_state >> 16);
}
float uniform() { return (next_u32() >> 8) * (1.0f / 16777216.0f); }

void put(Problem& p, int64_t i, float v) {
  if (p.in_dtype == TE_DTYPE_FLOAT32) {
    std::memcpy(p.input.data() + 4 * i, &v, 4);
  } else if (p.in_dtype == TE_DTYPE_BFLOAT16) {
    const __nv_bfloat16 b = __float2bfloat16(v);
    std::memcpy(p.input.data() + 2 * i, &b, 2);
  } else {
    const __half h = __float2half(v);
    std::memcpy(p.input.data() + 2 * i, &h, 2);
  }
}

// Values over many binades per 32-element neighbourhood, plus NaN, +-inf, zeros,
// subnormals, an all-zero and an all-NaN 32x32 region.
void fill_hostile(Problem& p) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const float big = p.in_dtype == TE_DTYPE_FLOAT16 ? 60000.0f : 3.0e38f;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c) {
      const int64_t i = r * p.cols + c;
      const int binade = static_cast<int>((r / 7 + c / 32 * 5) % 40) - 20;
      float v = (uniform() * 2 - 1) * std::ldexp(1.0f, binade);
      const uint32_t pick = next_u32() % 4096;
      if (pick == 0)
        v = nan;
      else if (pick == 1)
        v = inf;
      else if (pick == 2)
        v = -inf;
      else if (pick == 3)
        v = 0.0f;
      else if (pick == 4)
        v = big;
      else if (pick == 5)
        v = 1e-40f;
      else if (pick == 6)
        v = -1e-7f;
      if (r < 32 && c < 32) v = 0.0f;
      if (r >= 32 && r < 64 && c < 32) v = nan;
      put(p, i, v);
    }
  }
}

// ---- correctness -----------------------------------------------------------------

struct Candidate {
  const char* name;
  te_dtype in, fp8;
  Launch launch;
  bool ok = true;
};

// The CPU backend's bytes for one mode; then each candidate's, compared.
void check_mode(const Problem& p, const Mode& m, std::vector<Candidate*>& candidates) {
  std::vector<uint8_t> want_out[2], want_sc[2];
  uint8_t* out_ptr[2];
  uint8_t* sc_ptr[2];
  for (int d = 0; d < 2; ++d) {
    want_out[d].assign(p.rows * p.cols, 0xA5);
    want_sc[d].assign(p.scale_rows[d] * p.scale_cols[d], 0xA5);
    out_ptr[d] = want_out[d].data(), sc_ptr[d] = want_sc[d].data();
  }
  cpu::quantize(p.args(m, const_cast<uint8_t*>(p.input.data()), out_ptr, sc_ptr));
  const bool wanted[2] = {m.row, m.col};
  for (Candidate* c : candidates) {
    for (int d = 0; d < 2; ++d) {  // poisoned: a byte the kernel forgets shows up
      CHECK(cudaMemset(p.d_out[d], 0xA5, want_out[d].size()));
      CHECK(cudaMemset(p.d_scales[d], 0xA5, want_sc[d].size()));
    }
    c->launch(p.device_args(m), nullptr);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    for (int d = 0; d < 2; ++d) {
      if (!wanted[d]) continue;
      for (int w = 0; w < 2; ++w) {
        const std::vector<uint8_t>& want = w ? want_sc[d] : want_out[d];
        std::vector<uint8_t> got(want.size());
        CHECK(cudaMemcpy(got.data(), w ? p.d_scales[d] : p.d_out[d], got.size(),
                         cudaMemcpyDeviceToHost));
        const auto bad = std::mismatch(got.begin(), got.end(), want.begin());
        if (bad.first == got.end()) continue;
        c->ok = false;
        std::printf(
            "  FAIL %-38s %5lldx%-5lld %-15s swizzled=%d: %s %s byte %lld of %zu: got 0x%02x, want "
            "0x%02x\n",
            c->name, (long long)p.rows, (long long)p.cols, m.name, m.swizzled,
            d ? "columnwise" : "rowwise", w ? "scales" : "data",
            (long long)(bad.first - got.begin()), got.size(), *bad.first, *bad.second);
      }
    }
  }
}

// Every mode, compact and swizzled, on odd shapes (rows not a multiple of the
// tiles, K not a multiple of 128, scale padding in both directions).
void check_all(std::vector<Candidate>& all) {
  static const int64_t kShapes[][2] = {{160, 96}, {4128, 4096}, {96, 4256}, {100, 224}, {1, 32}};
  for (size_t first = 0; first < all.size();) {
    std::vector<Candidate*> group;  // same input and FP8 type
    size_t last = first;
    while (last < all.size() && all[last].in == all[first].in && all[last].fp8 == all[first].fp8)
      group.push_back(&all[last++]);
    for (const auto& shape : kShapes) {
      Problem p(shape[0], shape[1], all[first].in, all[first].fp8);
      fill_hostile(p);
      p.upload();
      for (const Mode& m : kModes) {
        if ((m.col || m.two_d) && p.rows % 32 != 0) continue;  // the API's rule
        for (const bool swizzled : {false, true}) {
          Mode mm = m;
          mm.swizzled = swizzled;
          check_mode(p, mm, group);
        }
      }
    }
    first = last;
  }
  for (const Candidate& c : all) std::printf("%s %s\n", c.ok ? "PASS" : "FAIL", c.name);
}

// ---- timing --------------------------------------------------------------------

template <class F>
float median_ms(F&& f, int warmup = 5, int iters = 30) {
  for (int i = 0; i < warmup; ++i) f();
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, end;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&end));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(start));
    f();
    CHECK(cudaEventRecord(end));
    CHECK(cudaEventSynchronize(end));
    CHECK(cudaEventElapsedTime(&ms[i], start, end));
  }
  CHECK(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

__global__ void fill_normalish(__nv_bfloat16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    const float u = ((h & 0xFFFF) + (h >> 16)) * (1.0f / 65536.0f) - 1.0f;  // triangular on (-1, 1)
    x[i] = __float2bfloat16(u * 2.5f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool skip_check = argc > 1 && std::strcmp(argv[1], "--time-only") == 0;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  bool all_ok = true;
  if (!skip_check) {
    std::printf(
        "== bytes vs the CPU backend (160x96, 4128x4096, 96x4256; rowwise only: 100x224, 1x32)\n");
    std::vector<Candidate> all;
    for (const Variant& v : kVariants)
      all.push_back({v.name, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8E4M3, v.launch});
    for (const Extra& e : kExtras) all.push_back({e.name, e.in, e.fp8, e.launch});
    check_all(all);
    for (const Candidate& c : all) all_ok = all_ok && c.ok;
  }

  const int64_t kRows = 32768, kCols = 4096, n = kRows * kCols;
  Problem p(kRows, kCols, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8E4M3);
  fill_normalish<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p.d_input), n);
  CHECK(cudaDeviceSynchronize());

  // Copy ceilings: the input's bytes, and 1 GiB (bench_core.py's), read + write.
  const size_t in_bytes = n * 2, gib = size_t{1} << 30;
  void *src, *dst;
  CHECK(cudaMalloc(&src, gib));
  CHECK(cudaMalloc(&dst, gib));
  CHECK(cudaMemset(src, 1, gib));
  const float copy_in_ms = median_ms(
      [&] { CHECK(cudaMemcpyAsync(dst, p.d_input, in_bytes, cudaMemcpyDeviceToDevice)); });
  const float copy_gib_ms =
      median_ms([&] { CHECK(cudaMemcpyAsync(dst, src, gib, cudaMemcpyDeviceToDevice)); });
  cudaFree(src);
  cudaFree(dst);
  const double copy_in_gbs = 2.0 * in_bytes / copy_in_ms / 1e6,
               copy_gib_gbs = 2.0 * gib / copy_gib_ms / 1e6;
  std::printf("== timing, %lldx%lld bf16 -> e4m3, median of 30\n", (long long)kRows,
              (long long)kCols);
  std::printf(
      "copy ceiling: %.0f GB/s (1 GiB D2D, read+write; used for %%); %.0f GB/s for the input's 256 "
      "MiB\n",
      copy_gib_gbs, copy_in_gbs);
  std::printf("%-38s %-15s %9s %9s %7s %9s\n", "kernel", "mode", "ms", "GB/s", "%copy",
              "%copy256M");
  for (const Mode& m : kModes) {
    for (const Variant& v : kVariants) {
      const QuantizeArgs a = p.device_args(m);
      const float ms = median_ms([&] { v.launch(a, nullptr); });
      const double gbs = n * m.bytes_per_elem / ms / 1e6;
      std::printf("%-38s %-15s %9.4f %9.0f %6.1f%% %8.1f%%\n", v.name, m.name, ms, gbs,
                  100 * gbs / copy_gib_gbs, 100 * gbs / copy_in_gbs);
    }
  }
  std::printf("%s\n", skip_check ? "(correctness not checked)"
                      : all_ok   ? "ALL PASS"
                                 : "SOME FAILED");
  return all_ok ? 0 : 1;
}
