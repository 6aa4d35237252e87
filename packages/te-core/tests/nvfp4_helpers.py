"""Inputs for the NVFP4 tests (CPU and GPU): blocks of very different
magnitudes, so scales span the E4M3 range (including 0 and subnormal block
scales), laced with 0, -0, denormals, +-inf, NaN and the type's largest values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from conftest import finfo

from transformer_engine.core import reference_nvfp4 as ref

INPUT_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
# Rowwise-only shapes may have any number of rows; columnwise and 2-D need rows % 16 == 0.
ROWWISE_SHAPES = [(1, 16), (5, 160), (7, 48), (16, 16), (48, 64), (128, 256), (3, 16, 32)]
COLUMNWISE_SHAPES = [(16, 16), (48, 64), (128, 256), (3, 16, 32), (2, 8, 48), (160, 32)]


def block_scaled(rng, shape, dtype) -> np.ndarray:
    """Normal values whose magnitude changes every 16 elements (by powers of 10)."""
    n = int(np.prod(shape))
    blocks = -(-n // 16)
    magnitude = 10.0 ** rng.integers(-6, 5, size=blocks)
    magnitude[rng.random(blocks) < 0.1] = 1e-30  # blocks whose E4M3 scale underflows to 0
    x = rng.standard_normal(blocks * 16) * np.repeat(magnitude, 16)
    with np.errstate(over="ignore"):
        return x[:n].astype(np.float32).astype(dtype).reshape(shape)


def common_blocks(rng, shape, dtype, nan_every: int = 0) -> np.ndarray:
    """Blocks of moderate magnitude (2^-6 .. 2^6 per 16 elements) of normal values
    and E2M1 grid points and midpoints, with no special values: the blocks the
    fast CUDA kernel quantizes on its packed route (hostile() input sends nearly
    every warp to its general route). nan_every > 0: a NaN every nan_every
    elements, so that warps of both routes run side by side."""
    n = int(np.prod(shape))
    blocks = -(-n // 16)
    magnitude = np.repeat(2.0 ** rng.integers(-6, 7, size=blocks), 16)[:n]
    grid = np.array([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0])
    x = np.where(rng.random(n) < 0.8, rng.standard_normal(n), rng.choice(grid, n) * rng.choice([-1.0, 1.0], n))
    x = (x * magnitude).astype(np.float32)
    if nan_every > 0:
        x[nan_every - 1 :: nan_every] = np.nan
    return x.astype(dtype).reshape(shape)


def hostile(rng, shape, dtype, *, with_inf=True, with_nan=True) -> np.ndarray:
    """block_scaled values with ~10% of the elements replaced by special values."""
    x = block_scaled(rng, shape, dtype).astype(np.float32).ravel()
    info = finfo(dtype)
    pool = [
        0.0,
        -0.0,
        float(info.smallest_subnormal),
        -3 * float(info.smallest_subnormal),
        float(info.max),
        -float(info.max) / 3,
    ]
    if with_inf:
        pool += [np.inf, -np.inf]
    if with_nan:
        pool += [np.nan]
    mask = rng.random(x.size) < 0.1
    x[mask] = rng.choice(np.array(pool, np.float32), int(mask.sum()))
    with np.errstate(over="ignore"):
        return x.astype(dtype).reshape(shape)


def assert_same_bytes(actual, expected, what=""):
    a = np.asarray(actual).view(np.uint8)
    e = np.asarray(expected).view(np.uint8)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    bad = np.argwhere(a != e)
    assert bad.size == 0, (
        f"{what}: {len(bad)} bytes differ, first at {bad[0].tolist()}: {a[tuple(bad[0])]:#x} != {e[tuple(bad[0])]:#x}"
    )


def check_against_oracle(x, out, **options):
    """Every output of tc.quantize_nvfp4 equals the oracle's bytes (same amaxes)."""
    expected = ref.quantize(x, out.amax_rowwise, out.amax_columnwise, **options)
    for name in ("rowwise", "rowwise_scale", "columnwise", "columnwise_scale"):
        if name in expected:
            assert_same_bytes(getattr(out, name), expected[name], name)
        else:
            assert getattr(out, name) is None, name
