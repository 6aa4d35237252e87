// Exhaustive check of NVFP4's E2M1 rounding (nvfp4/formulas.h) against the
// definitions of te/nvfp4.h, on all 2^32 FP32 inputs. Not part of the CTest
// suite (it takes minutes); run it after any change to the E2M1 routines:
//
//   g++ -O2 -std=c++17 -pthread -I core/src -I core/include
//       core/tests/nvfp4_e2m1_exhaustive.cpp -o /tmp/e2m1_check && /tmp/e2m1_check
//
// (An argument n checks every n-th input only, for a quick run.)
// Round to nearest even: float_to_e2m1(v) equals the thresholds' code, and the
// biased magnitude code minus its bias is 0..7 (so that encode8's packed sums
// have no carries between nibbles).
// Stochastic rounding: for every v, the result is lo or lo + 1 with a cut at
// T = ceil(frac * 2^32) (computed here in FP64, exactly): both functions are
// monotone in r, so agreeing at r = T - 1 and r = T (and at 0 and 2^32 - 1)
// means agreeing for every r.
// The packed encoders (encode8, encode_block) are checked on random blocks
// against the per-element codes. The min-of-three route to the nearest code
// (e2m1_nearest_min3_biased, encode8<false, true>) is checked the same way.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "nvfp4/formulas.h"

namespace {

using namespace te::nvfp4;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// te/nvfp4.h: the thresholds, ties to the even code; NaN -> +6.
uint8_t reference_nearest(float v) {
  if (std::isnan(v)) return 0x7;
  const uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
  const float a = std::fabs(v);
  uint8_t code = 7;
  if (a <= 0.25f)
    code = 0;
  else if (a < 0.75f)
    code = 1;
  else if (a <= 1.25f)
    code = 2;
  else if (a < 1.75f)
    code = 3;
  else if (a <= 2.5f)
    code = 4;
  else if (a < 3.5f)
    code = 5;
  else if (a <= 5.0f)
    code = 6;
  return static_cast<uint8_t>(sign | code);
}

constexpr double kValues[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// te/nvfp4.h: lo <= a < hi neighbours, up when r < frac * 2^32 (exact in FP64).
// Also returns the cut T = ceil(frac * 2^32) through *cut.
uint8_t reference_stochastic(float v, uint32_t r, double* cut) {
  *cut = 0.0;
  if (std::isnan(v)) return 0x7;
  const uint8_t sign = std::signbit(v) ? 0x8 : 0x0;
  const double a = std::fabs(static_cast<double>(v));
  if (a >= 6.0) return static_cast<uint8_t>(sign | 0x7);
  int lo = 0;
  while (kValues[lo + 1] <= a) ++lo;
  const double frac = (a - kValues[lo]) / (kValues[lo + 1] - kValues[lo]);
  *cut = std::ceil(frac * 4294967296.0);
  const bool up = static_cast<double>(r) < frac * 4294967296.0;
  return static_cast<uint8_t>(sign | (lo + (up ? 1 : 0)));
}

std::atomic<uint64_t> failures{0};

void report(const char* what, uint32_t bits, uint32_t r, int got, int want) {
  if (failures.fetch_add(1) < 20)
    std::printf("%s: v = 0x%08x r = 0x%08x: got 0x%x, want 0x%x\n", what, bits, r, got, want);
}

void check_range(uint64_t begin, uint64_t end, uint64_t stride) {
  for (uint64_t u = begin; u < end; u += stride) {
    const uint32_t bits = static_cast<uint32_t>(u);
    const float v = from_bits(bits);
    const uint8_t want = reference_nearest(v);
    const uint8_t got = float_to_e2m1(v);
    if (got != want) report("nearest", bits, 0, got, want);
    const uint32_t magnitude = e2m1_nearest_biased(v) - kE2M1CodeBias;
    if (magnitude > 7u)
      report("nearest magnitude out of 0..7", bits, 0, static_cast<int>(magnitude), 0);
    const uint32_t min3 = e2m1_nearest_min3_biased(v) - kE2M1Min3Bias;
    if (min3 != (want & 0x7u))
      report("nearest (min of three)", bits, 0, static_cast<int>(min3), want & 7);

    double cut;
    reference_stochastic(v, 0, &cut);
    uint32_t rs[4] = {0u, 0xFFFFFFFFu, 0u, 0u};
    int n = 2;
    if (cut > 0.0) rs[n++] = static_cast<uint32_t>(cut - 1.0);
    if (cut < 4294967296.0) rs[n++] = static_cast<uint32_t>(cut);
    for (int i = 0; i < n; ++i) {
      const uint8_t want_sr = reference_stochastic(v, rs[i], &cut);
      const uint8_t got_sr = float_to_e2m1_stochastic(v, rs[i]);
      if (got_sr != want_sr) report("stochastic", bits, rs[i], got_sr, want_sr);
      const uint32_t m = e2m1_stochastic_biased(v, rs[i]) - kE2M1CodeBias;
      if (m > 7u) report("stochastic magnitude out of 0..7", bits, rs[i], static_cast<int>(m), 0);
    }
  }
}

// Random blocks with hostile values: packed codes equal the per-element ones.
void check_packing() {
  std::mt19937_64 gen(1234);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 200000; ++trial) {
    float v[kBlock];
    uint32_t random[kBlock];
    for (int i = 0; i < kBlock; ++i) {
      v[i] = (gen() % 4 == 0) ? from_bits(any_bits(gen)) : normal(gen);
      random[i] = any_bits(gen);
    }
    const float enc = (trial % 3 == 0) ? 1.0f : std::fabs(normal(gen)) + 1e-30f;
    const uint64_t nearest = encode_block(v, enc, nullptr);
    const uint64_t stochastic = encode_block(v, enc, random);
    const uint64_t min3 = (static_cast<uint64_t>(encode8<false, true>(v + 8, enc, nullptr)) << 32) |
                          encode8<false, true>(v, enc, nullptr);
    if (min3 != nearest)
      report("encode8 (min of three)", 0, 0, static_cast<int>(min3 != nearest), 0);
    for (int i = 0; i < kBlock; ++i) {
      const float y = v[i] * enc;
      const int got = static_cast<int>((nearest >> (4 * i)) & 0xF);
      const int got_sr = static_cast<int>((stochastic >> (4 * i)) & 0xF);
      uint32_t y_bits;
      std::memcpy(&y_bits, &y, sizeof y_bits);
      if (got != float_to_e2m1(y)) report("encode_block", y_bits, 0, got, float_to_e2m1(y));
      if (got_sr != float_to_e2m1_stochastic(y, random[i]))
        report("encode_block stochastic", y_bits, random[i], got_sr,
               float_to_e2m1_stochastic(y, random[i]));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  check_packing();
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t total = uint64_t{1} << 32, chunk = total / workers;
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w)
    threads.emplace_back(check_range, w * chunk, w + 1 == workers ? total : (w + 1) * chunk,
                         stride);
  for (auto& t : threads) t.join();
  if (failures.load() != 0) {
    std::printf("FAILED: %llu mismatches\n", static_cast<unsigned long long>(failures.load()));
    return 1;
  }
  std::printf("E2M1 nearest and stochastic rounding agree with te/nvfp4.h on %s\n",
              stride == 1 ? "all 2^32 inputs" : "the sampled inputs");
  return 0;
}
