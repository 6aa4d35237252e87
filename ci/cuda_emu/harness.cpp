// Emulated CUDA fallback (ci/cuda_emu/run.sh) vs the CPU backend, bit for bit, on random valid
// configurations that follow api.cpp's normalization (thd: padding masks; causal: window_right 0).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "attention/backend.h"
#include "runtime/numerics.h"

int emu_optin_bytes = 232448;
namespace te {
int cuda_sm_count() { return 3; }
}  // namespace te

using namespace te;
using namespace te::attention;

struct Buf {
  std::vector<uint8_t> bytes;
  void* p() { return bytes.data(); }
};

static size_t esize(te_dtype t) { return t == TE_DTYPE_FLOAT32 ? 4 : 2; }

static Buf rand_tensor(std::mt19937_64& g, int64_t n, te_dtype t, float scale) {
  Buf b;
  b.bytes.resize(n * esize(t));
  std::normal_distribution<float> nd(0.0f, scale);
  for (int64_t i = 0; i < n; ++i) {
    const float v = nd(g);
    if (t == TE_DTYPE_FLOAT32)
      reinterpret_cast<float*>(b.p())[i] = v;
    else if (t == TE_DTYPE_BFLOAT16)
      reinterpret_cast<uint16_t*>(b.p())[i] = float_to_bf16(v);
    else
      reinterpret_cast<uint16_t*>(b.p())[i] = float_to_fp16(v);
  }
  return b;
}

static Buf zeros(int64_t bytes) {
  Buf b;
  b.bytes.assign(bytes, 0xA5);
  return b;
}

static int compare(const char* what, Buf& a, Buf& b) {
  if (a.bytes.size() != b.bytes.size()) {
    std::printf("  %s: size differs\n", what);
    return 1;
  }
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < a.bytes.size(); ++i)
    if (a.bytes[i] != b.bytes[i]) {
      if (!diff) first = i;
      ++diff;
    }
  if (diff) std::printf("  %s: %zu bytes differ (first at byte %zu)\n", what, diff, first);
  return diff ? 1 : 0;
}

int main(int argc, char** argv) {
  const int cases = argc > 1 ? atoi(argv[1]) : 20;
  const int seed0 = argc > 2 ? atoi(argv[2]) : 1;
  int failures = 0;
  for (int cs = 0; cs < cases; ++cs) {
    std::mt19937_64 g(seed0 * 1000 + cs);
    auto pick = [&](int n) { return static_cast<int>(g() % n); };
    Inputs in{};
    in.qkv_format = static_cast<te_qkv_format>(pick(3));
    const bool thd = in.qkv_format == TE_QKV_FORMAT_THD;
    const te_attn_mask_type thd_masks[] = {TE_ATTN_MASK_PADDING, TE_ATTN_MASK_PADDING_CAUSAL,
                                           TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT};
    in.mask_type = thd ? thd_masks[pick(3)] : static_cast<te_attn_mask_type>(pick(7));
    in.bias_type = static_cast<te_attn_bias_type>(pick(4));
    in.softmax_type = static_cast<te_softmax_type>(pick(3));
    const te_dtype types[] = {TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT16};
    in.dtype = types[pick(3)];
    Dims& d = in.dims;
    d.b = 1 + pick(3);
    d.h = (pick(2) + 1) * 2;
    const int64_t hks[] = {1, 2, d.h};
    d.hk = hks[pick(3)];
    const int big = pick(3);
    d.sq = 1 + pick(big ? 150 : 12);
    d.skv = 1 + pick(big ? 150 : 12);
    const int64_t ds[] = {8, 12, 72, 1, 300};
    d.d = ds[pick(5)];
    d.dv = ds[pick(5)];
    in.scale = 0.3f + 0.1f * pick(5);
    const int64_t lefts[] = {-1, 0, 3, 40};
    in.window_left = lefts[pick(4)];
    in.window_right = is_causal_mask(in.mask_type) ? 0 : lefts[pick(4)];
    in.dropout = pick(2) ? 0.0f : 0.3f;
    in.seed = g();
    in.offset = g() % 100;
    emu_optin_bytes = pick(3) == 0 ? 16 * 1024 : 232448;

    std::vector<int32_t> cu_q(d.b + 1, 0), cu_kv(d.b + 1, 0), pad_q(d.b + 1, 0), pad_kv(d.b + 1, 0);
    if (thd || is_padding_mask(in.mask_type)) {
      for (int64_t b = 0; b < d.b; ++b) {
        cu_q[b + 1] = cu_q[b] + pick(d.sq + 1);
        cu_kv[b + 1] = cu_kv[b] + pick(d.skv + 1);
        pad_q[b + 1] = pad_q[b] + (cu_q[b + 1] - cu_q[b]) + (thd ? pick(3) : 0);
        pad_kv[b + 1] = pad_kv[b] + (cu_kv[b + 1] - cu_kv[b]) + (thd ? pick(3) : 0);
      }
      in.cu_q = cu_q.data();
      in.cu_kv = cu_kv.data();
      if (thd) {
        in.cu_q_padded = pad_q.data();
        in.cu_kv_padded = pad_kv.data();
        d.tq = pad_q[d.b] + pick(2);
        d.tkv = pad_kv[d.b] + pick(2);
      }
    }
    const int64_t qt = thd ? d.tq : d.b * d.sq, kt = thd ? d.tkv : d.b * d.skv;
    Buf q = rand_tensor(g, qt * d.h * d.d, in.dtype, 1.0f);
    Buf k = rand_tensor(g, kt * d.hk * d.d, in.dtype, 1.0f);
    Buf v = rand_tensor(g, kt * d.hk * d.dv, in.dtype, 1.0f);
    Buf dout = rand_tensor(g, qt * d.h * d.dv, in.dtype, 1.0f);
    in.q = q.p();
    in.k = k.p();
    in.v = v.p();
    Buf bias;
    if (in.bias_type == TE_ATTN_BIAS_PRE_SCALE_BIAS ||
        in.bias_type == TE_ATTN_BIAS_POST_SCALE_BIAS) {
      in.bias_b = pick(2) ? 1 : d.b;
      in.bias_h = pick(2) ? 1 : d.h;
      bias = rand_tensor(g, in.bias_b * in.bias_h * d.sq * d.skv, in.dtype, 1.0f);
      in.bias = bias.p();
    }
    std::vector<float> slopes(d.b * d.h);
    if (in.bias_type == TE_ATTN_BIAS_ALIBI && pick(2)) {
      for (auto& s : slopes) s = 0.05f * (1 + pick(10));
      in.alibi_slopes = slopes.data();
      in.alibi_per_batch = pick(2);
    }
    std::vector<uint8_t> mask;
    if (in.mask_type == TE_ATTN_MASK_ARBITRARY) {
      in.mask_b = pick(2) ? 1 : d.b;
      in.mask_h = pick(2) ? 1 : d.h;
      mask.resize(in.mask_b * in.mask_h * d.sq * d.skv);
      for (auto& m : mask) m = pick(10) < 3;
      in.mask = mask.data();
    }
    std::vector<float> alpha(d.h);
    for (auto& a : alpha) a = 0.25f * (pick(9) - 4);
    if (in.softmax_type == TE_SOFTMAX_LEARNABLE) in.softmax_offset = alpha.data();

    FwdArgs fc{};
    static_cast<Inputs&>(fc) = in;
    FwdArgs fe = fc;
    Buf oc = zeros(qt * d.h * d.dv * esize(in.dtype)), oe = oc;
    Buf lc = zeros(qt * d.h * 4), le = lc;
    fc.o = oc.p();
    fc.lse = reinterpret_cast<float*>(lc.p());
    fe.o = oe.p();
    fe.lse = reinterpret_cast<float*>(le.p());
    cpu::forward(fc);
    Buf wsf = zeros(cuda_fallback::fwd_workspace(fe) + 16);
    fe.workspace = wsf.p();
    fe.workspace_bytes = wsf.bytes.size();
    cuda_fallback::forward(fe, nullptr);

    BwdArgs bc{};
    static_cast<Inputs&>(bc) = in;
    bc.o = oc.p();
    bc.d_o = dout.p();
    bc.lse = reinterpret_cast<float*>(lc.p());
    BwdArgs be = bc;
    const size_t qbytes = qt * d.h * d.d * esize(in.dtype),
                 kbytes = kt * d.hk * d.d * esize(in.dtype);
    const size_t vbytes = kt * d.hk * d.dv * esize(in.dtype);
    Buf dqc = zeros(qbytes), dqe = dqc, dkc = zeros(kbytes), dke = dkc, dvc = zeros(vbytes),
        dve = dvc;
    Buf dbc, dbe, dac = zeros(d.h * 4), dae = dac;
    bc.dq = dqc.p();
    bc.dk = dkc.p();
    bc.dv = dvc.p();
    be.dq = dqe.p();
    be.dk = dke.p();
    be.dv = dve.p();
    if (in.bias) {
      dbc = zeros(bias.bytes.size());
      dbe = dbc;
      if (pick(4)) {
        bc.dbias = dbc.p();
        be.dbias = dbe.p();
      }
    }
    if (in.softmax_offset) {
      bc.dsoftmax_offset = reinterpret_cast<float*>(dac.p());
      be.dsoftmax_offset = reinterpret_cast<float*>(dae.p());
    }
    cpu::backward(bc);
    BwdArgs be_nodbias = be;
    be_nodbias.dbias = nullptr;
    const size_t need = cuda_fallback::bwd_workspace(be);
    if (need != cuda_fallback::bwd_workspace(be_nodbias)) {
      std::printf("  workspace depends on dbias\n");
      ++failures;
    }
    Buf wsb = zeros(need + 16);
    be.workspace = wsb.p();
    be.workspace_bytes = wsb.bytes.size();
    cuda_fallback::backward(be, nullptr);

    std::printf(
        "case %d: fmt %d mask %d bias %d softmax %d dtype %d b %ld h %ld hk %ld sq %ld skv %ld d "
        "%ld dv %ld win (%ld,%ld) p %.1f smem %d dbias %d\n",
        cs, in.qkv_format, in.mask_type, in.bias_type, in.softmax_type, in.dtype, (long)d.b,
        (long)d.h, (long)d.hk, (long)d.sq, (long)d.skv, (long)d.d, (long)d.dv, (long)in.window_left,
        (long)in.window_right, in.dropout, emu_optin_bytes, be.dbias != nullptr);
    int f = compare("o", oc, oe) + compare("lse", lc, le) + compare("dq", dqc, dqe) +
            compare("dk", dkc, dke) + compare("dv", dvc, dve);
    if (be.dbias) f += compare("dbias", dbc, dbe);
    if (in.softmax_offset) f += compare("dsoftmax_offset", dac, dae);
    failures += f != 0;
  }
  std::printf("%d of %d cases differ\n", failures, cases);
  return failures != 0;
}
