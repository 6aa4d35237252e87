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
    rounding of the output type plus the accumulation error, K * 2^-24 of
    sum |a||b| in FP32, or te/gemm.h's bound for Hopper FP8 tensor cores (about
    2^-13 of sum |a||b| per 32 products: 2^-12 taken)."""
    magnitude = np.abs(a64) @ np.abs(b64)
    k = a64.shape[1]
    accumulation = 2.0**-12 if (fp8 and jax_device.platform == "gpu") else k * 2.0**-24
    return magnitude * (accumulation + EPS[np.dtype(out_dtype)]) + 1e-30


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
