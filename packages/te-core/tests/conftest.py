"""Shared fixtures: fresh random generators and hostile inputs."""

from __future__ import annotations

import core_device
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


# The devices a test that takes `device` runs on: the CPU backend always, the CUDA
# backend (marked gpu) where torch sees a GPU and te-core has its CUDA backend --
# the same parametrization as te-pytorch's and te-jax's `device` fixtures.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    """ "cpu" or "cuda", made current for core_device's buffers during the test."""
    if request.param == "cuda" and not core_device.cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    if request.param == "cpu" and request.node.get_closest_marker("gpu_scale"):
        pytest.skip("sized for the CUDA kernels' tiles and warps; the CPU backend runs the smaller cases")
    with core_device.use(request.param):
        yield request.param


def gpu_scale(*values):
    """Parameter values that only the CUDA run needs (pytest.param ... gpu_scale)."""
    return [pytest.param(v, marks=pytest.mark.gpu_scale) for v in values]


# A test that only means something on the GPU (e.g. a CUDA input with host
# outputs) takes `device` restricted to "cuda".
CUDA_ONLY = pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu)], indirect=True)


@pytest.fixture
def rng_and_seed():
    """rng plus its seed, for tests that name the seed in their messages."""
    seed = draw_seed()
    return np.random.default_rng(seed), seed
