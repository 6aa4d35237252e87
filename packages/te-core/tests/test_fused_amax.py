"""The amax of a high-precision output, fused into the kernel that writes it
(te_activation_fwd / _bwd, te_layernorm_fwd / te_rmsnorm_fwd): the max |value|
of the output AS STORED (rounded to its type, NaN skipped), max-accumulated
into the caller's amax, so current scaling needs no separate amax pass.

The oracle: the FP32 result of the same op (checked against float64 in the
op's own tests) rounded by ml_dtypes to the output type, then reference.amax.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from activation_helpers import shapes_for
from conftest import INPUT_DTYPES, hostile
from norm_inputs import FLOAT_DTYPES, NORM_SHAPES, norm_input, weights

import transformer_engine.core as tc
from transformer_engine.core import reference as ref
from transformer_engine.core import reference_activation as ra
from transformer_engine.core._arrays import desc

pytestmark = [pytest.mark.activation, pytest.mark.norm]

HIGH = [np.float32, ml_dtypes.bfloat16, np.float16]
START = [0.0, 0.75, 1e30]
# (kind, input dtype, output dtype)
ACT_CASES = pytest.mark.parametrize(
    "kind,in_dtype,out_dtype", list(itertools.product(ra.ACTIVATIONS, INPUT_DTYPES, HIGH))
)


def oracle_amax(start, fp32_values, out_dtype):
    """max(start, amax of the FP32 values rounded to out_dtype)."""
    with np.errstate(over="ignore"):
        stored = np.asarray(fp32_values, np.float32).astype(out_dtype)
    return max(np.float32(start), ref.amax(stored))


@ACT_CASES
def test_activation_forward_amax_is_that_of_the_stored_output(rng, kind, in_dtype, out_dtype):
    for shape in shapes_for(kind):
        x = hostile(rng, shape, in_dtype)
        start = np.float32(rng.choice(START))
        fp32 = tc.activation_forward(x, kind, out_dtype=np.float32)
        out = tc.activation_forward(x, kind, out_dtype=out_dtype, amax=start)
        assert isinstance(out, tc.HighPrecisionOutput)
        plain = tc.activation_forward(x, kind, out_dtype=out_dtype)
        np.testing.assert_array_equal(out.values.view(np.uint8), plain.view(np.uint8))
        assert out.amax == oracle_amax(start, fp32, out_dtype), (kind, shape)
        assert out.amax == max(start, ref.amax(out.values))


@ACT_CASES
def test_activation_backward_amax_is_that_of_the_stored_grad_input(rng, kind, in_dtype, out_dtype):
    for shape in shapes_for(kind):
        x = hostile(rng, shape, in_dtype)
        out_shape = shape[:-1] + (shape[-1] // 2,) if kind in ra.GATED else shape
        g = hostile(rng, out_shape, in_dtype)
        start = np.float32(rng.choice(START))
        fp32 = tc.activation_backward(g, x, kind, out_dtype=np.float32).grad_input
        res = tc.activation_backward(g, x, kind, out_dtype=out_dtype, amax=start, dbias=True)
        plain = tc.activation_backward(g, x, kind, out_dtype=out_dtype, dbias=True)
        np.testing.assert_array_equal(res.grad_input.values.view(np.uint8), plain.grad_input.view(np.uint8))
        np.testing.assert_array_equal(res.dbias, plain.dbias)
        assert res.grad_input.amax == oracle_amax(start, fp32, out_dtype), (kind, shape)


def test_activation_amax_rounds_like_the_stored_value():
    """relu passes positive FP32 inputs through: the amax is the rounded maximum, not the
    FP32 one (1 + 2^-8 + 2^-20 rounds up in BF16; 65519 rounds down and 65520 overflows
    in FP16)."""
    x = np.array([[0.5, 1 + 2**-8 + 2**-20, -0.25, np.nan]], np.float32)
    out = tc.activation_forward(x, "relu", out_dtype=ml_dtypes.bfloat16, amax=0.0)
    assert out.amax == np.float32(1 + 2**-7)
    assert tc.activation_forward(x, "relu", amax=0.0).amax == x[0, 1]  # FP32: unchanged
    fp16 = tc.activation_forward(np.array([[65519.0, 1.0]], np.float32), "relu", out_dtype=np.float16, amax=0.0)
    assert fp16.amax == np.float32(65504.0)
    over = tc.activation_forward(np.array([[65520.0]], np.float32), "relu", out_dtype=np.float16, amax=0.0)
    assert over.amax == np.inf
    nan_only = tc.activation_forward(np.full((2, 3), np.nan, np.float32), "relu", out_dtype=np.float16, amax=0.0)
    assert nan_only.amax == 0.0


def test_activation_fp8_amax_stays_that_of_the_unrounded_values():
    x = np.array([[1 + 2**-8 + 2**-20, 0.5]], np.float32)
    q = tc.activation_forward(x, "relu", out_dtype="e4m3", scale=1.0, amax=0.0)
    assert q.amax == x[0, 0]


def norm(layernorm, x, gamma, beta, zcg, out_dtype, amax):
    if layernorm:
        return tc.layernorm_fwd(x, gamma, beta, 1e-5, zero_centered_gamma=zcg, out_dtype=out_dtype, amax=amax)
    return tc.rmsnorm_fwd(x, gamma, 1e-5, zero_centered_gamma=zcg, out_dtype=out_dtype, amax=amax)


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("out_dtype", HIGH)
def test_norm_y_amax_is_that_of_the_stored_y(rng, layernorm, x_dtype, out_dtype):
    for shape in NORM_SHAPES + [(7, 33), (1, 1)]:
        x = norm_input(rng, shape, x_dtype)
        gamma, beta = weights(rng, shape[-1], np.dtype(x_dtype))
        if shape[-1] > 2:
            gamma[0] = 3e4  # |y| beyond FP16's range in some rows: rounds to inf there
        zcg = bool(rng.integers(2))
        start = np.float32(rng.choice(START))
        fp32 = norm(layernorm, x, gamma, beta, zcg, np.float32, None).y
        out = norm(layernorm, x, gamma, beta, zcg, out_dtype, start)
        plain = norm(layernorm, x, gamma, beta, zcg, out_dtype, None)
        assert plain.amax is None
        np.testing.assert_array_equal(out.y.view(np.uint8), plain.y.view(np.uint8))
        assert out.amax == oracle_amax(start, fp32, out_dtype), (shape, out.amax)
        assert out.amax == max(start, ref.amax(out.y))


def test_norm_y_amax_argument_checks():
    x, g, b = np.ones((4, 16), np.float32), np.ones(16, np.float32), np.zeros(16, np.float32)
    y = np.empty_like(x)
    with pytest.raises(ValueError, match="argument 'y_amax' must have 1 element"):
        tc.lib.layernorm_fwd(
            desc(x), desc(g), desc(b), 1e-5, False, desc(y), None, None, desc(np.zeros(2, np.float32)), None, None
        )
    with pytest.raises(
        ValueError, match="arguments 'y_scale' and 'y_scale_inv' are only for an FP8 'y'; 'y' is float32"
    ):
        tc.lib.layernorm_fwd(
            desc(x), desc(g), desc(b), 1e-5, False, desc(y), desc(np.ones((), np.float32)), None, None, None, None
        )
