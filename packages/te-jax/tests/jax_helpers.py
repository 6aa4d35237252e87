"""Helpers of te-jax's tests (plain functions; the fixtures are in jax_fixtures.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from transformer_engine.core import reference as ref

# One rounding of each high-precision output type (relative).
EPS = {np.dtype(np.float32): 2.0**-24, np.dtype(ml_dtypes.bfloat16): 2.0**-8, np.dtype(np.float16): 2.0**-11}


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
