"""Fixtures of te-jax's tests, loaded by each test module with
`pytest_plugins = ["jax_fixtures"]` (not a conftest.py: CI runs every
package's tests in one session, where te-core's tests import names from their
conftest module). Plugin fixtures are visible session-wide, so their names
carry a jax_ prefix (te-pytorch's plugin has its own `device`).

jax_device: each test runs on JAX's CPU device and, marked gpu, on its GPU
(with te-core's CUDA backend; the device machine). CI runs the CPU ones."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from transformer_engine.core.testing.seeds import draw_seed

# JAX's GPU client takes 75% of the GPU's memory when it starts (at the first
# jax.devices() below, not at import); the GPU suite runs torch tests in
# neighbouring processes on the same device.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _gpu_available() -> bool:
    try:
        import transformer_engine.core as core

        return core.built_with_cuda() and len(jax.devices("gpu")) > 0
    except RuntimeError:  # no GPU backend in this jaxlib
        return False


DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "gpu",
        id="gpu",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not _gpu_available(), reason="needs JAX on a GPU and te-core CUDA")],
    ),
]


@pytest.fixture(params=DEVICES)
def jax_device(request):
    """A JAX device: computations follow their inputs' placement."""
    return jax.devices(request.param)[0]


@pytest.fixture
def jax_rng(request):
    """Fresh random inputs per test (TE_TEST_SEED reproduces a run)."""
    return np.random.default_rng(draw_seed())
