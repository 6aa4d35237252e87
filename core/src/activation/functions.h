// The scalar formulas of the activation family (te/activation.h states them),
// compiled into both backends so that the CPU and CUDA evaluate the same FP32
// operations in the same order and produce identical bits:
//   - every +, -, *, / is rounded once: on the device through the _rn
//     intrinsics (never contracted into an FMA, immune to fast-math flags), on
//     the host through the plain operators (the core builds with
//     -ffp-contract=off); a * b + c is fused only where written as fmadd
//     (std::fma / __fmaf_rn: one rounding on both sides);
//   - exp is the core's own routine below, not libm's or CUDA's expf, whose
//     last bits differ between the two;
//   - every NaN result is replaced by one canonical NaN, because x86 and the
//     GPU produce different NaN bit patterns from the same operation.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "activation/kinds.h"
#include "runtime/numerics.h"
#include "te/activation.h"

namespace te::activation {

using Params = te_activation_params;
constexpr Params kDefaultParams{static_cast<float>(TE_ACTIVATION_DEFAULT_LIMIT),
                                static_cast<float>(TE_ACTIVATION_DEFAULT_ALPHA),
                                static_cast<float>(TE_ACTIVATION_DEFAULT_GLU_LINEAR_OFFSET)};

// ---- FP32 operations with one rounding each -------------------------------

TE_HD float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TE_HD float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// a * b + c with one rounding (fused), the same on both sides: std::fma is
// exact by the C standard (glibc uses the FMA instruction where the CPU has it).
TE_HD float fmadd(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// 1 / a for a in [1, 2] (or NaN), correctly rounded on both sides. The
// device code is __frcp_rn's own fast path, the hardware estimate refined by
// one fused Newton step (correctly rounded for every normal a, which is why
// __frcp_rn may use it), without __frcp_rn's range check and slow-path
// branch: the callers' argument 1 + e never leaves [1, 2].
TE_HD float recip_1_to_2(float a) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return __fmaf_rn(r, __fmaf_rn(-a, r, 1.0f), r);
#else
  return 1.0f / a;
#endif
}

constexpr uint32_t kCanonicalNaNBits = 0x7FC00000u;

TE_HD float canonical(float v) {
  const uint32_t nan_bits = kCanonicalNaNBits;  // a local copy: no reference to a host constant
  return v != v ? bit_cast_value<float>(nan_bits) : v;
}

// ---- exp -------------------------------------------------------------------

// e^t for t <= 0 (NaN passes through). t = n ln2 + r with n = rint(t log2 e)
// and |r| <= ~0.35 (Cody-Waite: ln2 = kLn2Hi + kLn2Lo, n * kLn2Hi is exact);
// e^r is the degree-7 Taylor polynomial in Horner form with fused
// multiply-adds (truncation < 2^-27); e^t = (p * 2^(n+64)) * 2^-64, two exact
// steps, so that a subnormal result is rounded once. Error: below 1 ulp.
// n comes from adding 1.5 * 2^23 (the sum's last bit is then the units bit,
// so the addition rounds t log2 e to an integer, ties to even, and the sum's
// bits hold n), which avoids the slow float <-> int conversions on the GPU.
// Branch-free: the out-of-range cases are selected at the end.
TE_HD float exp_nonpositive(float t) {
  constexpr float kLog2e = 1.44269504f;
  constexpr float kLn2Hi = 0.693145751953125f;        // 0x3F317200: 15 significant bits
  constexpr float kLn2Lo = 1.42860677e-06f;           // ln 2 - kLn2Hi
  constexpr float kShifter = 12582912.0f;             // 1.5 * 2^23
  constexpr uint32_t kShifterBits = 0x4B400000u;      // its bits
  constexpr float kTwoToMinus64 = 5.42101086e-20f;    // 2^-64
  constexpr float kLowest = -104.0f;                  // e^-104 < 2^-150: rounds to +0
  const float tc = t >= kLowest ? t : kLowest;        // NaN -> kLowest (selected away below)
  const float shifted = fmadd(tc, kLog2e, kShifter);  // 1.5 * 2^23 + n, n in [-150, 0]
  const float n = add(shifted, -kShifter);
  const float r = fmadd(-n, kLn2Lo, fmadd(-n, kLn2Hi, tc));
  float p = 1.98412701e-4f;         // 1/7!
  p = fmadd(p, r, 1.38888892e-3f);  // 1/6!
  p = fmadd(p, r, 8.33333377e-3f);  // 1/5!
  p = fmadd(p, r, 4.16666679e-2f);  // 1/4!
  p = fmadd(p, r, 1.66666672e-1f);  // 1/3!
  p = fmadd(p, r, 0.5f);
  p = fmadd(p, r, 1.0f);
  p = fmadd(p, r, 1.0f);
  // 2^(n + 64): n + 64 + 127 in the exponent field (n + 64 is in [-86, 64]).
  const uint32_t n_bits = bit_cast_value<uint32_t>(shifted) - kShifterBits;  // n mod 2^32
  const float scale = bit_cast_value<float>((n_bits + 64u + 127u) << 23);
  const float e = mul(mul(p, scale), kTwoToMinus64);
  return t >= kLowest ? e : (t != t ? t : 0.0f);
}

// ---- sigmoid and the functions built on it ----------------------------------

// sigmoid(z) and sigmoid(-z) = 1 - sigmoid(z), both without cancellation:
// with e = exp(-|z|) in [0, 1], they are 1/(1+e) and e/(1+e).
struct SigmoidPair {
  float s;     // sigmoid(z)
  float sbar;  // 1 - sigmoid(z)
};

TE_HD SigmoidPair sigmoid_pair(float z) {
  const float e = exp_nonpositive(-std::fabs(z));
  const float big = recip_1_to_2(add(1.0f, e));
  const float small = mul(e, big);
  return z >= 0.0f ? SigmoidPair{big, small} : SigmoidPair{small, big};
}

// x * sigmoid(z) with z = alpha x: silu (z = x), qgelu (alpha 1.702) and the
// clamped kind. Where the sigmoid underflows to 0 the result is a signed zero,
// also for x = -inf.
TE_HD float swish(float x, float z) {
  const SigmoidPair sg = sigmoid_pair(z);
  return sg.s == 0.0f ? std::copysign(0.0f, x) : mul(x, sg.s);
}

// d/dx [x sigmoid(alpha x)] = s + z s (1 - s), z = alpha x; where s or 1 - s
// is 0 the second term is 0 (evaluating it could give inf * 0).
TE_HD float dswish(float z) {
  const SigmoidPair sg = sigmoid_pair(z);
  if (sg.s == 0.0f || sg.sbar == 0.0f) return sg.s;
  return fmadd(mul(z, sg.s), sg.sbar, sg.s);
}

// gelu, tanh approximation: 0.5 x (1 + tanh(u)) = x sigmoid(2u) with
// 2u = kGeluScale (x + kGeluCubic x^3), kGeluScale = 2 sqrt(2/pi).
constexpr float kGeluScale = 1.59576912f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kGeluCubic3 = 0.134145f;  // 3 * 0.044715

TE_HD float gelu_argument(float x) {
  const float x3 = mul(mul(x, x), x);
  return mul(kGeluScale, fmadd(kGeluCubic, x3, x));
}

TE_HD float gelu(float x) {
  const SigmoidPair sg = sigmoid_pair(gelu_argument(x));
  return sg.s == 0.0f ? std::copysign(0.0f, x) : mul(x, sg.s);
}

// d/dx = s + x s (1 - s) dz, dz = kGeluScale (1 + 3 * 0.044715 x^2).
TE_HD float dgelu(float x) {
  const SigmoidPair sg = sigmoid_pair(gelu_argument(x));
  if (sg.s == 0.0f || sg.sbar == 0.0f) return sg.s;
  const float dz = mul(kGeluScale, fmadd(kGeluCubic3, mul(x, x), 1.0f));
  return fmadd(mul(mul(x, sg.s), sg.sbar), dz, sg.s);
}

// ---- the activated functions f and f' ---------------------------------------
// NaN passes through f and f' (relu and srelu included: max(NaN, 0) is NaN).
// Each functor also says what a gated kind does with the linear half b:
// lin(b) and whether the gradient flows into b (IdentityLinear: b itself).

struct IdentityLinear {
  TE_HD static float lin(float b, const Params&) { return b; }
  TE_HD static bool lin_passes_grad(float, const Params&) { return true; }
};

// df_sign(x): the sign (-1, 0 or 1) of the exact f'(x) where the FP32 f'(x) is
// 0, used only by the backward rule for an infinite linear half (below): 0
// where the slope is exactly zero (relu and srelu for x <= 0, above the clamp,
// at +-inf), else the sign of the value that underflowed: the tails of the
// sigmoid-based kinds (sigmoid' > 0; swish' and gelu' < 0 for x -> -inf).
// f_sign(x) is the same for f itself, used by the forward: the sign of the
// exact f(x) where the FP32 f(x) is 0 (x sigmoid(x) and gelu: sign(x); the
// sigmoid: 1; relu: 0), with 0 at x = +-inf (f(-inf) = -0 is a limit, not an
// underflow).
TE_HD float negative_tail_sign(float x) { return std::isinf(x) ? 0.0f : -1.0f; }
TE_HD float sign_of(float x) {
  return std::isinf(x) || x == 0.0f ? 0.0f : (x > 0.0f ? 1.0f : -1.0f);
}

struct Gelu : IdentityLinear {
  TE_HD static float f(float x, const Params&) { return gelu(x); }
  TE_HD static float df(float x, const Params&) { return dgelu(x); }
  TE_HD static float f_sign(float x, const Params&) { return sign_of(x); }
  TE_HD static float df_sign(float x, const Params&) { return negative_tail_sign(x); }
};
struct Relu : IdentityLinear {
  TE_HD static float f(float x, const Params&) { return (x > 0.0f || x != x) ? x : 0.0f; }
  TE_HD static float df(float x, const Params&) { return x != x ? x : (x > 0.0f ? 1.0f : 0.0f); }
  TE_HD static float f_sign(float, const Params&) { return 0.0f; }
  TE_HD static float df_sign(float, const Params&) { return 0.0f; }
};
struct Silu : IdentityLinear {
  TE_HD static float f(float x, const Params&) { return swish(x, x); }
  TE_HD static float df(float x, const Params&) { return dswish(x); }
  TE_HD static float f_sign(float x, const Params&) { return sign_of(x); }
  TE_HD static float df_sign(float x, const Params&) { return negative_tail_sign(x); }
};
struct QGelu : IdentityLinear {
  static constexpr float kAlpha = 1.702f;  // part of qgelu's definition, not a parameter
  TE_HD static float f(float x, const Params&) { return swish(x, mul(kAlpha, x)); }
  TE_HD static float df(float x, const Params&) { return dswish(mul(kAlpha, x)); }
  TE_HD static float f_sign(float x, const Params&) { return sign_of(x); }
  TE_HD static float df_sign(float x, const Params&) { return negative_tail_sign(x); }
};
struct SRelu : IdentityLinear {
  TE_HD static float f(float x, const Params&) {
    return x > 0.0f ? mul(x, x) : (x != x ? x : 0.0f);
  }
  TE_HD static float df(float x, const Params&) {
    return x > 0.0f ? add(x, x) : (x != x ? x : 0.0f);
  }
  TE_HD static float f_sign(float x, const Params&) { return x > 0.0f ? 1.0f : 0.0f; }
  TE_HD static float df_sign(float, const Params&) { return 0.0f; }
};
struct Sigmoid : IdentityLinear {
  TE_HD static float f(float x, const Params&) { return sigmoid_pair(x).s; }
  TE_HD static float df(float x, const Params&) {
    const SigmoidPair sg = sigmoid_pair(x);
    return mul(sg.s, sg.sbar);
  }
  TE_HD static float f_sign(float x, const Params&) { return std::isinf(x) ? 0.0f : 1.0f; }
  TE_HD static float df_sign(float x, const Params&) { return std::isinf(x) ? 0.0f : 1.0f; }
};
// c sigmoid(alpha c), c = min(x, limit); zero slope above the limit. The
// linear half is clamp(b, -limit, limit) + offset, with zero slope outside
// +-limit. The comparisons are written so that NaN is never replaced by the limit.
struct ClampedSwish {
  TE_HD static float f(float x, const Params& p) {
    const float c = x > p.limit ? p.limit : x;
    return swish(c, mul(p.alpha, c));
  }
  TE_HD static float df(float x, const Params& p) {
    return x > p.limit ? 0.0f : dswish(mul(p.alpha, x));
  }
  TE_HD static float f_sign(float x, const Params& p) { return sign_of(x > p.limit ? p.limit : x); }
  TE_HD static float df_sign(float x, const Params& p) {
    return x > p.limit ? 0.0f : negative_tail_sign(x);
  }
  TE_HD static float lin(float b, const Params& p) {
    const float c = b > p.limit ? p.limit : (b < -p.limit ? -p.limit : b);
    return add(c, p.glu_linear_offset);
  }
  TE_HD static bool lin_passes_grad(float b, const Params& p) {
    return !(b > p.limit || b < -p.limit);
  }
};

// ---- kinds: generated from TE_ACTIVATION_KINDS (te/activation.h) -------------

template <te_activation K>
struct Kind;  // a kind missing from the table has no traits: a compile error

#define TE_ACTIVATION_KIND_TRAITS_(ID, name_, code_, gated_, functor_, params_) \
  template <>                                                                   \
  struct Kind<TE_ACTIVATION_##ID> {                                             \
    static constexpr bool gated = (gated_) != 0;                                \
    using F = functor_;                                                         \
  };
TE_ACTIVATION_KINDS(TE_ACTIVATION_KIND_TRAITS_)
#undef TE_ACTIVATION_KIND_TRAITS_

// grad * f'(a) * lin(b) when lin(b) is +-inf (an overflowed linear half, e.g.
// an FP16 input above 65504): the limit, not the NaN of 0 * inf; the forward's
// f(a) * lin(b) is the same with grad = 1 and f, f_sign for f', df_sign. An exactly
// zero factor (grad == 0, or a slope that is exactly zero: df_sign 0) gives 0;
// otherwise the result is +-inf with the signs of grad, of the exact f'(a)
// (df_sign where the FP32 f'(a) underflowed to 0) and of lin(b). NaN stays NaN.
TE_HD float times_infinite_linear(float grad, float d, float d_sign, float lin) {
  if (grad != grad || d != d) return add(grad, d);
  const float slope = d != 0.0f ? d : d_sign;
  if (grad == 0.0f || slope == 0.0f) return 0.0f;
  return mul(mul(std::copysign(1.0f, grad), std::copysign(1.0f, slope)), lin);
}

// Forward value from the activated input a and the linear input b (b unused
// by plain kinds).
template <te_activation K>
TE_HD float forward_value(float a, float b, const Params& p) {
  using F = typename Kind<K>::F;
  if constexpr (Kind<K>::gated) {
    const float l = F::lin(b, p);
    if (std::isinf(l))
      return canonical(times_infinite_linear(1.0f, F::f(a, p), F::f_sign(a, p), l));
    return canonical(mul(F::f(a, p), l));
  } else {
    return canonical(F::f(a, p));
  }
}

// Gradients with respect to a and b (db is 0 for plain kinds).
struct GradPair {
  float da;
  float db;
};

template <te_activation K>
TE_HD GradPair backward_value(float grad, float a, float b, const Params& p) {
  using F = typename Kind<K>::F;
  if constexpr (Kind<K>::gated) {
    const float l = F::lin(b, p);
    const float d = F::df(a, p);
    const float da =
        std::isinf(l) ? times_infinite_linear(grad, d, F::df_sign(a, p), l) : mul(mul(grad, d), l);
    const float db = F::lin_passes_grad(b, p) ? mul(grad, F::f(a, p)) : 0.0f;
    return {canonical(da), canonical(db)};
  } else {
    return {canonical(mul(grad, F::df(a, p))), 0.0f};
  }
}

// Calls f(std::integral_constant<te_activation, K>{}) for a valid kind.
template <class Fn>
void with_kind(te_activation kind, Fn&& f) {
  switch (kind) {
#define TE_ACTIVATION_CASE_(ID, name_, code_, gated_, functor_, params_) \
  case TE_ACTIVATION_##ID: f(std::integral_constant<te_activation, TE_ACTIVATION_##ID>{}); return;
    TE_ACTIVATION_KINDS(TE_ACTIVATION_CASE_)
#undef TE_ACTIVATION_CASE_
  }
}

}  // namespace te::activation
