"""Transpose and the delayed-scaling update: the CPU backend against the oracle,
and every backend (the `device` fixture) byte for byte against the NumPy API."""

from __future__ import annotations

import math

import backend_checks as bc
import core_device
import ml_dtypes
import numpy as np
import pytest
from conftest import SHAPES

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core import reference as ref
from transformer_engine.core.dtypes import te_dtype

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


# ---------------------------------------------------------------- every backend, raw buffers
# The bindings on buffers of the test's device (backend_checks): the bytes equal
# the NumPy API's. On CUDA that is the CPU == CUDA contract; on the CPU, the
# raw-buffer path (0xA5-prefilled outputs, pointers off the 16-byte grid).
# Odd shapes first; (32768, 64) and (256, 192) take the CUDA kernels'
# vectorized full-tile paths, (1000, 1000) the 8-byte columnwise stores,
# (3, 7, 33) unaligned rows.

# ---------------------------------------------------------------- transpose

TRANSPOSE_DTYPES = [
    np.dtype(np.uint8),
    bc.FP8["e4m3"],
    np.dtype(np.int16),
    bc.BF16,
    np.dtype(np.float32),
    np.dtype(np.int32),
    np.dtype(np.int64),
]


@pytest.mark.parametrize("dtype", TRANSPOSE_DTYPES, ids=str)
@pytest.mark.parametrize("shape", bc.SHAPES + [(0, 5), (129, 65)], ids=str)
def test_device_transpose(device, shape, dtype, rng_and_seed):
    rng, seed = rng_and_seed
    n = math.prod(shape)
    x = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)
    rows, cols = bc.matrix(shape)
    for offset in [0, dtype.itemsize]:
        out = bc.DeviceArray((cols, rows), dtype, offset)
        dx = bc.DeviceArray.of(x, offset)
        lib.transpose(dx.desc, out.desc, core_device.stream())
        bc.assert_same_bytes(out.numpy(), tc.transpose(x), "transpose", bc.ctx(seed, offset=offset))


# ---------------------------------------------------------------- delayed-scaling update


def _amax_values(rng, shape):
    """Positive amaxes with zeros, subnormals, huge, inf and NaN mixed in."""
    a = (10.0 ** rng.uniform(-6, 6, shape)).astype(np.float32)
    specials = np.array([0.0, 0.0, 0.0, np.inf, np.nan, 1e-42, 3e38, 1.0], np.float32)
    pick = rng.random(shape) < 0.25
    a[pick] = rng.choice(specials, int(pick.sum()))
    return a


@pytest.mark.parametrize("num_groups", [3, 150])  # 150 > one launch's groups
@pytest.mark.parametrize("with_scale_inv", [True, False])
@pytest.mark.parametrize("with_buffer", [False, True])
@pytest.mark.parametrize("margin", [0.0, 1.0])
@pytest.mark.parametrize("fp8", list(bc.FP8))
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length", [1, 16, 300, 1024])  # 300: a partial pass of the warp roll
def test_device_delayed_scaling_update(
    device, length, algo, fp8, margin, with_buffer, with_scale_inv, num_groups, rng_and_seed
):
    rng, seed = rng_and_seed
    sizes = [int(s) for s in rng.integers(1, 6, num_groups)]
    sizes[0] = 300  # more columns than threads in a block
    histories = [_amax_values(rng, (length, n)) for n in sizes]
    for h in histories[::3]:
        h[0, :] = 0.0  # nothing staged: no roll unless the buffer has a value
    scales = [(10.0 ** rng.uniform(-3, 3, n)).astype(np.float32) for n in sizes]
    invs = [np.full(n, -7.0, np.float32) for n in sizes] if with_scale_inv else None
    buffer = None
    if with_buffer:
        buffer = _amax_values(rng, (sum(sizes),))
        buffer[rng.random(buffer.size) < 0.4] = 0.0  # zeros fall back to the history's row 0

    d_hist = [bc.DeviceArray.of(h) for h in histories]
    d_scales = [bc.DeviceArray.of(s) for s in scales]
    d_invs = [bc.DeviceArray.of(i) for i in invs] if invs is not None else None
    d_buffer = bc.DeviceArray.of(buffer) if buffer is not None else None
    algo_code = {"max": lib.AmaxComputeAlgo.MAX, "most_recent": lib.AmaxComputeAlgo.MOST_RECENT}[algo]
    lib.delayed_scaling_update(
        bc.desc_or_none(d_buffer),
        [d.desc for d in d_hist],
        [d.desc for d in d_scales],
        None if d_invs is None else [d.desc for d in d_invs],
        algo_code,
        int(te_dtype(fp8)),
        margin,
        core_device.stream(),
    )

    tc.delayed_scaling_update(
        histories, scales, invs, amax_reduction_buffer=buffer, amax_compute_algo=algo, fp8_dtype=fp8, margin=margin
    )
    for k in range(num_groups):
        ctx = bc.ctx(seed, group=k)
        bc.assert_same_bytes(d_hist[k].numpy(), histories[k], "amax_history", ctx)
        bc.assert_same_bytes(d_scales[k].numpy(), scales[k], "scale", ctx)
        if invs is not None:
            bc.assert_same_bytes(d_invs[k].numpy(), invs[k], "scale_inv", ctx)
