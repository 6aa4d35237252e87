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

import activation_device as ad
import backend_checks as bc
import core_device
import ml_dtypes
import numpy as np
import pytest
from activation_helpers import assert_same_float_bits, shapes_for
from conftest import FP8_FORMATS, hostile

import transformer_engine.core as tc
from transformer_engine.core import reference as ref
from transformer_engine.core import reference_activation as ra
from transformer_engine.core._arrays import desc
from transformer_engine.core.activation import ACTIVATIONS

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


# ---- every backend, raw buffers ----------------------------------------------
# The CUDA backend fuses the forward output's FP8 columnwise copy into the
# backward's tile kernel (and takes that kernel even for a high-precision
# grad_input); the CPU backend is the composition of the backward and the
# forward. On the test's device (activation_device) every output equals the
# CPU backend's byte for byte: grad_input (FP8 rowwise / columnwise, or
# FP32/BF16/FP16), its amax and scale_inv, dbias, fwd_columnwise and
# fwd_scale_inv. Inputs hostile, shapes ragged against the 128 x 64 tiles,
# pointers aligned and off the grid.

# grad_input's (type, rowwise, columnwise): bc.FP8 with and without its own
# columnwise copy, bc.FP8 columnwise only, and high precision.
DEVICE_GRAD_OUTPUTS = [
    ("e4m3", True, True),
    ("e5m2", True, False),
    ("e4m3", False, True),
    ("bfloat16", True, False),
    ("float32", True, False),
    ("float16", True, False),
]
FWD_SCALE = {"e4m3": 2.5, "e5m2": 0.125}
# fwd_values_dtype: the forward values quantized as they are (delayed scaling) or
# rounded to BF16/FP16 first (current scaling quantizes the stored output).
VALUES = {
    "fp32": int(tc.DType.kFloat32),
    "bf16": int(tc.DType.kBFloat16),
    "fp16": int(tc.DType.kFloat16),
}


def cpu_fused(g, x, kind, out, rowwise, columnwise, dbias_dtype, fwd_fmt, values, params):
    """The CPU backend's outputs: ((grad_input result, amax), dbias, fwd_columnwise, fwd_scale_inv)."""
    o = ad.CpuOutputs(x.shape, out, rowwise, columnwise, 0.0)
    dbias = np.zeros(x.shape[-1], dbias_dtype) if dbias_dtype is not None else None
    rows, cols = bc.matrix(ad.out_shape(kind, x.shape))
    fwd_col = np.zeros((cols, rows), bc.FP8[fwd_fmt])
    fwd_scale = np.array(FWD_SCALE[fwd_fmt], np.float32)
    fwd_scale_inv = np.zeros((), np.float32)
    d = desc
    lib.activation_bwd_with_fwd_columnwise(
        ACTIVATIONS.index(kind),
        d(g),
        d(x),
        *o.args(),
        None if dbias is None else d(dbias),
        None,
        d(fwd_col),
        d(fwd_scale),
        d(fwd_scale_inv),
        VALUES[values],
        **params,
    )
    return (o.result(), o.amax), dbias, fwd_col, fwd_scale_inv


def run_fused(
    kind, x, g, out, rowwise, columnwise, dbias_dtype, fwd_fmt, params, ctx, offsets=(0, 0, 0, 0), values="fp32"
):
    """The call on the test's device (x, g, grad_input and fwd_columnwise at byte offsets) against the CPU backend."""
    dx, dg = bc.DeviceArray.of(x, offsets[0]), bc.DeviceArray.of(g, offsets[1])
    o = ad.Outputs(x.shape, out, rowwise, columnwise, offsets[2])
    dbias = bc.DeviceArray((x.shape[-1],), dbias_dtype) if dbias_dtype is not None else None
    size = lib.activation_bwd_workspace_size(dx.desc, dbias is not None)
    workspace = bc.DeviceArray((size,), np.uint8) if size else None
    rows, cols = bc.matrix(ad.out_shape(kind, x.shape))
    fwd_col = bc.DeviceArray((cols, rows), bc.FP8[fwd_fmt], offsets[3])
    fwd_scale, fwd_scale_inv = bc.scalar(FWD_SCALE[fwd_fmt]), bc.scalar(-1.0)
    lib.activation_bwd_with_fwd_columnwise(
        ACTIVATIONS.index(kind),
        dg.desc,
        dx.desc,
        *o.args(),
        bc.desc_or_none(dbias),
        bc.desc_or_none(workspace),
        fwd_col.desc,
        fwd_scale.desc,
        fwd_scale_inv.desc,
        VALUES[values],
        stream=core_device.stream(),
        **params,
    )
    want, want_dbias, want_col, want_scale_inv = cpu_fused(
        g, x, kind, out, rowwise, columnwise, dbias_dtype, fwd_fmt, values, params
    )
    o.check(want, ctx)
    if dbias is not None:
        bc.assert_same_bytes(dbias.numpy(), want_dbias, "dbias", ctx)
    bc.assert_same_bytes(fwd_col.numpy(), want_col, "fwd_columnwise", ctx)
    bc.assert_same_bytes(fwd_scale_inv.numpy(), want_scale_inv, "fwd_scale_inv", ctx)


@pytest.mark.parametrize("grad_out", DEVICE_GRAD_OUTPUTS, ids=lambda o: f"{o[0]}-r{int(o[1])}c{int(o[2])}")
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_device_fused_matches_cpu(device, kind, dtype, grad_out, rng_and_seed):
    rng, seed = rng_and_seed
    out, rowwise, columnwise = grad_out
    for i, shape in enumerate(ad.device_shapes(kind, out)):
        x = bc.make_input(shape, dtype, rng)
        g = bc.make_input(ad.out_shape(kind, shape), dtype, rng)
        fwd_fmt = "e4m3" if i % 2 == 0 else "e5m2"
        # FP32 dbias, BF16 dbias and none, in turn.
        dbias_dtype = [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), None][i % 3]
        values = ["fp32", "bf16", "fp16"][(i + 1) % 3]
        ctx = bc.ctx(seed, shape=shape, fwd=fwd_fmt, dbias=dbias_dtype, values=values)
        run_fused(kind, x, g, out, rowwise, columnwise, dbias_dtype, fwd_fmt, ad.PARAMS, ctx, values=values)


@pytest.mark.parametrize("kind", ["swiglu", "gelu"])
@pytest.mark.parametrize("out", ["bfloat16", "e4m3"])
@pytest.mark.gpu_scale
def test_device_large(device, kind, out, rng_and_seed):
    """The LayerNormMLP shape family: 8192 rows, 2 x 1024 columns (many full tiles)."""
    rng, seed = rng_and_seed
    dtype = np.dtype(ml_dtypes.bfloat16)
    shape = (8192, 2048)
    x = bc.make_input(shape, dtype, rng, "finite")
    g = bc.make_input(ad.out_shape(kind, shape), dtype, rng, "finite")
    fp8 = out in bc.FP8
    for values in ("fp32", "bf16"):
        ctx = bc.ctx(seed, large=True, values=values)
        run_fused(kind, x, g, out, True, fp8, np.dtype(np.float32), "e4m3", ad.PARAMS, ctx, values=values)


@pytest.mark.parametrize("kind", ["swiglu", "clamped_swiglu", "srelu"])
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("out", ["bfloat16", "float32", "e4m3"])
def test_device_unaligned_pointers(device, kind, dtype, out, rng_and_seed):
    """Pointers off the 16-byte grid: element-wise loads and stores, narrow columnwise stores."""
    rng, seed = rng_and_seed
    item, out_item = np.dtype(dtype).itemsize, ad.NUMPY_OUT[out].itemsize
    for shape in [(256, 192), (130, 72), *([(1000, 128)] if core_device.current() == "cuda" else [])]:
        x = bc.make_input(shape, dtype, rng)
        g = bc.make_input(ad.out_shape(kind, shape), dtype, rng)
        for offsets in [(item, 0, 0, 0), (0, item, 0, 0), (0, 0, out_item, 0), (0, 0, 0, 1), (0, 0, 0, 8)]:
            ctx = bc.ctx(seed, shape=shape, offsets=offsets)
            values = "bf16" if offsets[3] else "fp32"
            run_fused(
                kind, x, g, out, True, out in bc.FP8, np.dtype(np.float32), "e5m2", ad.PARAMS, ctx, offsets, values
            )


@pytest.mark.parametrize(
    "params",
    [
        dict(limit=3.0, alpha=1.0, glu_linear_offset=0.0),
        dict(limit=0.5, alpha=2.5, glu_linear_offset=-1.0),
        dict(limit=float("inf"), alpha=1.702, glu_linear_offset=1.0),
    ],
)
def test_device_clamped_swiglu_parameters(device, params, rng_and_seed):
    rng, seed = rng_and_seed
    x = bc.make_input((217, 256), np.dtype(np.float32), rng)
    g = bc.make_input((217, 128), np.dtype(np.float32), rng)
    for out, rowwise, columnwise in [("float32", True, False), ("e4m3", True, True)]:
        ctx = bc.ctx(seed, out=out, **params)
        run_fused("clamped_swiglu", x, g, out, rowwise, columnwise, np.dtype(np.float32), "e4m3", params, ctx)


@pytest.mark.parametrize("out", ["bfloat16", "e5m2"])
def test_device_empty_input_writes_the_scales(device, out):
    x = np.zeros((0, 64), np.float32)
    g = np.zeros((0, 32), np.float32)
    run_fused("swiglu", x, g, out, True, out in bc.FP8, np.dtype(np.float32), "e4m3", ad.PARAMS, "empty")
