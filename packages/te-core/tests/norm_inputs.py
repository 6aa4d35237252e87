"""Inputs for the LayerNorm/RMSNorm tests (CPU and GPU): varied rows, hostile values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from conftest import finfo

from transformer_engine.core.testing.shapes import NORM_SHAPES  # noqa: F401  (re-exported to the norm tests)

# The shapes the norm tests run on: odd row counts, 4-D, and a long row.
FLOAT_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]


def norm_input(rng, shape, dtype, *, specials=True, constant_row=True) -> np.ndarray:
    """Rows with per-row scale (1e-3 .. 30) and offset (up to 300x the spread, where a
    one-pass variance would cancel catastrophically), laced with zeros and denormals.
    With `specials` and >= 4 rows, row 1 holds an inf and row 2 a NaN (those rows must
    come out NaN); with `constant_row` and >= 5 rows, row 3 is constant (variance 0)."""
    h = shape[-1]
    n = int(np.prod(shape[:-1], dtype=np.int64))
    spread = rng.choice([1e-3, 1.0, 30.0], (n, 1))
    offset = rng.choice([0.0, 1.0, 300.0], (n, 1)) * spread * rng.choice([-1.0, 1.0], (n, 1))
    x = rng.standard_normal((n, h)) * spread + offset
    tiny = float(finfo(dtype).smallest_subnormal)
    mask = rng.random((n, h)) < 0.05
    x[mask] = rng.choice([0.0, -0.0, tiny, -tiny, 3 * tiny], int(mask.sum()))
    if specials and n >= 4:
        x[1, rng.integers(h)] = np.inf
        x[2, rng.integers(h)] = np.nan
    if constant_row and n >= 5:
        x[3, :] = rng.choice([0.0, 0.7, -3.0])
    return x.astype(dtype).reshape(shape)


def weights(rng, h, dtype, zero_centered=False):
    """gamma (around 1, or around 0 when zero-centred) and beta, both of `dtype`."""
    gamma = rng.standard_normal(h) * 0.5 + (0.0 if zero_centered else 1.0)
    gamma[rng.random(h) < 0.05] = 0.0
    beta = rng.standard_normal(h) * 0.5
    return gamma.astype(dtype), beta.astype(dtype)


def grad_input(rng, shape, dtype) -> np.ndarray:
    """An output gradient with varied magnitudes and some exact zeros."""
    dz = rng.standard_normal(shape) * rng.choice([1e-2, 1.0, 10.0], shape)
    dz[rng.random(shape) < 0.05] = 0.0
    return dz.astype(dtype)
