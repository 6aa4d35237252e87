"""Helpers of te-jax's tests (plain functions; the fixtures are in jax_fixtures.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from transformer_engine.core import reference as ref
from transformer_engine.core.testing.tolerances import unit_roundoffs

# One rounding of each high-precision output type (relative).
EPS = unit_roundoffs(np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


def gemm_tolerance(jax_device, a64, b64, out_dtype, fp8: bool) -> np.ndarray:
    """Per element of a64 @ b64 (float64 operands as te/gemm.h reads them): one
    rounding of the output type plus the accumulation error.

    CPU (and high-precision GEMMs): FP32 accumulation, K * 2^-24 of sum |a||b|.

    GPU FP8 (Hopper tensor cores): the larger of two bounds. (1) te/gemm.h's
    documented 2^-13 of sum |a||b| per 32 products, 2^-12 taken. (2) A bound per
    k-block of 32 products (one MMA k-step), for the way the hardware adds them:
    the 32 exact FP8 x FP8 products of a block are aligned to the largest of them
    and the bits below about 2^-13 of that largest are truncated, so each product
    loses up to 2^-13 * max_k |a_k b_k| and a block up to
    32 * 2^-13 * max_k |a_k b_k| = 2^-8 * max_k |a_k b_k|, independent of how small
    the other products are; plus the FP32 additions of the K/32 block sums,
    (K/32) * 2^-24 of sum |a||b|. Bound (1) is smaller when a block's products are
    alike, (2) when one product dominates its block: dense(layernorm(x)) on the
    H200 exceeded (1) by up to 1.5x on such inputs while equal to the fused layer
    bit for bit, which (2) explains. Both bound the same sum of truncations, so the
    elementwise max is a bound that holds whichever regime a block is in.
    """
    magnitude = np.abs(a64) @ np.abs(b64)
    k = a64.shape[1]
    if not (fp8 and jax_device.platform == "gpu"):
        return magnitude * (k * 2.0**-24 + EPS[np.dtype(out_dtype)]) + 1e-30
    per_block = 2.0**-8 * block_max_products(a64, b64) + (-(-k // 32)) * 2.0**-24 * magnitude
    accumulation = np.maximum(2.0**-12 * magnitude, per_block)
    return accumulation + magnitude * EPS[np.dtype(out_dtype)] + 1e-30


def block_max_products(a64, b64, block: int = 32) -> np.ndarray:
    """[M, N]: sum over the k-blocks of `block` products of max_k |a[m, k] b[k, n]|."""
    m, k = a64.shape
    pad = -k % block
    a = np.abs(np.pad(a64, ((0, 0), (0, pad)))).reshape(m, -1, block)
    b = np.abs(np.pad(b64, ((0, pad), (0, 0)))).reshape(-1, block, b64.shape[1])
    out = np.zeros((m, b64.shape[1]))
    for start in range(0, m, 64):  # a few MiB at a time
        rows = a[start : start + 64, :, :, None] * b[None]  # [rows, blocks, block, N]
        out[start : start + 64] = rows.max(axis=2).sum(axis=1)
    return out


def hostile(rng, shape, dtype) -> np.ndarray:
    """Random values spanning many binades, with 0, -0, denormals, +-inf, NaN and values
    above every FP8 maximum sprinkled in (as a NumPy array of `dtype`)."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, size=shape))
    flat = x.reshape(-1)
    specials = [0.0, -0.0, 1e-40, -3e-39, np.inf, -np.inf, np.nan, 6e4, -1e5, 500.0]
    picks = rng.choice(flat.size, size=min(flat.size, len(specials)), replace=False)
    for i, v in zip(picks, specials):
        flat[i] = v
    with np.errstate(over="ignore"):  # (above float16's max: inf, on purpose)
        return flat.reshape(shape).astype(dtype)


# The te-core NumPy API's / oracles' name of each JAX FP8 type.
FP8_NAME = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def fp8_name(dtype) -> str:
    return FP8_NAME[np.dtype(dtype).name]


def put(a, device):
    """A NumPy array (or scalar list) on a JAX device."""
    import jax
    import jax.numpy as jnp

    return jax.device_put(jnp.asarray(a), device)


def fp32_scalar(value, device):
    """float32 shape (1,): the layout of te-jax's scale and amax operands."""
    return put(np.array([value], np.float32), device)


def norm_rows(rng, shape, dtype, *, specials=True) -> np.ndarray:
    """Normalization inputs: each row with its own spread (1e-3 .. 30) and an offset up
    to 300x the spread (a one-pass variance would lose it), some zeros and subnormals;
    with `specials` and >= 4 rows, row 1 holds +inf and row 2 a NaN."""
    import ml_dtypes

    n, h = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
    spread = rng.choice([1e-3, 1.0, 30.0], (n, 1))
    offset = rng.choice([0.0, 1.0, 300.0], (n, 1)) * spread * rng.choice([-1.0, 1.0], (n, 1))
    x = rng.standard_normal((n, h)) * spread + offset
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    holes = rng.random((n, h)) < 0.05
    x[holes] = rng.choice([0.0, -0.0, tiny, -2 * tiny], int(holes.sum()))
    if specials and n >= 4:
        x[1, rng.integers(h)] = np.inf
        x[2, rng.integers(h)] = np.nan
    return x.astype(dtype).reshape(shape)


def same_floats(a, b) -> None:
    """Same dtype, shape and bytes, except that any NaN matches any NaN (at the same
    positions): XLA may rewrite a NaN's payload when it moves 16-bit floats (the
    stacking loop of vmap on the CPU does), and NumPy's casts make other NaNs than
    te-core's canonical one. FP8 results are compared byte for byte elsewhere."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    nan = np.isnan(a.astype(np.float32))
    np.testing.assert_array_equal(nan, np.isnan(b.astype(np.float32)))
    np.testing.assert_array_equal(a[~nan].view(np.uint8), b[~nan].view(np.uint8))


def same_fp8(a, b) -> None:
    """FP8 arrays (or their uint8 codes) byte for byte, NaN codes included."""
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def delayed_dq(x: np.ndarray, scale, fmt: str) -> np.ndarray:
    """x quantized with a given scale and dequantized (scale_inv = 1 / scale), float64."""
    q = ref.quantize_fp8(x, np.float32(scale), fmt)
    return ref.dequantize_fp8(q, np.float32(1.0) / np.float32(scale), fmt).astype(np.float64)


class DelayedOracle:
    """One DelayedScaleQuantizer's state, advanced with the NumPy oracle (reference §3.3)."""

    def __init__(self, fmt: str, history_len: int, margin: float, algo: str):
        self.fmt, self.margin, self.algo = fmt, margin, algo
        self.scale = np.ones(1, np.float32)
        self.history = np.zeros(history_len, np.float32)

    def quantize_and_update(self, x: np.ndarray) -> np.ndarray:
        """x dequantized with the scale of the previous step; then amax recorded in slot 0 and the update."""
        dq = delayed_dq(x, self.scale[0], self.fmt)
        self.history[0] = np.fmax(self.history[0], ref.amax(x))
        history, self.scale = ref.delayed_scaling_update(
            self.history.reshape(-1, 1), self.scale, self.fmt, margin=self.margin, algo=self.algo
        )
        self.history = history.reshape(-1)
        return dq

    def assert_matches(self, scale, amax_history) -> None:
        np.testing.assert_array_equal(np.asarray(scale), self.scale)
        np.testing.assert_array_equal(np.asarray(amax_history), self.history)


def fp8_dq_within(y64: np.ndarray, band: np.ndarray, scale, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(Q(y64) dequantized, allowance): for a kernel's FP32 value y with |y - y64| <= band
    (the oracle's bound), |dequantize(Q(y)) - dequantize(Q(y64))| <= allowance.
    Quantization is monotonic, so the FP8 values of y64 -+ band bracket it: the
    allowance is zero except where y64 lies within band of a rounding boundary."""
    base = delayed_dq(y64.astype(np.float32), scale, fmt)
    lo = delayed_dq((y64 - band).astype(np.float32), scale, fmt)
    hi = delayed_dq((y64 + band).astype(np.float32), scale, fmt)
    return base, np.maximum(np.abs(hi - base), np.abs(base - lo))


def dense_inputs(rng, x_shape, kernel_shape, dtype, x_range=1.0):
    """(x, kernel, bias, dy) of a dense call: x and dy in dtype, kernel and bias FP32."""
    x = (rng.standard_normal(x_shape) * x_range).astype(dtype)
    kernel = rng.standard_normal(kernel_shape).astype(np.float32)
    bias = rng.standard_normal(kernel_shape[1:]).astype(np.float32)
    dy = rng.standard_normal((*x_shape[:-1], *kernel_shape[1:])).astype(dtype)
    return x, kernel, bias, dy


def dense_and_vjp(device, x, kernel, bias, dy, quantizer_set, jit: bool):
    """(y, dx, dkernel, dbias) of transformer_engine.jax.dense.dense on `device`, eager or jitted."""
    import jax

    from transformer_engine.jax.dense import dense

    def run(x, kernel, bias, dy):
        y, vjp = jax.vjp(lambda x, k, b: dense(x, k, b, quantizer_set=quantizer_set), x, kernel, bias)
        return (y, *vjp(dy))

    return (jax.jit(run) if jit else run)(put(x, device), put(kernel, device), put(bias, device), put(dy, device))


def assert_product(jax_device, got, a64, b64, fp8: bool, plus=None, bf16_operands: bool = False) -> None:
    """got (any shape, viewed as [M, N]) == a64 @ b64 (+ plus[n]) within te_gemm's bound.

    bf16_operands: a block-scaled GEMM whose emulated CUDA path (te/gemm_block.h) rounds
    the dequantized operands to BF16 first -- a relative 2^-8 per operand where the
    values do not fit BF16 (NVFP4; FP8 blocks with FP32 scales), so on a GPU each
    product may err by (2^-7 + 2^-16) |a||b| more. (Exact on the CPU, which dequantizes
    to FP32.)"""
    got = np.asarray(got)
    expected = a64 @ b64
    tol = gemm_tolerance(jax_device, a64, b64, got.dtype, fp8)
    if bf16_operands and jax_device.platform == "gpu":
        tol = tol + (2.0**-7 + 2.0**-16) * (np.abs(a64) @ np.abs(b64))
    if plus is not None:
        expected = expected + plus
        tol = tol + EPS[np.dtype(got.dtype)] * np.abs(expected)  # the bias epilogue's second rounding
    err = np.abs(np.asarray(got).astype(np.float64).reshape(expected.shape) - expected)
    assert (err <= tol).all(), f"max error {err.max()} (tolerance there {tol.flat[err.argmax()]})"
