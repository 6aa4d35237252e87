"""Helpers of te-jax's tests (plain functions; the fixtures are in jax_fixtures.py)."""

from __future__ import annotations

import numpy as np


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
