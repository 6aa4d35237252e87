"""Helpers of te-jax's tests (plain functions; the fixtures are in jax_fixtures.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

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
