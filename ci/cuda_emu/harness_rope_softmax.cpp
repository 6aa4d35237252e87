// Emulated CUDA kernels of the RoPE and fused softmax families (ci/cuda_emu/run.sh) vs their
// CPU backends, bit for bit (emulated, both use glibc's sinf/cosf/expf; on a GPU the softmax
// backward stays bit-exact, the others agree within rounding: docs/numerics.md).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "rope/backend.h"
#include "runtime/numerics.h"
#include "softmax/backend.h"

int emu_optin_bytes = 232448;
namespace te {
int cuda_sm_count() { return 3; }
int64_t persistent_blocks(const void*, int, int64_t useful) {
  return useful < 1 ? 1 : (useful < 5 ? useful : 5);
}
}  // namespace te

using namespace te;

namespace {

const te_dtype kTypes[] = {TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT16};

std::vector<uint8_t> values(std::mt19937_64& g, int64_t n, te_dtype t, float spread, bool nan) {
  std::vector<uint8_t> b(n * (t == TE_DTYPE_FLOAT32 ? 4 : 2));
  std::normal_distribution<float> nd(0.0f, spread);
  for (int64_t i = 0; i < n; ++i) {
    float v = nd(g);
    if (nan && g() % 97 == 0) v = NAN;
    if (t == TE_DTYPE_FLOAT32)
      std::memcpy(&b[4 * i], &v, 4);
    else {
      const uint16_t h = t == TE_DTYPE_BFLOAT16 ? float_to_bf16(v) : float_to_fp16(v);
      std::memcpy(&b[2 * i], &h, 2);
    }
  }
  return b;
}

bool softmax_case(std::mt19937_64& g, int cs) {
  auto pick = [&](int n) { return static_cast<int>(g() % n); };
  softmax::Args a{};
  a.kind = static_cast<softmax::Kind>(pick(4));
  a.dtype = kTypes[pick(3)];
  a.backward = pick(2);
  const int64_t b = 1 + pick(2), h = 1 + pick(3), sq = 1 + pick(20);
  a.sk = a.kind == softmax::kCausal ? sq : 1 + pick(300);
  a.sq = sq;
  a.rows = b * h * sq;
  a.rows_per_mask = h * sq;
  a.mask_batches = pick(2) ? 1 : b;
  std::vector<uint8_t> mask(a.mask_batches * sq * a.sk);
  for (auto& m : mask) m = pick(3) == 0;
  a.mask = mask.data();
  a.scale = 0.7f;
  const int64_t n = a.rows * a.sk;
  std::vector<uint8_t> x = values(g, n, a.dtype, 3.0f, true),
                       y = values(g, n, a.dtype, 0.1f, false);
  std::vector<uint8_t> cpu(x.size(), 0xA5), emu(x.size(), 0x5A);
  a.in = x.data();
  a.y = y.data();
  a.out = cpu.data();
  softmax::cpu::run(a);
  a.out = emu.data();
  softmax::cuda::run(a, nullptr);
  const bool same = cpu == emu;
  if (!same)
    std::printf("softmax case %d (kind %d, backward %d) differs\n", cs, a.kind, a.backward);
  return same;
}

bool rope_case(std::mt19937_64& g, int cs) {
  auto pick = [&](int n) { return static_cast<int>(g() % n); };
  rope::Args r{};
  r.backward = pick(2);
  r.dtype = kTypes[pick(3)];
  r.format = pick(3);
  r.cp_size = 1 + pick(2);
  r.cp_rank = pick(r.cp_size);
  r.b = 1 + pick(3);
  r.s = 2 + 2 * pick(5);
  std::vector<int32_t> cu(r.b + 1, 0);
  if (r.format == rope::kThd) {
    for (int64_t k = 0; k < r.b; ++k) cu[k + 1] = cu[k] + 2 * r.cp_size * pick(4);
    r.cu_seqlens = cu.data();
    r.tokens = cu[r.b] / r.cp_size + pick(3);  // trailing tokens of no sequence
  } else {
    r.tokens = r.b * r.s;
  }
  r.h = 1 + pick(3);
  r.d = 2 * (1 + pick(8));
  r.d2 = 2 * (1 + pick(static_cast<int>(r.d / 2)));
  r.interleaved = pick(2);
  r.freq_rows = 12 * r.cp_size;
  std::vector<float> f(r.freq_rows * r.d2);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (auto& v : f) v = nd(g);
  r.freqs = f.data();
  std::vector<uint8_t> t = values(g, r.tokens * r.h * r.d, r.dtype, 2.0f, true);
  std::vector<uint8_t> cpu(t.size(), 0xA5), emu(t.size(), 0x5A);
  r.in = t.data();
  r.out = cpu.data();
  rope::cpu::run(r);
  r.out = emu.data();
  rope::cuda::run(r, nullptr);
  const bool same = cpu == emu;
  if (!same) std::printf("rope case %d (format %d, cp %d) differs\n", cs, r.format, r.cp_size);
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 40;
  std::mt19937_64 g(argc > 2 ? std::atoi(argv[2]) : 1);
  int failures = 0;
  for (int cs = 0; cs < cases; ++cs) failures += !softmax_case(g, cs) + !rope_case(g, cs);
  std::printf("rope/softmax: %d of %d cases differ\n", failures, 2 * cases);
  return failures != 0;
}
