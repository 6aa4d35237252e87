"""Transpose and the delayed-scaling update on the CPU backend."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import SHAPES

import transformer_engine.core as tc
from transformer_engine.core import reference as ref

pytestmark = [pytest.mark.transpose, pytest.mark.recipe]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.uint8, ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16, np.float32, np.int64])
def test_transpose_matches_numpy(rng, shape, dtype):
    x = rng.integers(0, 255, size=shape).astype(np.uint8).astype(dtype)
    k = shape[-1]
    np.testing.assert_array_equal(
        tc.transpose(x).view(np.uint8), np.ascontiguousarray(x.reshape(-1, k).T).view(np.uint8)
    )


def random_history(rng, length, n):
    h = rng.uniform(0, 500, size=(length, n)).astype(np.float32)
    h[:, rng.random(n) < 0.2] = 0  # columns whose module did not run
    return h


@pytest.mark.parametrize("length", [1, 2, 16])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("margin", [0.0, 1.0, 0.5])
def test_delayed_update_matches_oracle(rng, length, algo, fmt, margin):
    groups = [3, 1, 7]
    histories = [random_history(rng, length, n) for n in groups]
    histories[0][0, 1] = np.inf  # bad amaxes keep the old scale
    histories[2][0, 2] = np.nan
    histories[2][0, 3] = 1e-43  # tiny: FLT_MAX
    scales = [rng.uniform(0.5, 2, n).astype(np.float32) for n in groups]
    invs = [np.zeros(n, np.float32) for n in groups]
    expected = [ref.delayed_scaling_update(h, s, fmt, margin, algo) for h, s in zip(histories, scales)]
    tc.delayed_scaling_update(histories, scales, invs, amax_compute_algo=algo, fp8_dtype=fmt, margin=margin)
    for h, s, inv, (eh, es) in zip(histories, scales, invs, expected):
        np.testing.assert_array_equal(h, eh)
        np.testing.assert_array_equal(s, es)
        np.testing.assert_array_equal(inv, np.float32(1.0) / es)


def test_reduction_buffer_overrides_staging_row_unless_zero(rng):
    histories = [random_history(rng, 4, 3), random_history(rng, 4, 2)]
    scales = [np.ones(3, np.float32), np.ones(2, np.float32)]
    buffer = np.array([0.0, 100.0, 7.0, 0.0, 900.0], np.float32)
    expected = [
        ref.delayed_scaling_update(histories[0], scales[0], "e4m3", reduced_amax=buffer[:3]),
        ref.delayed_scaling_update(histories[1], scales[1], "e4m3", reduced_amax=buffer[3:]),
    ]
    tc.delayed_scaling_update(histories, scales, amax_reduction_buffer=buffer)
    for h, s, (eh, es) in zip(histories, scales, expected):
        np.testing.assert_array_equal(h, eh)
        np.testing.assert_array_equal(s, es)


def test_delayed_update_spec_by_hand():
    """The rule of te/recipe.h on a worked example (no oracle involved)."""
    h = np.array([[5.0, 0.0], [1.0, 9.0], [2.0, 3.0]], np.float32)  # L=3, n=2; row 0 = staging
    s = np.array([1.0, 4.0], np.float32)
    tc.delayed_scaling_update([h], [s])
    # column 0: last=5, window = (old[1], old[2], last) = (1, 2, 5) -> rolled [0, 2, 5], amax 5
    # column 1: last=0: no roll, scale kept
    np.testing.assert_array_equal(h, np.array([[0.0, 0.0], [2.0, 9.0], [5.0, 3.0]], np.float32))
    np.testing.assert_array_equal(s, np.array([448.0 / 5.0, 4.0], np.float32))
