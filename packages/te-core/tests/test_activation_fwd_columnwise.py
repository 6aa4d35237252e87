"""te_activation_bwd_with_fwd_columnwise on the CPU backend: the activation
backward that also writes the forward output's FP8 columnwise copy.

Its outputs must be, byte for byte, those of the two calls it fuses: the
backward's (grad_input of every type, its columnwise copy, amax, scale_inv,
dbias) from te_activation_bwd, and fwd_columnwise / fwd_scale_inv from
te_activation_fwd(output=NULL, columnwise=...) -- or, with fwd_values_dtype
BF16/FP16, quantize_fp8 of te_activation_fwd's output of that type. The
forward bytes are also checked against an independent quantization of the
FP32 forward values (rounded to fwd_values_dtype first).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from activation_helpers import assert_same_float_bits, shapes_for
from conftest import FP8_FORMATS, hostile

import transformer_engine.core as tc
from transformer_engine.core import reference as ref
from transformer_engine.core import reference_activation as ra
from transformer_engine.core._arrays import desc

pytestmark = pytest.mark.activation

lib = tc.lib
ALL = list(ra.ACTIVATIONS)
FP8_NUMPY = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
# grad_input's type and layout: FP8 with / without its own columnwise copy, FP8
# columnwise only, or high precision (with the stored-value amax).
GRAD_OUTPUTS = [
    ("e4m3", True, True),
    ("e5m2", True, False),
    ("e4m3", False, True),
    ("float32", True, False),
    ("bfloat16", True, False),
    ("float16", True, False),
]


def u8(a):
    return np.asarray(a).view(np.uint8)


def out_shape(kind, shape):
    return shape[:-1] + (shape[-1] // 2,) if kind in ra.GATED else shape


def grad_kwargs(out, rowwise, columnwise, scale):
    fp8 = out in FP8_NUMPY
    dtype = out if fp8 else np.dtype(ml_dtypes.bfloat16 if out == "bfloat16" else out)
    kw = {"out_dtype": dtype, "rowwise": rowwise, "columnwise": columnwise}
    if fp8:
        kw["scale"] = scale
    kw["amax"] = np.float32(0.25)
    return kw


def assert_same_result(fused, separate):
    """Every field of two activation_backward results, bit for bit."""
    a, b = fused.grad_input, separate.grad_input
    if isinstance(a, np.ndarray):
        a, b = (a,), (b,)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert (x is None) == (y is None), i
        if x is not None:
            np.testing.assert_array_equal(u8(np.ascontiguousarray(x)), u8(np.ascontiguousarray(y)), err_msg=str(i))
    assert (fused.dbias is None) == (separate.dbias is None)
    if fused.dbias is not None:
        assert_same_float_bits(fused.dbias, separate.dbias)


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("fwd_fmt", FP8_FORMATS)
@pytest.mark.parametrize("grad_out", GRAD_OUTPUTS, ids=lambda o: f"{o[0]}-r{int(o[1])}c{int(o[2])}")
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_fused_equals_backward_then_forward(rng, kind, fwd_fmt, grad_out, dtype):
    out, rowwise, columnwise = grad_out
    for i, shape in enumerate(shapes_for(kind)):
        x = hostile(rng, shape, dtype, fwd_fmt)  # NaN and +-inf included
        g = hostile(rng, out_shape(kind, shape), dtype, fwd_fmt)
        scale = np.float32(rng.choice([1.0, 0.5, 64.0]))
        fwd_scale = np.float32(rng.choice([1.0, 0.37, 8.0, 448.0]))
        kw = grad_kwargs(out, rowwise, columnwise, scale)
        dbias = i % 2 == 0  # with and without the bias gradient
        fused = tc.activation_backward(g, x, kind, dbias=dbias, fwd_columnwise=fwd_fmt, fwd_scale=fwd_scale, **kw)
        separate = tc.activation_backward(g, x, kind, dbias=dbias, **kw)
        assert_same_result(fused, separate)
        fwd = tc.activation_forward(x, kind, out_dtype=fwd_fmt, scale=fwd_scale, rowwise=False, columnwise=True)
        np.testing.assert_array_equal(u8(fused.fwd_columnwise.columnwise), u8(fwd.columnwise))
        assert fused.fwd_columnwise.scale_inv == fwd.scale_inv == np.float32(1) / fwd_scale
        # Independently: the FP32 forward values quantized, then transposed.
        values = tc.activation_forward(x, kind, out_dtype=np.float32)
        expected = ref.columnwise(ref.quantize_fp8(values, fwd_scale, fwd_fmt))
        np.testing.assert_array_equal(u8(fused.fwd_columnwise.columnwise), expected)


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("values", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_forward_values_rounded_first(rng, kind, values, dtype):
    """fwd_values_dtype BF16/FP16: the bytes of quantizing the forward output
    stored in that type (how current scaling quantizes it)."""
    for i, shape in enumerate(shapes_for(kind)):
        fmt = FP8_FORMATS[i % 2]
        x = hostile(rng, shape, dtype, fmt)
        g = hostile(rng, out_shape(kind, shape), dtype, fmt)
        fwd_scale = np.float32(rng.choice([1.0, 0.37, 8.0, 448.0]))
        kw = {"out_dtype": "e4m3", "scale": 2.0, "columnwise": True, "dbias": True}
        fused = tc.activation_backward(
            g, x, kind, fwd_columnwise=fmt, fwd_scale=fwd_scale, fwd_values_dtype=values, **kw
        )
        assert_same_result(fused, tc.activation_backward(g, x, kind, **kw))
        stored = tc.activation_forward(x, kind, out_dtype=values)
        q = tc.quantize_fp8(stored, fwd_scale, fmt, rowwise=False, columnwise=True)
        np.testing.assert_array_equal(u8(fused.fwd_columnwise.columnwise), u8(q.columnwise))
        assert fused.fwd_columnwise.scale_inv == np.float32(1) / fwd_scale
        expected = ref.columnwise(ref.quantize_fp8(stored.astype(np.float32), fwd_scale, fmt))
        np.testing.assert_array_equal(u8(fused.fwd_columnwise.columnwise), expected)


@pytest.mark.parametrize(
    "params",
    [dict(limit=3.0, alpha=1.0, glu_linear_offset=0.0), dict(limit=0.5, alpha=2.5, glu_linear_offset=-1.0)],
)
def test_clamped_swiglu_parameters(rng, params):
    x = hostile(rng, (217, 256), np.float32)
    g = hostile(rng, (217, 128), np.float32)
    kw = dict(out_dtype="e4m3", scale=2.0, columnwise=True, dbias=True, **params)
    fused = tc.activation_backward(g, x, "clamped_swiglu", fwd_columnwise="e4m3", fwd_scale=3.0, **kw)
    assert_same_result(fused, tc.activation_backward(g, x, "clamped_swiglu", **kw))
    fwd = tc.activation_forward(
        x, "clamped_swiglu", out_dtype="e4m3", scale=3.0, rowwise=False, columnwise=True, **params
    )
    np.testing.assert_array_equal(u8(fused.fwd_columnwise.columnwise), u8(fwd.columnwise))


@pytest.mark.parametrize("rows", [0, 1, 63, 65, 300])
def test_row_counts(rng, rows):
    x = hostile(rng, (rows, 96), np.float32)
    g = hostile(rng, (rows, 48), np.float32)
    fused = tc.activation_backward(g, x, "swiglu", dbias=True, fwd_columnwise="e5m2", fwd_scale=0.25)
    assert fused.fwd_columnwise.columnwise.shape == (48, rows)
    assert_same_result(fused, tc.activation_backward(g, x, "swiglu", dbias=True))
    fwd = tc.activation_forward(x, "swiglu", out_dtype="e5m2", scale=0.25, rowwise=False, columnwise=True)
    np.testing.assert_array_equal(u8(fused.fwd_columnwise.columnwise), u8(fwd.columnwise))


def test_fwd_scale_inv_is_optional_in_the_c_api(rng):
    x, g = hostile(rng, (5, 32), np.float32), hostile(rng, (5, 16), np.float32)
    d = np.zeros((5, 32), np.float32)
    col = np.zeros((16, 5), ml_dtypes.float8_e4m3fn)
    lib.activation_bwd_with_fwd_columnwise(
        code("swiglu"), desc(g), desc(x), desc(d), fwd_columnwise=desc(col), fwd_scale=desc(fp32())
    )
    np.testing.assert_array_equal(d, tc.activation_backward(g, x, "swiglu").grad_input)
    fwd = tc.activation_forward(x, "swiglu", out_dtype="e4m3", scale=1.0, rowwise=False, columnwise=True)
    np.testing.assert_array_equal(u8(col), u8(fwd.columnwise))


# ---- errors ---------------------------------------------------------------


def fp32(*shape):
    return np.ones(shape, np.float32)


def code(kind):
    return tc.ACTIVATIONS.index(kind)


def fused_call(x, g, fwd_columnwise, fwd_scale, fwd_scale_inv=None, kind="swiglu"):
    lib.activation_bwd_with_fwd_columnwise(
        code(kind),
        desc(g),
        desc(x),
        desc(fp32(*x.shape)),
        fwd_columnwise=None if fwd_columnwise is None else desc(fwd_columnwise),
        fwd_scale=None if fwd_scale is None else desc(fwd_scale),
        fwd_scale_inv=None if fwd_scale_inv is None else desc(fwd_scale_inv),
    )


def test_error_messages():
    x, g = fp32(6, 32), fp32(6, 16)
    col = np.zeros((16, 6), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="argument 'fwd_columnwise' is required"):
        fused_call(x, g, None, fp32())
    with pytest.raises(TypeError, match="argument 'fwd_columnwise' must be float8_e4m3 or float8_e5m2, got float32"):
        fused_call(x, g, fp32(16, 6), fp32())
    with pytest.raises(
        ValueError,
        match=r"argument 'fwd_columnwise' must have shape \[16, 6\] \(the swiglu output \[6, 16\] transposed\), "
        r"got \[6, 16\]",
    ):
        fused_call(x, g, col.T.copy(), fp32())
    with pytest.raises(
        ValueError, match=r"argument 'fwd_columnwise' must have shape \[32, 6\] \(the gelu output \[6, 32\]"
    ):
        fused_call(x, fp32(6, 32), col, fp32(), kind="gelu")
    with pytest.raises(ValueError, match="argument 'fwd_scale' is required: 'fwd_columnwise' is quantized with it"):
        fused_call(x, g, col, None)
    with pytest.raises(ValueError, match=r"argument 'fwd_scale' must have 1 element\(s\), got shape \[2\]"):
        fused_call(x, g, col, fp32(2))
    with pytest.raises(ValueError, match=r"argument 'fwd_scale_inv' must have 1 element\(s\), got shape \[3\]"):
        fused_call(x, g, col, fp32(), fp32(3))
    # The backward's own arguments keep their checks and messages.
    with pytest.raises(ValueError, match=r"argument 'grad' must have shape \[6, 16\]"):
        fused_call(x, fp32(6, 32), col, fp32())


def test_numpy_level_errors():
    x, g = fp32(6, 32), fp32(6, 16)
    with pytest.raises(ValueError, match="'fwd_columnwise' needs 'fwd_scale'"):
        tc.activation_backward(g, x, "swiglu", fwd_columnwise="e4m3")
    with pytest.raises(ValueError, match="'fwd_scale' is only used with 'fwd_columnwise'"):
        tc.activation_backward(g, x, "swiglu", fwd_scale=1.0)
    with pytest.raises(TypeError, match="argument 'fwd_values_dtype' must be float32, bfloat16 or float16"):
        tc.activation_backward(g, x, "swiglu", fwd_columnwise="e4m3", fwd_scale=1.0, fwd_values_dtype="e4m3")
    with pytest.raises(ValueError, match=r"'fwd_columnwise' must be an FP8 dtype \('e4m3' or 'e5m2'\)"):
        tc.activation_backward(g, x, "swiglu", fwd_columnwise=np.float32, fwd_scale=1.0)
