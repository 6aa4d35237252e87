"""Activations on the CPU backend against the float64 oracle: every kind, shape
and dtype, hostile values, analytic and finite-difference derivatives; and every
backend (the `device` fixture) byte for byte against the CPU backend."""

from __future__ import annotations

import activation_device as ad
import backend_checks as bc
import core_device
import ml_dtypes
import numpy as np
import pytest
from activation_helpers import (
    assert_close_to_oracle,
    assert_same_float_bits,
    backward_bound,
    forward_bound,
    shapes_for,
    smooth_inputs,
    staged_backward,
    staged_forward,
)
from conftest import CUDA_ONLY, INPUT_DTYPES, hostile

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core import reference_activation as ra
from transformer_engine.core.activation import ACTIVATIONS

pytestmark = pytest.mark.activation

ALL = list(ra.ACTIVATIONS)
DEFAULTS = ra.params()
CANONICAL_NAN = np.uint32(0x7FC00000)


def cases():
    for kind in ALL:
        for shape in shapes_for(kind):
            yield kind, shape


@pytest.mark.parametrize("kind,shape", list(cases()))
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_forward_matches_float64_oracle(rng, kind, shape, dtype):
    x = hostile(rng, shape, dtype)
    y = tc.activation_forward(x, kind, out_dtype=np.float32)
    assert y.dtype == np.float32
    expected_shape = shape[:-1] + (shape[-1] // 2,) if kind in ra.GATED else shape
    assert y.shape == expected_shape
    assert_close_to_oracle(
        y,
        ra.forward(x, kind),
        forward_bound(kind, x, DEFAULTS),
        (staged_forward(kind, x, DEFAULTS), staged_forward(kind, x, DEFAULTS, True)),
    )


@pytest.mark.parametrize("kind,shape", list(cases()))
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_backward_matches_analytic_derivative(rng, kind, shape, dtype):
    x = hostile(rng, shape, dtype)
    out_shape = shape[:-1] + (shape[-1] // 2,) if kind in ra.GATED else shape
    g = hostile(rng, out_shape, dtype)
    d = tc.activation_backward(g, x, kind, out_dtype=np.float32).grad_input
    assert d.shape == shape and d.dtype == np.float32
    assert_close_to_oracle(
        d,
        ra.backward(g, x, kind),
        backward_bound(kind, g, x, DEFAULTS),
        (staged_backward(kind, g, x, DEFAULTS), staged_backward(kind, g, x, DEFAULTS, True)),
    )


@pytest.mark.parametrize("kind", ALL)
def test_backward_matches_float64_finite_differences(rng, kind):
    shape = (37, 64)
    x = smooth_inputs(rng, shape, kind, DEFAULTS)
    out_shape = (37, 32) if kind in ra.GATED else shape
    g = rng.standard_normal(out_shape).astype(np.float32)
    d = tc.activation_backward(g, x, kind, out_dtype=np.float32).grad_input.astype(np.float64)
    h = 1e-6
    x64 = x.astype(np.float64)
    g64 = g.astype(np.float64)
    if kind in ra.GATED:
        half = shape[-1] // 2
        fd = []
        for lo, hi in ((0, half), (half, shape[-1])):  # perturb all a's, then all b's
            step = np.zeros_like(x64)
            step[:, lo:hi] = h
            fd.append(g64 * (ra.forward(x64 + step, kind) - ra.forward(x64 - step, kind)) / (2 * h))
        fd = np.concatenate(fd, axis=-1)
    else:
        fd = g64 * (ra.forward(x64 + h, kind) - ra.forward(x64 - h, kind)) / (2 * h)
    np.testing.assert_allclose(d, fd, rtol=1e-5, atol=1e-5 * np.abs(g64).max())


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("out_dtype", [ml_dtypes.bfloat16, np.float16])
def test_low_precision_output_is_the_fp32_value_rounded_once(rng, kind, out_dtype):
    shape = (217, 256)
    x = hostile(rng, shape, np.float32)
    fp32 = tc.activation_forward(x, kind, out_dtype=np.float32)
    low = tc.activation_forward(x, kind, out_dtype=out_dtype)
    with np.errstate(over="ignore"):
        expected = fp32.astype(out_dtype)
    nan = np.isnan(fp32)
    assert_same_float_bits(low[~nan], expected[~nan])
    assert (low[nan].view(np.uint16) == 0x7FFF).all()  # canonical NaN, sign cleared

    g = hostile(rng, fp32.shape, np.float32)
    d32 = tc.activation_backward(g, x, kind, out_dtype=np.float32).grad_input
    dlow = tc.activation_backward(g, x, kind, out_dtype=out_dtype).grad_input
    with np.errstate(over="ignore"):
        expected = d32.astype(out_dtype)
    nan = np.isnan(d32)
    assert_same_float_bits(dlow[~nan], expected[~nan])


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_low_precision_input_widens_exactly(rng, kind, dtype):
    x = hostile(rng, (5, 160), dtype)
    wide = x.astype(np.float32)
    assert_same_float_bits(
        tc.activation_forward(x, kind, out_dtype=np.float32), tc.activation_forward(wide, kind, out_dtype=np.float32)
    )
    g = hostile(rng, tc.activation_forward(x, kind).shape, dtype)
    assert_same_float_bits(
        tc.activation_backward(g, x, kind, out_dtype=np.float32).grad_input,
        tc.activation_backward(g.astype(np.float32), wide, kind).grad_input,
    )


@pytest.mark.parametrize("kind", ALL)
def test_nan_results_are_canonical(rng, kind):
    x = rng.standard_normal((3, 16)).astype(np.float32)
    x[0, 0] = np.float32(-np.nan)  # a negative NaN in the activated half
    y = tc.activation_forward(x, kind)
    assert y.view(np.uint32)[0, 0] == CANONICAL_NAN
    d = tc.activation_backward(np.ones_like(y), x, kind).grad_input
    assert d.view(np.uint32)[0, 0] == CANONICAL_NAN
    # inf * 0 in a gated product (f(+inf) = inf times b = 0) is NaN too, and canonical.
    if kind in ("geglu", "reglu", "swiglu", "qgeglu", "sreglu"):
        x[1, 0], x[1, 8] = np.inf, 0.0
        assert tc.activation_forward(x, kind).view(np.uint32)[1, 0] == CANONICAL_NAN


SPECIAL = np.array([np.inf, -np.inf, 1e30, -1e30, 3e38, -3e38, 1e-45, -1e-45, 0.0, -0.0], np.float32)


@pytest.mark.parametrize("kind", ra.ACTIVATIONS[:5] + ("glu",))
def test_special_values(kind):
    """f(+inf) = +inf (sigmoid: 1), f(-inf) = -0, huge |x| saturate, tiny x stay finite."""
    x = SPECIAL if kind != "glu" else np.stack([SPECIAL, np.ones_like(SPECIAL)]).reshape(-1)
    y = tc.activation_forward(x.reshape(1, -1), kind).reshape(-1)
    base = ra.BASE[kind]
    ref = ra.f(base, SPECIAL, DEFAULTS)
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)  # srelu(1e30) overflows FP32
    np.testing.assert_allclose(y, ref32, rtol=1e-6, atol=2.0**-148)  # 1e-45 may round either way
    if base in ("gelu", "silu", "qgelu"):
        assert np.signbit(y[1]) and y[1] == 0  # f(-inf) = -0
        assert np.signbit(y[3]) and y[3] == 0  # f(-1e30) = -0
    d = tc.activation_backward(np.ones((1, y.size), np.float32), x.reshape(1, -1), kind)
    slopes = d.grad_input.reshape(-1)[: SPECIAL.size]
    with np.errstate(over="ignore"):
        ref_slopes = ra.df(base, SPECIAL, DEFAULTS).astype(np.float32)  # srelu: 2 * 3e38 = inf
    close = np.isclose(slopes, ref_slopes, rtol=1e-6, atol=1e-38)
    assert close.all(), (slopes, ref_slopes)


def test_sigmoid_tails_keep_relative_accuracy():
    """sigmoid(z) for very negative z is e^z, not 0 from 1 - (1 - e^z)."""
    z = np.array([-20.0, -50.0, -80.0, -87.0, -100.0, -103.0], np.float32)
    x = np.concatenate([z, np.ones_like(z)]).reshape(1, -1)
    y = tc.activation_forward(x, "glu").reshape(-1).astype(np.float64)
    exact = np.exp(z.astype(np.float64))
    normal = exact > 2.0**-126
    np.testing.assert_allclose(y[normal], exact[normal], rtol=4 * 2.0**-23)
    np.testing.assert_allclose(y[~normal], exact[~normal], rtol=0, atol=2.0**-149)


@pytest.mark.parametrize(
    "limit,alpha,offset", [(7.0, 1.702, 1.0), (3.0, 1.0, 0.0), (0.5, 2.5, -1.0), (np.inf, 1.702, 1.0)]
)
def test_clamped_swiglu_parameters(rng, limit, alpha, offset):
    p = ra.params(limit=limit, alpha=alpha, glu_linear_offset=offset)
    x = (rng.standard_normal((41, 96)) * 6).astype(np.float32)
    kwargs = dict(limit=limit, alpha=alpha, glu_linear_offset=offset)
    y = tc.activation_forward(x, "clamped_swiglu", **kwargs)
    assert_close_to_oracle(
        y,
        ra.forward(x, "clamped_swiglu", **p),
        forward_bound("clamped_swiglu", x, p),
        (staged_forward("clamped_swiglu", x, p), staged_forward("clamped_swiglu", x, p, True)),
    )
    g = rng.standard_normal(y.shape).astype(np.float32)
    d = tc.activation_backward(g, x, "clamped_swiglu", **kwargs).grad_input
    assert_close_to_oracle(
        d,
        ra.backward(g, x, "clamped_swiglu", **p),
        backward_bound("clamped_swiglu", g, x, p),
        (staged_backward("clamped_swiglu", g, x, p), staged_backward("clamped_swiglu", g, x, p, True)),
    )


def test_clamped_swiglu_boundaries():
    """At a == limit the slope of f is kept; above it is 0. |b| == limit passes the
    gradient, |b| > limit does not. Which half is which: a first, b second."""
    a = np.array([7.0, 7.0, 7.5, 1.0, 1.0, 1.0, 1.0], np.float32)
    b = np.array([0.0, 0.0, 0.0, 7.0, -7.0, 7.5, -7.5], np.float32)
    x = np.concatenate([a, b]).reshape(1, -1)
    y = tc.activation_forward(x, "clamped_swiglu").reshape(-1)
    swish7 = 7.0 * ra.sigmoid(1.702 * 7.0)
    np.testing.assert_allclose(y[:3], swish7 * 1.0, rtol=1e-6)  # min(a, 7), lin(0) = 0 + 1
    d = tc.activation_backward(np.ones((1, 7), np.float32), x, "clamped_swiglu").grad_input.reshape(-1)
    da, db = d[:7], d[7:]
    assert da[0] != 0 and da[1] != 0 and da[2] == 0
    np.testing.assert_array_equal(db[3:5] != 0, [True, True])
    np.testing.assert_array_equal(db[5:7], [0.0, 0.0])


def test_gated_halves_order():
    """The first half is activated, the second is the linear part."""
    x = np.array([[2.0, -3.0]], np.float32)  # a = 2, b = -3
    assert tc.activation_forward(x, "reglu")[0, 0] == np.float32(-6.0)
    x = np.array([[-3.0, 2.0]], np.float32)  # a = -3 -> relu 0
    assert tc.activation_forward(x, "reglu")[0, 0] == 0.0


def test_empty_input():
    x = np.zeros((0, 32), np.float32)
    assert tc.activation_forward(x, "swiglu").shape == (0, 16)
    r = tc.activation_backward(np.zeros((0, 16), np.float32), x, "swiglu", dbias=True)
    assert r.grad_input.shape == (0, 32)
    np.testing.assert_array_equal(r.dbias, np.zeros(32, np.float32))


def test_oracle_gelu_is_the_tanh_formula():
    """The oracle evaluates 0.5 (1 + tanh u) as sigmoid(2u); check the identity."""
    x = np.linspace(-6, 6, 1001)
    tanh_form = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(ra.forward(x, "gelu"), tanh_form, rtol=1e-12, atol=1e-15)
    h = 1e-6
    np.testing.assert_allclose(
        ra.df("gelu", x, DEFAULTS),
        (ra.forward(x + h, "gelu") - ra.forward(x - h, "gelu")) / (2 * h),
        rtol=1e-7,
        atol=1e-9,
    )


# ---- every backend, raw buffers ----------------------------------------------
# The bindings on buffers of the test's device (activation_device): every
# output equals the CPU backend's byte for byte. Inputs are hostile (NaN of
# both signs and several payloads, +-inf, subnormals, huge values), shapes odd,
# pointers aligned and off the 16-byte grid (the element-wise paths).


@pytest.mark.parametrize("out", ad.OUT_DTYPES)
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_device_forward(device, kind, dtype, out, rng_and_seed):
    rng, seed = rng_and_seed
    for shape in ad.device_shapes(kind, out):
        x = bc.make_input(shape, dtype, rng)
        for layout in ad.layouts(out):
            rowwise, columnwise = bc.LAYOUTS[layout]
            ctx = bc.ctx(seed, shape=shape, layout=layout)
            dx = bc.DeviceArray.of(x)
            o = ad.Outputs(ad.out_shape(kind, shape), out, rowwise, columnwise, amax0=0.5)
            lib.activation_fwd(ACTIVATIONS.index(kind), dx.desc, *o.args(), stream=core_device.stream(), **ad.PARAMS)
            o.check(ad.cpu_forward(x, kind, out, rowwise, columnwise, 0.5, ad.PARAMS), ctx)


@pytest.mark.parametrize("out", ad.OUT_DTYPES)
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_device_backward_with_dbias(device, kind, dtype, out, rng_and_seed):
    rng, seed = rng_and_seed
    for shape in ad.device_shapes(kind, out):
        x = bc.make_input(shape, dtype, rng)
        g = bc.make_input(ad.out_shape(kind, shape), dtype, rng)
        for i, layout in enumerate(ad.layouts(out)):
            rowwise, columnwise = bc.LAYOUTS[layout]
            # FP32 dbias everywhere; BF16 dbias and no dbias once per shape.
            extra = [np.dtype(ml_dtypes.bfloat16), None] if i == 0 else []
            for dbias_dtype in [np.dtype(np.float32)] + extra:
                ctx = bc.ctx(seed, shape=shape, layout=layout, dbias=dbias_dtype)
                ad.run_backward(kind, x, g, out, rowwise, columnwise, dbias_dtype, ad.PARAMS, ctx)


@pytest.mark.parametrize("kind", ["swiglu", "geglu", "clamped_swiglu", "gelu", "srelu"])
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("out", ["bfloat16", "e4m3"])
def test_device_unaligned_pointers(device, kind, dtype, out, rng_and_seed):
    """Pointers one element off the 16-byte grid take the element-wise paths."""
    rng, seed = rng_and_seed
    itemsize = np.dtype(dtype).itemsize
    out_item = ad.NUMPY_OUT[out].itemsize
    for shape in [(256, 192), (130, 72)]:
        x = bc.make_input(shape, dtype, rng)
        g = bc.make_input(ad.out_shape(kind, shape), dtype, rng)
        for offsets in [(itemsize, 0, 0), (0, itemsize, 0), (0, 0, out_item), (itemsize, itemsize, out_item)]:
            for layout in ad.layouts(out):
                rowwise, columnwise = bc.LAYOUTS[layout]
                ctx = bc.ctx(seed, shape=shape, offsets=offsets, layout=layout)
                ad.run_backward(kind, x, g, out, rowwise, columnwise, np.dtype(np.float32), ad.PARAMS, ctx, offsets)
                dx = bc.DeviceArray.of(x, offsets[0])
                o = ad.Outputs(ad.out_shape(kind, shape), out, rowwise, columnwise, offsets[2])
                lib.activation_fwd(
                    ACTIVATIONS.index(kind), dx.desc, *o.args(), stream=core_device.stream(), **ad.PARAMS
                )
                o.check(ad.cpu_forward(x, kind, out, rowwise, columnwise, 0.0, ad.PARAMS), ctx)


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
    for out, layout in [("float32", "rowwise"), ("e4m3", "both")]:
        rowwise, columnwise = bc.LAYOUTS[layout]
        ctx = bc.ctx(seed, out=out, **params)
        ad.run_backward("clamped_swiglu", x, g, out, rowwise, columnwise, np.dtype(np.float32), params, ctx)
        dx = bc.DeviceArray.of(x)
        o = ad.Outputs((217, 128), out, rowwise, columnwise)
        lib.activation_fwd(
            ACTIVATIONS.index("clamped_swiglu"), dx.desc, *o.args(), stream=core_device.stream(), **params
        )
        o.check(ad.cpu_forward(x, "clamped_swiglu", out, rowwise, columnwise, 0.0, params), ctx)


@pytest.mark.parametrize("out", ["bfloat16", "e5m2"])
def test_device_empty_input_writes_scale_inv_and_zero_dbias(device, out):
    x = np.zeros((0, 64), np.float32)
    g = np.zeros((0, 32), np.float32)
    rowwise, columnwise = (True, out in bc.FP8)
    ad.run_backward("swiglu", x, g, out, rowwise, columnwise, np.dtype(np.float32), ad.PARAMS, "empty")


@CUDA_ONLY
def test_cuda_dbias_workspace_is_required(device, rng_and_seed):
    rng, _ = rng_and_seed
    x = bc.DeviceArray.of(bc.make_input((100, 64), np.dtype(np.float32), rng))
    g = bc.DeviceArray.of(bc.make_input((100, 32), np.dtype(np.float32), rng))
    d, dbias = bc.DeviceArray((100, 64), np.float32), bc.DeviceArray((64,), np.float32)
    with pytest.raises(
        ValueError,
        match=r"argument 'workspace' is required: the bias gradient on "
        r"CUDA needs 512 bytes",
    ):
        lib.activation_bwd(
            ACTIVATIONS.index("swiglu"),
            g.desc,
            x.desc,
            d.desc,
            None,
            None,
            None,
            None,
            dbias.desc,
            None,
            stream=core_device.stream(),
        )
    small = bc.DeviceArray((511,), np.uint8)
    with pytest.raises(ValueError, match="argument 'workspace' must hold at least 512 bytes, got 511"):
        lib.activation_bwd(
            ACTIVATIONS.index("swiglu"),
            g.desc,
            x.desc,
            d.desc,
            None,
            None,
            None,
            None,
            dbias.desc,
            small.desc,
            stream=core_device.stream(),
        )


@CUDA_ONLY
def test_cuda_graph_capture(device, rng_and_seed):
    """Forward and backward (bc.FP8, columnwise, dbias) captured in a graph and
    replayed: no host synchronization or allocation inside the calls."""
    torch = pytest.importorskip("torch")
    rng, seed = rng_and_seed
    kind = ACTIVATIONS.index("swiglu")
    x_np = bc.make_input((512, 1024), np.dtype(ml_dtypes.bfloat16), rng)
    g_np = bc.make_input((512, 512), np.dtype(ml_dtypes.bfloat16), rng)
    x, g = bc.DeviceArray.of(x_np), bc.DeviceArray.of(g_np)
    y = ad.Outputs((512, 512), "e4m3", True, True)
    d = ad.Outputs((512, 1024), "e5m2", True, True)
    dbias = bc.DeviceArray((1024,), np.float32)
    workspace = bc.DeviceArray((lib.activation_bwd_workspace_size(x.desc, True),), np.uint8)
    core_device.sync()  # the inputs' copies are done before the capture starts
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s = torch.cuda.current_stream().cuda_stream  # the capture stream
        lib.activation_fwd(kind, x.desc, *y.args(), stream=s)
        lib.activation_bwd(kind, g.desc, x.desc, *d.args(), dbias.desc, workspace.desc, stream=s)
    graph.replay()
    core_device.sync()
    ctx = bc.ctx(seed, graph=True)
    y.check(ad.cpu_forward(x_np, "swiglu", "e4m3", True, True, 0.0, ad.PARAMS), ctx)
    want, want_dbias = ad.cpu_backward(g_np, x_np, "swiglu", "e5m2", True, True, np.float32, ad.PARAMS)
    d.check(want, ctx)
    bc.assert_same_bytes(dbias.numpy(), want_dbias, "dbias", ctx)
