"""Float64 reference of te_gemm and its per-format error bounds (shared by the
CPU tests and the GPU tests).

The reference works on the dequantized operands exactly as the contract
defines them: Â = float32(A) (BF16/FP16 widen exactly), FP8 Â = float32(q) *
scale_inv rounded to FP32; everything after that is float64.

Bounds, per element. u_t is the unit roundoff of type t (round to nearest
even: |fl(x) - x| <= u_t |x|): FP32 2^-24, BF16 2^-8, FP16 2^-11.
  S = |alpha| (|Â| |B̂|) + |beta| |C| + |bias|      (the magnitudes summed)
  FP32 computation of v (K products summed in any order, then alpha, beta*C
  and bias): |v_computed - v| <= (K + 4) u_32 S       (Higham's gamma_K bound
  plus one rounding per extra term; FMA only removes roundings)
  D of type t:       |D - v| <= u_t |v| + (1 + u_t) (K + 4) u_32 S + a_t
  where a_t is half the smallest subnormal spacing of t (FP16: 2^-25, else 0).
  With GELU: gelu' is bounded by 1.13 and evaluating the tanh formula in FP32
  costs at most 16 u_32 |v| (tanhf <= 2 ulp, ~6 roundings), so
             |D - gelu(v)| <= u_t |gelu(v)| + (1 + u_t) (1.13 (K + 4) u_32 S + 16 u_32 |v|) + a_t
  bias_grad: |g - sum| <= u_t |sum| + (1 + u_t) K u_32 sum|Â| + a_t.
  FP8 D: the reference rounds v * d_scale to FP8 itself; the FP32 error above
  (~1e-5 relative) is far below an FP8 step (2^-3 / 2^-2 relative), so the
  codes differ by at most one step, and only for values within that error of
  a rounding boundary: we assert <= 1 step everywhere and >= 99% identical.
  amax: |amax - max|v|| <= max of the FP32 bound above.
The GPU sums in its own order (covered: the bound holds for any order) and
cuBLASLt applies FP8 scale_invs to the FP32 sum rather than to each element:
exact for power-of-two scales, otherwise a few extra FP32 roundings of each
term, which `extra_roundings` adds to the K + 4 (GPU tests pass 4).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

U32 = 2.0**-24
UNIT_ROUNDOFF = {
    np.dtype(np.float32): 2.0**-24,
    np.dtype(ml_dtypes.bfloat16): 2.0**-8,
    np.dtype(np.float16): 2.0**-11,
}
ABS_FLOOR = {  # half the smallest subnormal spacing of the output type
    np.dtype(np.float32): 0.0,
    np.dtype(ml_dtypes.bfloat16): 0.0,
    np.dtype(np.float16): 2.0**-25,
}
GELU_LIPSCHITZ = 1.13
FP8_TYPES = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))
FP8_MAX = {np.dtype(ml_dtypes.float8_e4m3fn): 448.0, np.dtype(ml_dtypes.float8_e5m2): 57344.0}


def is_fp8(dtype) -> bool:
    return np.dtype(dtype) in FP8_TYPES


def dequantize(x: np.ndarray, scale_inv=None) -> np.ndarray:
    """The FP32 operand values of the contract, as float64, folded to a matrix."""
    x32 = np.asarray(x).astype(np.float32)
    if is_fp8(np.asarray(x).dtype):
        x32 = (x32 * np.float32(scale_inv)).astype(np.float32)
    return x32.reshape(-1, x32.shape[-1]).astype(np.float64)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


class Reference(NamedTuple):
    v: np.ndarray  # pre-activation, float64 [M, N]
    out: np.ndarray  # gelu(v) or v
    err32: np.ndarray  # bound of the FP32 computation of `out` (before output rounding)
    k: int


def reference(a, b, *, transa=False, transb=False, a_scale_inv=None, b_scale_inv=None, c=None,
              alpha=1.0, beta=0.0, bias=None, gelu=False, extra_roundings=0) -> Reference:
    a64 = dequantize(a, a_scale_inv)
    b64 = dequantize(b, b_scale_inv)
    op_a = a64.T if transa else a64
    op_b = b64.T if transb else b64
    k = op_a.shape[1]
    alpha = float(np.float32(alpha))
    beta = float(np.float32(beta))
    v = alpha * (op_a @ op_b)
    s = abs(alpha) * (np.abs(op_a) @ np.abs(op_b))
    if c is not None and beta != 0.0:
        c64 = np.asarray(c).astype(np.float64).reshape(v.shape)
        v = v + beta * c64
        s = s + abs(beta) * np.abs(c64)
    if bias is not None:
        bias64 = np.asarray(bias).astype(np.float64)
        v = v + bias64
        s = s + np.abs(bias64)
    err_v = (k + 4 + extra_roundings) * U32 * s
    if gelu:
        return Reference(v, gelu_tanh(v), GELU_LIPSCHITZ * err_v + 16 * U32 * np.abs(v), k)
    return Reference(v, v, err_v, k)


def assert_close(actual: np.ndarray, expected: np.ndarray, err32: np.ndarray, what: str) -> None:
    """|actual - expected| <= u_t |expected| + (1 + u_t) err32 + a_t, elementwise."""
    dtype = np.asarray(actual).dtype
    u = UNIT_ROUNDOFF[dtype]
    got = np.asarray(actual).astype(np.float64).reshape(expected.shape)
    bound = u * np.abs(expected) + (1 + u) * err32 + ABS_FLOOR[dtype]
    excess = np.abs(got - expected) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape) if excess.size else None
    assert excess.size == 0 or excess.max() <= 0, (
        f"{what} ({dtype}): |error| exceeds the bound at {worst}: got {got[worst]!r}, "
        f"expected {expected[worst]!r}, bound {bound[worst]:.3e}"
    )


def fp8_reference(values: np.ndarray, d_scale: float, dtype) -> np.ndarray:
    """saturate(RNE(values * d_scale)) in the FP8 type."""
    dtype = np.dtype(dtype)
    scaled = np.clip(values * float(np.float32(d_scale)), -FP8_MAX[dtype], FP8_MAX[dtype])
    return scaled.astype(dtype)


def fp8_steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in FP8 codes (sign-magnitude ordinals; +0 and -0 are equal)."""

    def ordinal(x):
        codes = np.asarray(x).view(np.uint8).astype(np.int64)
        magnitude = codes & 0x7F
        return np.where(codes & 0x80, -magnitude, magnitude)

    return np.abs(ordinal(a) - ordinal(b))


def assert_fp8_close(actual: np.ndarray, ref: Reference, d_scale: float) -> None:
    expected = fp8_reference(ref.out, d_scale, actual.dtype)
    steps = fp8_steps(actual.reshape(expected.shape), expected)
    assert steps.max() <= 1, f"FP8 D differs by {steps.max()} codes from the reference"
    identical = float(np.mean(steps == 0))
    assert identical >= 0.99, f"only {identical:.2%} of FP8 D codes match the reference"


def assert_amax_close(amax, ref: Reference, start: float = 0.0) -> None:
    expected = max(start, float(np.max(np.abs(ref.out))) if ref.out.size else 0.0)
    bound = float(np.max(ref.err32)) if ref.err32.size else 0.0
    assert abs(float(amax) - expected) <= bound + 1e-30, f"amax {float(amax)} vs {expected}"


def bias_grad_reference(a, a_scale_inv=None, transa=False):
    a64 = dequantize(a, a_scale_inv)
    op_a = a64.T if transa else a64
    return op_a.sum(axis=1), op_a.shape[1] * U32 * np.abs(op_a).sum(axis=1)


def random_operand(rng: np.random.Generator, shape, dtype, scale: float = 1.0) -> np.ndarray:
    """Normal values (never all zeros) in dtype; FP8 values stay finite."""
    dtype = np.dtype(dtype)
    x = rng.standard_normal(shape) * scale
    if is_fp8(dtype):
        x = np.clip(x * 8.0, -0.9 * FP8_MAX[dtype], 0.9 * FP8_MAX[dtype])
    return x.astype(np.float32).astype(dtype)


def random_operands(rng: np.random.Generator, m, n, k, transa, transb, a_dtype, b_dtype):
    """A and B in the storage layouts that transa / transb describe."""
    a = random_operand(rng, (k, m) if transa else (m, k), a_dtype)
    b = random_operand(rng, (n, k) if transb else (k, n), b_dtype)
    return a, b


def random_scale_inv(rng: np.random.Generator, power_of_two: bool = True) -> np.float32:
    if power_of_two:
        return np.float32(2.0 ** int(rng.integers(-4, 3)))
    return np.float32(rng.uniform(0.3, 3.0))

