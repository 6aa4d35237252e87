"""Shared fixtures: fresh random generators and hostile inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from transformer_engine.core.reference import FP8_NUMPY
from transformer_engine.core.testing.seeds import draw_seed
from transformer_engine.core.testing.shapes import SHAPES  # noqa: F401  (imported from conftest by the tests)

INPUT_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
FP8_FORMATS = ["e4m3", "e5m2"]


@pytest.fixture
def rng():
    """Fresh random inputs per test; the seed is printed (pytest shows it when the test
    fails) and TE_TEST_SEED=<seed> replays the failure."""
    return np.random.default_rng(draw_seed())


def finfo(dtype):
    """np.finfo that also knows ml_dtypes' bfloat16."""
    return ml_dtypes.finfo(dtype) if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16) else np.finfo(dtype)


def fp8_midpoints(fmt: str) -> np.ndarray:
    """Exact midpoints between consecutive finite FP8 values (round-to-even ties)."""
    codes = np.arange(256, dtype=np.uint8).view(FP8_NUMPY[fmt]).astype(np.float32)
    finite = np.unique(codes[np.isfinite(codes)])
    return ((finite[:-1] + finite[1:]) / 2).astype(np.float32)


def hostile(rng, shape, dtype, fmt: str = "e4m3") -> np.ndarray:
    """Random values of `dtype` laced with 0, -0, denormals, +-inf, NaN, huge values, ties."""
    n = int(np.prod(shape))
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 30.0, 1e3], n)).astype(np.float32)
    tiny = float(finfo(dtype).smallest_subnormal)
    specials = np.array(
        [0.0, -0.0, tiny, -tiny, 3 * tiny, np.inf, -np.inf, np.nan, 1e5, -7e4, 6e4, 449.0, -460.0],
        dtype=np.float32,
    )
    ties = fp8_midpoints(fmt)
    pool = np.concatenate([specials, ties, -ties])
    mask = rng.random(n) < 0.25
    x[mask] = rng.choice(pool, int(mask.sum()))
    with np.errstate(over="ignore"):
        return x.astype(dtype).reshape(shape)
