"""Fused scaled / masked / causal softmax on the CPU backend against the float64 oracle
(reference_softmax): the four variants, odd shapes, long rows, fully masked rows,
hostile logits (+-inf, NaN, underflowing exponentials), backward, argument errors."""

from __future__ import annotations

import backend_checks as bc
import core_device
import numpy as np
import pytest
from softmax_cases import BACKWARD, CASES, FLOAT_DTYPES, case_id, forward, inputs, logits

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core import reference_norm as nref
from transformer_engine.core import reference_softmax as sref

pytestmark = [pytest.mark.softmax]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forward_against_oracle(rng, case, dtype):
    kind, shape = case
    x, mask, scale = inputs(rng, case, dtype)
    y = forward(kind, x, mask, scale)
    assert y.dtype == np.dtype(dtype) and y.shape == x.shape
    exact, bound = sref.forward(x, scale, kind, mask)
    nref.assert_within(y, exact, bound, case_id(case))
    hidden = ~sref.visible(shape, kind, mask)
    finite_rows = ~np.isnan(exact).any(axis=-1, keepdims=True)
    assert (y.astype(np.float64)[hidden & finite_rows] == 0).all(), "masked elements must be 0"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_backward_against_oracle(rng, case, dtype):
    kind, shape = case
    x, mask, scale = inputs(rng, case, dtype)
    y = forward(kind, x, mask, scale)
    dy = (rng.standard_normal(shape) * rng.choice([1e-2, 1.0, 30.0], shape)).astype(dtype)
    dx = BACKWARD[kind](dy, y, scale)
    assert dx.dtype == np.dtype(dtype) and dx.shape == shape
    exact, bound = sref.backward(dy, y, scale)
    nref.assert_within(dx, exact, bound, case_id(case))


def test_fully_masked_rows_are_zero(rng):
    x = rng.standard_normal((2, 2, 3, 8)).astype(np.float32)
    mask = np.ones((1, 1, 3, 8), np.uint8)
    mask[0, 0, 1, 2] = 0
    y = tc.scaled_masked_softmax_forward(x, mask, 1.0)
    assert (y[:, :, [0, 2]] == 0).all()
    np.testing.assert_array_equal(y[:, :, 1, 2], 1.0)
    dx = tc.scaled_masked_softmax_backward(np.ones_like(y), y, 1.0)
    assert (dx == 0).all()


def test_variants_agree_with_explicit_masks(rng):
    """The causal kernels equal the explicit-mask one with the same triangle."""
    x = rng.standard_normal((2, 3, 6, 9)).astype(np.float32)
    tri = (np.arange(9)[None, :] > np.arange(6)[:, None] + 3).astype(np.uint8)[None, None]
    np.testing.assert_array_equal(
        tc.scaled_aligned_causal_masked_softmax_forward(x, 0.7), tc.scaled_masked_softmax_forward(x, tri, 0.7)
    )
    sq = rng.standard_normal((4, 7, 7)).astype(np.float32)
    upper = (np.arange(7)[None, :] > np.arange(7)[:, None]).astype(np.uint8)[None, None]
    np.testing.assert_array_equal(
        tc.scaled_upper_triang_masked_softmax_forward(sq, 2.0),
        tc.scaled_masked_softmax_forward(sq[None], upper, 2.0)[0],
    )


def test_backward_in_place(rng):
    x = rng.standard_normal((3, 40)).astype(np.float32)
    y = tc.scaled_softmax_forward(x, 1.0)
    dy = rng.standard_normal((3, 40)).astype(np.float32)
    expected = tc.scaled_softmax_backward(dy, y, 1.0)
    lib = tc.lib
    from transformer_engine.core._arrays import desc

    lib.scaled_softmax_bwd(desc(dy), desc(y), 1.0, desc(dy))
    np.testing.assert_array_equal(dy, expected)


def test_argument_errors():
    x4 = np.zeros((2, 2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="4 dimensions"):
        tc.scaled_masked_softmax_forward(np.zeros((2, 3, 4), np.float32), np.zeros((1, 1, 3, 4), np.uint8), 1.0)
    with pytest.raises(ValueError, match="'mask' must be \\[2 or 1, 1, 3, 4\\]"):
        tc.scaled_masked_softmax_forward(x4, np.zeros((1, 2, 3, 4), np.uint8), 1.0)
    with pytest.raises(TypeError, match="mask"):
        tc.scaled_masked_softmax_forward(x4, np.zeros((1, 1, 3, 4), np.float32), 1.0)
    with pytest.raises(ValueError, match="sq == sk"):
        tc.scaled_upper_triang_masked_softmax_forward(np.zeros((2, 3, 4), np.float32), 1.0)
    with pytest.raises(ValueError, match="3 dimensions"):
        tc.scaled_upper_triang_masked_softmax_forward(x4, 1.0)
    with pytest.raises(ValueError, match="'scale' must be finite"):
        tc.scaled_softmax_forward(x4, float("inf"))
    with pytest.raises(ValueError, match="non-empty last dimension"):
        tc.scaled_softmax_forward(np.zeros((3, 0), np.float32), 1.0)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        tc.scaled_softmax_forward(np.zeros((3, 4), np.int32), 1.0)
    with pytest.raises(TypeError, match="must have the type of 'y'"):
        tc.scaled_softmax_backward(np.zeros((3, 4), np.float16), np.zeros((3, 4), np.float32), 1.0)
    with pytest.raises(ValueError, match="te_softmax_scaled_aligned_causal_masked_softmax_bwd"):
        tc.scaled_aligned_causal_masked_softmax_backward(
            np.zeros((3, 4)).astype(np.float32), np.zeros((3, 4), np.float32), 1.0
        )


# ---- every backend, raw buffers ----------------------------------------------
# On the test's device (backend_checks buffers): the forward against the float64
# oracle within its bounds (which cover CUDA's expf) and against the CPU backend
# within the sum of both bounds; the backward bit for bit equal to the CPU's (same
# summation order, _rn arithmetic, no transcendental), also in place.
_DTYPE_IDS = lambda d: np.dtype(d).name  # noqa: E731


def device_softmax_forward(kind, x, mask, scale):
    dx, y = bc.DeviceArray.of(x), bc.DeviceArray(x.shape, x.dtype)
    if kind == "masked":
        dm = bc.DeviceArray.of(mask)
        lib.scaled_masked_softmax_fwd(dx.desc, dm.desc, scale, y.desc, core_device.stream())
    else:
        entry = {
            "plain": lib.scaled_softmax_fwd,
            "causal": lib.scaled_upper_triang_masked_softmax_fwd,
            "bottom_right": lib.scaled_aligned_causal_masked_softmax_fwd,
        }[kind]
        entry(dx.desc, scale, y.desc, core_device.stream())
    return y.numpy()


def assert_same_bits(got, want, what):
    """Bit for bit, except that a NaN's sign and payload may differ (x86 and the GPU make
    different NaNs from the same operation)."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{what}: NaN positions differ"
    keep = ~np.isnan(w)
    bits = lambda a: a.view(np.uint8).reshape(*a.shape, -1)[keep]  # noqa: E731
    np.testing.assert_array_equal(bits(got), bits(want), err_msg=what)


BWD_ENTRY = {
    "plain": "scaled_softmax_bwd",
    "masked": "scaled_masked_softmax_bwd",
    "causal": "scaled_upper_triang_masked_softmax_bwd",
    "bottom_right": "scaled_aligned_causal_masked_softmax_bwd",
}

# Long rows: the CUDA kernels' looped and multi-warp paths (gpu_scale: CUDA only).
LONG = [
    ("plain", (3, 16384)),
    ("masked", (2, 4, 64, 1000)),
    ("causal", (8, 512, 512)),
    ("bottom_right", (2, 8, 128, 700)),
    ("plain", (4096, 128)),
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=_DTYPE_IDS)
@pytest.mark.parametrize("case", CASES + [pytest.param(c, marks=pytest.mark.gpu_scale) for c in LONG], ids=case_id)
def test_device_softmax(device, rng, case, dtype):
    kind, shape = case
    x, mask, scale = inputs(rng, case, dtype)
    y = device_softmax_forward(kind, x, mask, scale)
    exact, bound = sref.forward(x, scale, kind, mask)
    nref.assert_within(y, exact, bound, f"{device} fwd {case_id(case)}")
    y_cpu = forward(kind, x, mask, scale)
    nref.assert_within(y, y_cpu.astype(np.float64), 2 * bound, f"{device} vs cpu fwd {case_id(case)}")

    # Backward from the CPU's y, so that both backends see the same inputs: same bits.
    dy = (rng.standard_normal(shape) * rng.choice([1e-2, 1.0, 30.0], shape)).astype(dtype)
    d_dy, d_y, d_dx = bc.DeviceArray.of(dy), bc.DeviceArray.of(y_cpu), bc.DeviceArray(shape, dtype)
    getattr(lib, BWD_ENTRY[kind])(d_dy.desc, d_y.desc, scale, d_dx.desc, core_device.stream())
    dx = d_dx.numpy()
    dx_cpu = BACKWARD[kind](dy, y_cpu, scale)
    assert_same_bits(dx, dx_cpu, f"{device} vs cpu bwd {case_id(case)}")
    # In place (dx = dy) on the device.
    getattr(lib, BWD_ENTRY[kind])(d_dy.desc, d_y.desc, scale, d_dy.desc, core_device.stream())
    assert_same_bits(d_dy.numpy(), dx_cpu, f"{device} bwd in place {case_id(case)}")


def test_device_softmax_in_place_forward(device, rng):
    x = logits(rng, (37, 300), np.float32)
    d = bc.DeviceArray.of(x)
    lib.scaled_softmax_fwd(d.desc, 0.5, d.desc, core_device.stream())
    exact, bound = sref.forward(x, 0.5)
    nref.assert_within(d.numpy(), exact, bound, "in place")
