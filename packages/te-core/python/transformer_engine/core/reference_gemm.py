"""Float64 reference of te_gemm and its per-format error bounds (shared by the
CPU tests and the GPU tests).

The reference works on the dequantized operands exactly as the contract
defines them: Â = float32(A) (BF16/FP16 widen exactly), FP8 Â = float32(q) *
scale_inv rounded to FP32; everything after that is float64.

Bounds, per element. u_t is the unit roundoff of type t (round to nearest
even: |fl(x) - x| <= u_t |x|): FP32 2^-24, BF16 2^-8, FP16 2^-11.
  S = |alpha| (|Â| |B̂|) + |beta| |C| + |bias|      (the magnitudes summed)
  FP32 computation of v (K products summed in any order, then alpha, beta*C
  and bias): |v_computed - v| <= (K + 4) u_32 S = err   (Higham's gamma_K
  bound plus one rounding per extra term; FMA only removes roundings)
  D of type t:       |D - v| <= u_t |v| + (1 + u_t) err + a_t
  where a_t is half the smallest subnormal spacing of t (FP16: 2^-25, else 0).
  With GELU: gelu' is bounded by 1.13 and evaluating the tanh formula in FP32
  costs at most 16 u_32 |v| (tanhf <= 2 ulp, ~6 roundings), so
             |D - gelu(v)| <= u_t |gelu(v)| + (1 + u_t) (1.13 err + 16 u_32 |v|) + a_t
  bias_grad: |g - sum| <= u_t |sum| + (1 + u_t) K u_32 sum|Â| + a_t.
  FP8 D: q(v d_scale -+ err d_scale) bracket D, q = saturate(RNE(.)) (see
  assert_fp8_close).
  amax: |amax - max|v|| <= max err (max is 1-Lipschitz in the max norm).
The GPU sums in its own order (covered: the bound holds for any order) and
cuBLASLt applies FP8 scale_invs to the FP32 sum rather than to each element:
exact for power-of-two scales, otherwise a few extra FP32 roundings of each
term, which `extra_roundings` adds to the K + 4 (GPU tests pass 4).

Two properties of the CUDA backend add terms to err (GPU tests only; the
contract, te/gemm.h, and docs/numerics.md state them):

* FP8 tensor cores (`tensor_core_fp8=True`, both operands FP8). Hopper's FP8
  MMA does not accumulate in full FP32. DeepSeek-V3's technical report (§3.5.2,
  measured on H800) says the tensor core aligns the 32 products of one MMA
  k-step to the largest exponent, keeps the highest 14 bits of each, and
  accumulates into registers with 14-bit precision; SageAttention2 measured
  the accumulator of mma.f32.f8.f8.f32 as "FP22" (13 stored mantissa bits,
  truncated). cuBLASLt's split accumulator (FAST_ACCUM off) periodically
  promotes those partial sums to FP32, at an interval it does not document.
  Our model: the products of one k-step of 32 lose less than 2^-13 S_AB in
  all (their bits beyond 14 of the step's largest term, and the 14-bit
  accumulator: truncation, relative error < 2^-13, of partial sums at most
  S_AB = |alpha| (|Â| |B̂|)), and the final conversion once more:
      |v_computed - v| <= err + (ceil(K / 32) + 1) 2^-13 S_AB
  This models the hardware as those measurements describe it; it is not a
  worst case for adversarial data (many products far below the largest of
  their k-step). A NumPy emulation of the described mechanism on test-like
  data (normal values, products truncated toward -inf at 14 bits below the
  largest term including the accumulator, promotion every 4 k-steps) stayed
  within it: at most 2.7 units of 2^-13 S_AB at K = 80 over 40 draws (model:
  4). The first H200 run (torch 2.11, CUDA 13.0, cuBLASLt 13.1;
  tests/gpu/test_gemm_gpu.py, now the CUDA cases of tests/test_gemm.py) saw
  less: at most 1.2 units at K = 48 (model:
  3), 1.57 at K = 80 (model: 4) and 1.35 at K = 272 (model: 10); its d_amax
  values with power-of-two scales all lay on a 14-bit grid, the accumulator's
  width. The model stays far below FP8 quantization error (2^-4 relative per
  E4M3 element): at K = 272 it is 1.2e-3 S_AB. Fast accumulation (no
  promotion) has its own, looser test.
* A fused cuBLASLt BIAS epilogue with a 16-bit output (`rounded_before_bias`
  = that type t): the product may be rounded to t before the bias is added
  (what a half-precision epilogue does; the first H200 run saw 0.86 ulp on a
  BF16 D). The rounded value p is alpha Â B̂ or alpha Â B̂ + beta C, so
  |p| <= P = |alpha Â B̂| + |beta C|; p̃ = fl_t(p_computed) is within
  u_t (P + err) + a_t of it, and adding the rest and rounding again gives
      |D - v| <= u_t |v| + (1 + u_t) err'    with
      err' = (1 + u_t) err + u_t P + a_t
  (one more rounding of the same kind as the output's).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from .testing.tolerances import unit_roundoff, unit_roundoffs

U32 = unit_roundoff(np.float32)
UNIT_ROUNDOFF = unit_roundoffs(np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))
ABS_FLOOR = {  # half the smallest subnormal spacing of the output type
    np.dtype(np.float32): 0.0,
    np.dtype(ml_dtypes.bfloat16): 0.0,
    np.dtype(np.float16): 2.0**-25,
}
GELU_LIPSCHITZ = 1.13
FP8_TYPES = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))
FP8_MAX = {np.dtype(ml_dtypes.float8_e4m3fn): 448.0, np.dtype(ml_dtypes.float8_e5m2): 57344.0}
FP8_MANTISSA_BITS = {np.dtype(ml_dtypes.float8_e4m3fn): 3, np.dtype(ml_dtypes.float8_e5m2): 2}
FP8_MIN_EXPONENT = {np.dtype(ml_dtypes.float8_e4m3fn): -6, np.dtype(ml_dtypes.float8_e5m2): -14}

# The Hopper FP8 tensor-core model (see the module docstring).
FP8_MMA_K = 32  # products per MMA k-step for 8-bit inputs
FP8_ACCUMULATOR_BITS = 14  # significand bits (with the leading one) the accumulator keeps


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
    err32: np.ndarray  # bound of the computed `out` before the output rounding (FP32 and,
    # when asked, the CUDA backend's terms)
    k: int


def fp8_tensor_core_error(k: int, s_ab: np.ndarray) -> np.ndarray:
    """The Hopper FP8 MMA accumulation term: (ceil(K / 32) + 1) 2^-13 S_AB."""
    steps = -(-k // FP8_MMA_K)
    return (steps + 1) * 2.0 ** (1 - FP8_ACCUMULATOR_BITS) * s_ab


def block_scaled_tensor_core_error(op_a: np.ndarray, op_b: np.ndarray, alpha: float, scale_block_k: int) -> np.ndarray:
    """The worst case of the alignment mechanism for block-scaled FP8 GEMMs.

    With a scale per `scale_block_k` K-elements on both operands, the tensor
    core sums each block's products on its own (FP8_MMA_K per k-step) and the
    block's partial sum P is converted once more before the scales apply and
    FP32 accumulates it. In one k-step the 32 products and P are aligned to the
    largest of them (magnitude L) and each keeps 14 significant bits, so each
    of the 33 addends loses less than 2^-13 L; the conversion of P costs
    2^-13 |P| more:
        err_block <= sum_steps 33 2^-13 max(|P before the step|, max |p|) + 2^-13 |P|
    with |P| bounded by the sum of the |p| so far. Unlike the per-tensor model
    (fp8_tensor_core_error, a statistical bound of the measured behaviour),
    this holds for any data; on the H200 the measured error of the 1x128 x
    1x128 GEMM at K = 128 was 6.5 units of 2^-13 S_AB, several times below it
    (the per-tensor form (5 ceil(K / 128) + 1) 2^-13 S_AB was exceeded by 9%).
    """
    unit = 2.0 ** (1 - FP8_ACCUMULATOR_BITS)
    abs_a, abs_bt = np.abs(op_a), np.abs(op_b).T
    k = abs_a.shape[1]
    total = np.zeros((abs_a.shape[0], abs_bt.shape[0]))
    for block in range(0, k, scale_block_k):
        block_end = min(block + scale_block_k, k)
        partial = np.zeros_like(total)  # bound of |P| so far
        for step in range(block, block_end, FP8_MMA_K):
            step_end = min(step + FP8_MMA_K, block_end)
            products = abs_a[:, None, step:step_end] * abs_bt[None, :, step:step_end]
            total += (FP8_MMA_K + 1) * unit * np.maximum(products.max(axis=2), partial)
            partial += products.sum(axis=2)
        total += unit * partial
    return abs(alpha) * total


def reference(
    a,
    b,
    *,
    transa=False,
    transb=False,
    a_scale_inv=None,
    b_scale_inv=None,
    c=None,
    alpha=1.0,
    beta=0.0,
    bias=None,
    gelu=False,
    extra_roundings=0,
    tensor_core_fp8=False,
    rounded_before_bias=None,
    scale_block_k=0,
    dequantized_fp8=False,
) -> Reference:
    """v = alpha op(A) op(B) + beta C + bias (gelu(v) with gelu) and its error bound.

    tensor_core_fp8 and rounded_before_bias add the CUDA backend's terms of
    the module docstring (the first only when both operands are FP8, or when
    dequantized_fp8 says that a and b are the dequantized values of FP8
    operands that a block-scaled GEMM multiplies on the FP8 tensor cores).
    """
    a64 = dequantize(a, a_scale_inv)
    b64 = dequantize(b, b_scale_inv)
    op_a = a64.T if transa else a64
    op_b = b64.T if transb else b64
    k = op_a.shape[1]
    alpha = float(np.float32(alpha))
    beta = float(np.float32(beta))
    v = alpha * (op_a @ op_b)
    s_ab = abs(alpha) * (np.abs(op_a) @ np.abs(op_b))
    s = s_ab
    p_mag = np.abs(v)  # |alpha A B| + |beta C|: what a fused epilogue may round before the bias
    if c is not None and beta != 0.0:
        c64 = np.asarray(c).astype(np.float64).reshape(v.shape)
        v = v + beta * c64
        s = s + abs(beta) * np.abs(c64)
        p_mag = p_mag + abs(beta) * np.abs(c64)
    if bias is not None:
        bias64 = np.asarray(bias).astype(np.float64)
        v = v + bias64
        s = s + np.abs(bias64)
    err_v = (k + 4 + extra_roundings) * U32 * s
    fp8_pair = is_fp8(np.asarray(a).dtype) and is_fp8(np.asarray(b).dtype)
    if tensor_core_fp8 and (fp8_pair or dequantized_fp8):
        if scale_block_k:
            err_v = err_v + block_scaled_tensor_core_error(op_a, op_b, alpha, scale_block_k)
        else:
            err_v = err_v + fp8_tensor_core_error(k, s_ab)
    if rounded_before_bias is not None and bias is not None:
        t = np.dtype(rounded_before_bias)
        u = UNIT_ROUNDOFF[t]
        err_v = (1 + u) * err_v + u * p_mag + ABS_FLOOR[t]
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


def fp8_round(values: np.ndarray, dtype) -> np.ndarray:
    """saturate(RNE(values)) from float64 in one rounding, as the FP8 type.

    (ml_dtypes casts float64 through float32, which rounds twice: 1.0625 +
    2^-40 becomes 1.0 in E4M3 instead of 1.125.) Scaling by the spacing of
    the value's binade is exact, and np.round rounds half to even.
    """
    dtype = np.dtype(dtype)
    x = np.clip(np.asarray(values, np.float64), -FP8_MAX[dtype], FP8_MAX[dtype])
    exponent = np.frexp(x)[1] - 1  # |x| in [2^exponent, 2^(exponent + 1)); 0 -> -1
    exponent = np.maximum(exponent, FP8_MIN_EXPONENT[dtype])  # subnormals: the fixed spacing
    spacing = np.ldexp(1.0, exponent - FP8_MANTISSA_BITS[dtype])
    return (np.round(x / spacing) * spacing).astype(dtype)  # exact in the FP8 type now


def fp8_reference(values: np.ndarray, d_scale: float, dtype) -> np.ndarray:
    """saturate(RNE(values * d_scale)) in the FP8 type."""
    return fp8_round(values * float(np.float32(d_scale)), dtype)


def assert_fp8_close(actual: np.ndarray, ref: Reference, d_scale: float) -> None:
    """FP8 D is q(w') for some computed w' within e of w = out * d_scale, where
    q = saturate(RNE(.)) and e = (1 + u_32) err * d_scale + u_32 |out| d_scale
    (err, then one FP32 rounding of the product by d_scale).

    q is monotone (rounding to nearest and clipping both are), so
        q(w - e) <= D <= q(w + e)
    elementwise. Where no rounding boundary lies within e of w, both ends are
    q(w): D must be the rounded reference itself. With the CPU's FP32 error
    that is nearly everywhere; with the FP8 tensor-core term, values whose
    FP8 step is not far above e (small |w|) may take a neighbouring code.
    """
    dtype = np.asarray(actual).dtype
    ds = float(np.float32(d_scale))
    target = ref.out * ds
    e = (1 + U32) * ref.err32 * ds + U32 * np.abs(ref.out) * ds
    got = np.asarray(actual).reshape(target.shape).astype(np.float64)
    lo = fp8_round(target - e, dtype).astype(np.float64)
    hi = fp8_round(target + e, dtype).astype(np.float64)
    bad = ~((lo <= got) & (got <= hi))  # NaN fails too
    if np.any(bad):
        worst = np.unravel_index(np.argmax(bad), bad.shape)
        raise AssertionError(
            f"FP8 D ({dtype}) at {worst}: got {got[worst]!r}, allowed [{lo[worst]!r}, "
            f"{hi[worst]!r}] (reference * d_scale {target[worst]!r}, e {e[worst]:.3e}); "
            f"{int(bad.sum())} of {bad.size} outside"
        )


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
