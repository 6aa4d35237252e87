// The scalar formulas of the activation family (te/activation.h states them),
// compiled into both backends so that the CPU and CUDA evaluate the same FP32
// operations in the same order and produce identical bits:
//   - every +, -, *, / is rounded once: on the device through the _rn
//     intrinsics (never contracted into an FMA, immune to fast-math flags), on
//     the host through the plain operators (the core builds with
//     -ffp-contract=off);
//   - exp is the core's own routine below, not libm's or CUDA's expf, whose
//     last bits differ between the two;
//   - every NaN result is replaced by one canonical NaN, because x86 and the
//     GPU produce different NaN bit patterns from the same operation.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "runtime/numerics.h"
#include "te/activation.h"

namespace te::activation {

using Params = te_activation_params;
constexpr Params kDefaultParams{7.0f, 1.702f, 1.0f};

// ---- FP32 operations with one rounding each -------------------------------

TE_HD float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TE_HD float sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

TE_HD float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// 1 / a, correctly rounded on both sides.
TE_HD float recip(float a) {
#ifdef __CUDA_ARCH__
  return __frcp_rn(a);
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

// 2^k for k in [-126, 127], exact.
TE_HD float pow2(int k) { return bit_cast_value<float>(static_cast<uint32_t>(k + 127) << 23); }

// e^t for t <= 0 (NaN passes through). t = n ln2 + r with n = rint(t log2 e)
// and |r| <= ~0.35 (Cody-Waite: ln2 = kLn2Hi + kLn2Lo, n * kLn2Hi is exact);
// e^r is the degree-7 Taylor polynomial in Horner form (truncation < 2^-27);
// the scaling by 2^n is done in two exact steps so that a subnormal result is
// rounded once. Error: about 1 ulp against the exact value.
TE_HD float exp_nonpositive(float t) {
  constexpr float kLog2e = 1.44269504f;
  constexpr float kLn2Hi = 0.693145751953125f;     // 0x3F317200: 15 significant bits
  constexpr float kLn2Lo = 1.42860677e-06f;        // ln 2 - kLn2Hi
  if (t != t) return t;
  if (t < -104.0f) return 0.0f;  // e^-104 < 2^-150: rounds to +0
#ifdef __CUDA_ARCH__
  const float n = rintf(mul(t, kLog2e));
#else
  const float n = std::rint(mul(t, kLog2e));
#endif
  const float r = sub(sub(t, mul(n, kLn2Hi)), mul(n, kLn2Lo));
  float p = 1.98412701e-4f;              // 1/7!
  p = add(mul(p, r), 1.38888892e-3f);    // 1/6!
  p = add(mul(p, r), 8.33333377e-3f);    // 1/5!
  p = add(mul(p, r), 4.16666679e-2f);    // 1/4!
  p = add(mul(p, r), 1.66666672e-1f);    // 1/3!
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  const int exponent = static_cast<int>(n);  // in [-150, 0]
  const int half = exponent / 2;
  return mul(mul(p, pow2(exponent - half)), pow2(half));
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
  const float big = recip(add(1.0f, e));
  const float small = mul(e, big);
  return z >= 0.0f ? SigmoidPair{big, small} : SigmoidPair{small, big};
}

// x * sigmoid(alpha x): silu (alpha 1) and qgelu (alpha 1.702). Where the
// sigmoid underflows to 0 the result is a signed zero, also for x = -inf.
TE_HD float swish(float x, float alpha) {
  const SigmoidPair sg = sigmoid_pair(mul(alpha, x));
  return sg.s == 0.0f ? std::copysign(0.0f, x) : mul(x, sg.s);
}

// d/dx = s + (alpha x) s (1 - s); where s or 1 - s is 0 the second term is 0
// (evaluating it could give inf * 0).
TE_HD float dswish(float x, float alpha) {
  const float z = mul(alpha, x);
  const SigmoidPair sg = sigmoid_pair(z);
  if (sg.s == 0.0f || sg.sbar == 0.0f) return sg.s;
  return add(sg.s, mul(mul(z, sg.s), sg.sbar));
}

// gelu, tanh approximation: 0.5 x (1 + tanh(u)) = x sigmoid(2u) with
// 2u = kGeluScale (x + kGeluCubic x^3), kGeluScale = 2 sqrt(2/pi).
constexpr float kGeluScale = 1.59576912f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kGeluCubic3 = 0.134145f;  // 3 * 0.044715

TE_HD float gelu_argument(float x) {
  const float x3 = mul(mul(x, x), x);
  return mul(kGeluScale, add(x, mul(kGeluCubic, x3)));
}

TE_HD float gelu(float x) {
  const SigmoidPair sg = sigmoid_pair(gelu_argument(x));
  return sg.s == 0.0f ? std::copysign(0.0f, x) : mul(x, sg.s);
}

// d/dx = s + x s (1 - s) dz, dz = kGeluScale (1 + 3 * 0.044715 x^2).
TE_HD float dgelu(float x) {
  const SigmoidPair sg = sigmoid_pair(gelu_argument(x));
  if (sg.s == 0.0f || sg.sbar == 0.0f) return sg.s;
  const float dz = mul(kGeluScale, add(1.0f, mul(kGeluCubic3, mul(x, x))));
  return add(sg.s, mul(mul(mul(x, sg.s), sg.sbar), dz));
}

// ---- the activated functions f and f' ---------------------------------------
// NaN passes through f and f' (relu and srelu included: max(NaN, 0) is NaN).

struct Gelu {
  TE_HD static float f(float x, const Params&) { return gelu(x); }
  TE_HD static float df(float x, const Params&) { return dgelu(x); }
};
struct Relu {
  TE_HD static float f(float x, const Params&) { return (x > 0.0f || x != x) ? x : 0.0f; }
  TE_HD static float df(float x, const Params&) { return x != x ? x : (x > 0.0f ? 1.0f : 0.0f); }
};
struct Silu {
  TE_HD static float f(float x, const Params&) { return swish(x, 1.0f); }
  TE_HD static float df(float x, const Params&) { return dswish(x, 1.0f); }
};
struct QGelu {
  static constexpr float kAlpha = 1.702f;
  TE_HD static float f(float x, const Params&) { return swish(x, kAlpha); }
  TE_HD static float df(float x, const Params&) { return dswish(x, kAlpha); }
};
struct SRelu {
  TE_HD static float f(float x, const Params&) { return x > 0.0f ? mul(x, x) : (x != x ? x : 0.0f); }
  TE_HD static float df(float x, const Params&) { return x > 0.0f ? add(x, x) : (x != x ? x : 0.0f); }
};
struct Sigmoid {
  TE_HD static float f(float x, const Params&) { return sigmoid_pair(x).s; }
  TE_HD static float df(float x, const Params&) {
    const SigmoidPair sg = sigmoid_pair(x);
    return mul(sg.s, sg.sbar);
  }
};
// c sigmoid(alpha c), c = min(x, limit); zero slope above the limit. The
// comparisons are written so that NaN is never replaced by the limit.
struct ClampedSwish {
  TE_HD static float f(float x, const Params& p) { return swish(x > p.limit ? p.limit : x, p.alpha); }
  TE_HD static float df(float x, const Params& p) { return x > p.limit ? 0.0f : dswish(x, p.alpha); }
};

// ---- kinds -----------------------------------------------------------------

template <te_activation K>
struct Kind {
  static constexpr bool gated = K >= TE_ACTIVATION_GEGLU;
  static constexpr bool clamped = K == TE_ACTIVATION_CLAMPED_SWIGLU;
  using F = std::conditional_t<
      K == TE_ACTIVATION_GELU || K == TE_ACTIVATION_GEGLU, Gelu,
      std::conditional_t<
          K == TE_ACTIVATION_RELU || K == TE_ACTIVATION_REGLU, Relu,
          std::conditional_t<
              K == TE_ACTIVATION_SILU || K == TE_ACTIVATION_SWIGLU, Silu,
              std::conditional_t<
                  K == TE_ACTIVATION_QGELU || K == TE_ACTIVATION_QGEGLU, QGelu,
                  std::conditional_t<K == TE_ACTIVATION_SRELU || K == TE_ACTIVATION_SREGLU, SRelu,
                                     std::conditional_t<K == TE_ACTIVATION_GLU, Sigmoid,
                                                        ClampedSwish>>>>>>;
};

constexpr bool is_gated(te_activation kind) { return kind >= TE_ACTIVATION_GEGLU; }

// The linear half: b, or clamp(b, -limit, limit) + offset for clamped_swiglu.
template <te_activation K>
TE_HD float linear(float b, const Params& p) {
  if constexpr (Kind<K>::clamped) {
    const float c = b > p.limit ? p.limit : (b < -p.limit ? -p.limit : b);
    return add(c, p.glu_linear_offset);
  } else {
    return b;
  }
}

// Whether the gradient flows into b (the clamp's slope is 0 outside +-limit).
template <te_activation K>
TE_HD bool linear_passes_grad(float b, const Params& p) {
  if constexpr (Kind<K>::clamped) return !(b > p.limit || b < -p.limit);
  return true;
}

// Forward value from the activated input a and the linear input b (b unused
// by plain kinds).
template <te_activation K>
TE_HD float forward_value(float a, float b, const Params& p) {
  using F = typename Kind<K>::F;
  if constexpr (Kind<K>::gated) {
    return canonical(mul(F::f(a, p), linear<K>(b, p)));
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
    const float da = mul(mul(grad, F::df(a, p)), linear<K>(b, p));
    const float db = linear_passes_grad<K>(b, p) ? mul(grad, F::f(a, p)) : 0.0f;
    return {canonical(da), canonical(db)};
  } else {
    return {canonical(mul(grad, F::df(a, p))), 0.0f};
  }
}

// Calls f(std::integral_constant<te_activation, K>{}) for a valid kind.
template <class Fn>
void with_kind(te_activation kind, Fn&& f) {
  switch (kind) {
#define TE_ACTIVATION_CASE(K) \
  case K: f(std::integral_constant<te_activation, K>{}); return;
    TE_ACTIVATION_CASE(TE_ACTIVATION_GELU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_RELU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_SILU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_QGELU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_SRELU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_GEGLU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_REGLU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_SWIGLU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_QGEGLU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_SREGLU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_GLU)
    TE_ACTIVATION_CASE(TE_ACTIVATION_CLAMPED_SWIGLU)
#undef TE_ACTIVATION_CASE
  }
}

}  // namespace te::activation
