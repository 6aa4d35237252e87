"""The activation family's CUDA backend against its CPU backend: identical bytes.

Both backends evaluate the same FP32 operations (functions.h: every operation
rounded once, the core's own exp, one canonical NaN), so every output is
compared byte for byte: FP32/BF16/FP16 values, FP8 bytes (rowwise and the
transposed columnwise copy), amax, scale_inv and the bias gradient, whose
summation order is specified. Inputs are hostile (NaN of both signs and several
payloads, +-inf, subnormals, huge values), shapes odd, and pointers both
aligned and off the 16-byte grid (the element-wise paths).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_cuda_backends import (  # noqa: E402  (the shared GPU test helpers)
    FP8,
    INPUT_DTYPES,
    DeviceArray,
    _ctx,
    _desc,
    _stream,
    assert_same_bytes,
    make_input,
    scalar,
)

import transformer_engine.core as te_core  # noqa: E402
from transformer_engine.core import lib  # noqa: E402
from transformer_engine.core._arrays import desc as host_desc  # noqa: E402
from transformer_engine.core.activation import ACTIVATIONS, GATED_ACTIVATIONS  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.activation]

PLAIN = [k for k in ACTIVATIONS if k not in GATED_ACTIVATIONS]
GATED = [k for k in ACTIVATIONS if k in GATED_ACTIVATIONS]
# Gated shapes: last dim 2H. H % 8 == 0 takes the 16-byte paths; H = 500, 36,
# 12, 1 the element-wise ones; 217, 300, 4100 rows leave ragged 64-row chunks
# and 128-row tiles; (2, 3, 5, 64) is 4-D.
GATED_SHAPES = [(1, 16), (5, 160), (217, 256), (2, 3, 5, 64), (300, 1000), (130, 72), (64, 24), (33, 2), (4100, 512)]
PLAIN_SHAPES = [(1, 16), (5, 160), (217, 256), (2, 3, 5, 64), (7,), (3, 1), (33, 17), (1000, 1000), (4100, 256)]
OUT_DTYPES = ["float32", "bfloat16", "float16", "e4m3", "e5m2"]
NUMPY_OUT = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    **FP8,
}
PARAMS = {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0}


@pytest.fixture
def rng_and_seed():
    seed = int(np.random.SeedSequence().entropy % (2**32))  # printed in failure messages
    return np.random.default_rng(seed), seed


@pytest.fixture(autouse=True)
def _require_cuda():
    if not (torch.cuda.is_available() and te_core.built_with_cuda()):
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")


def shapes_for(kind, out):
    """The shapes of a kind; the large one (many blocks) only for BF16 and E4M3 outputs."""
    all_shapes = GATED_SHAPES if kind in GATED_ACTIVATIONS else PLAIN_SHAPES
    return [s for s in all_shapes if s[0] < 4000 or out in ("bfloat16", "e4m3")]


def out_shape(kind, shape):
    return shape[:-1] + (shape[-1] // 2,) if kind in GATED_ACTIVATIONS else shape


def matrix(shape):
    cols = shape[-1]
    return int(np.prod(shape)) // cols if cols else 0, cols


class Outputs:
    """Device outputs of one call: rowwise (any type) and/or columnwise FP8, scalars."""

    def __init__(self, shape, out: str, rowwise=True, columnwise=False, offset=0, amax0=0.0):
        fp8 = out in FP8
        rows, cols = matrix(shape)
        self.row = DeviceArray(shape, NUMPY_OUT[out], offset) if rowwise else None
        self.col = DeviceArray((cols, rows), NUMPY_OUT[out], offset) if columnwise else None
        self.scale = scalar(0.37 if out == "e4m3" else 64.0) if fp8 else None
        self.scale_inv = scalar(-1.0) if fp8 else None
        self.amax = scalar(amax0)

    def args(self):
        return (_desc(self.row), _desc(self.col), _desc(self.scale), _desc(self.scale_inv), self.amax.desc)

    def check(self, want, ctx: str):
        """want: the CPU result (ndarray or Fp8Tensor) and the CPU amax."""
        result, amax = want
        if self.scale is None:
            assert_same_bytes(self.row.numpy(), result, "output", ctx)
        else:
            if self.row is not None:
                assert_same_bytes(self.row.numpy(), result.rowwise, "rowwise", ctx)
            if self.col is not None:
                assert_same_bytes(self.col.numpy(), result.columnwise, "columnwise", ctx)
            assert_same_bytes(self.scale_inv.numpy(), result.scale_inv, "scale_inv", ctx)
        assert_same_bytes(self.amax.numpy(), amax, "amax", ctx)


def cpu_forward(x, kind, out, rowwise, columnwise, amax0, params):
    """The CPU backend through the C binding (amax works for every output type)."""
    o = CpuOutputs(out_shape(kind, x.shape), out, rowwise, columnwise, amax0)
    lib.activation_fwd(ACTIVATIONS.index(kind), host_desc(x), *o.args(), **params)
    return o.result(), o.amax


def cpu_backward(g, x, kind, out, rowwise, columnwise, dbias_dtype, params):
    o = CpuOutputs(x.shape, out, rowwise, columnwise, 0.0)
    dbias = np.zeros(x.shape[-1], dbias_dtype) if dbias_dtype is not None else None
    d = host_desc
    lib.activation_bwd(
        ACTIVATIONS.index(kind), d(g), d(x), *o.args(), None if dbias is None else d(dbias), None, **params
    )
    return (o.result(), o.amax), dbias


class CpuOutputs:
    def __init__(self, shape, out, rowwise, columnwise, amax0):
        fp8 = out in FP8
        rows, cols = matrix(shape)
        self.row = np.zeros(shape, NUMPY_OUT[out]) if rowwise else None
        self.col = np.zeros((cols, rows), NUMPY_OUT[out]) if columnwise else None
        self.scale = np.array(0.37 if out == "e4m3" else 64.0, np.float32) if fp8 else None
        self.scale_inv = np.zeros((), np.float32) if fp8 else None
        self.amax = np.array(amax0, np.float32)

    def args(self):
        return tuple(
            None if a is None else host_desc(a) for a in (self.row, self.col, self.scale, self.scale_inv, self.amax)
        )

    def result(self):
        if self.scale is None:
            return self.row
        return te_core.Fp8Tensor(self.row, self.col, self.scale, self.scale_inv, self.amax)


LAYOUTS = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}


def layouts(out):
    return list(LAYOUTS) if out in FP8 else ["rowwise"]


@pytest.mark.parametrize("out", OUT_DTYPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_forward(kind, dtype, out, rng_and_seed):
    rng, seed = rng_and_seed
    for shape in shapes_for(kind, out):
        x = make_input(shape, dtype, rng)
        for layout in layouts(out):
            rowwise, columnwise = LAYOUTS[layout]
            ctx = _ctx(seed, shape=shape, layout=layout)
            dx = DeviceArray.of(x)
            o = Outputs(out_shape(kind, shape), out, rowwise, columnwise, amax0=0.5)
            lib.activation_fwd(ACTIVATIONS.index(kind), dx.desc, *o.args(), stream=_stream(), **PARAMS)
            o.check(cpu_forward(x, kind, out, rowwise, columnwise, 0.5, PARAMS), ctx)


@pytest.mark.parametrize("out", OUT_DTYPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_backward_with_dbias(kind, dtype, out, rng_and_seed):
    rng, seed = rng_and_seed
    for shape in shapes_for(kind, out):
        x = make_input(shape, dtype, rng)
        g = make_input(out_shape(kind, shape), dtype, rng)
        for i, layout in enumerate(layouts(out)):
            rowwise, columnwise = LAYOUTS[layout]
            # FP32 dbias everywhere; BF16 dbias and no dbias once per shape.
            extra = [np.dtype(ml_dtypes.bfloat16), None] if i == 0 else []
            for dbias_dtype in [np.dtype(np.float32)] + extra:
                ctx = _ctx(seed, shape=shape, layout=layout, dbias=dbias_dtype)
                run_backward(kind, x, g, out, rowwise, columnwise, dbias_dtype, PARAMS, ctx)


def run_backward(kind, x, g, out, rowwise, columnwise, dbias_dtype, params, ctx, offsets=(0, 0, 0)):
    dx, dg = DeviceArray.of(x, offsets[0]), DeviceArray.of(g, offsets[1])
    o = Outputs(x.shape, out, rowwise, columnwise, offsets[2])
    dbias = DeviceArray((x.shape[-1],), dbias_dtype) if dbias_dtype is not None else None
    size = lib.activation_bwd_workspace_size(dx.desc, dbias is not None)
    rows, cols = matrix(x.shape)
    assert size == (4 * -(-rows // 64) * cols if dbias is not None else 0)
    workspace = DeviceArray((size,), np.uint8) if size else None
    lib.activation_bwd(
        ACTIVATIONS.index(kind), dg.desc, dx.desc, *o.args(), _desc(dbias), _desc(workspace), stream=_stream(), **params
    )
    want, want_dbias = cpu_backward(g, x, kind, out, rowwise, columnwise, dbias_dtype, params)
    o.check(want, ctx)
    if dbias is not None:
        assert_same_bytes(dbias.numpy(), want_dbias, "dbias", ctx)


@pytest.mark.parametrize("kind", ["swiglu", "geglu", "clamped_swiglu", "gelu", "srelu"])
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("out", ["bfloat16", "e4m3"])
def test_unaligned_pointers(kind, dtype, out, rng_and_seed):
    """Pointers one element off the 16-byte grid take the element-wise paths."""
    rng, seed = rng_and_seed
    itemsize = np.dtype(dtype).itemsize
    out_item = NUMPY_OUT[out].itemsize
    for shape in [(256, 192), (130, 72)]:
        x = make_input(shape, dtype, rng)
        g = make_input(out_shape(kind, shape), dtype, rng)
        for offsets in [(itemsize, 0, 0), (0, itemsize, 0), (0, 0, out_item), (itemsize, itemsize, out_item)]:
            for layout in layouts(out):
                rowwise, columnwise = LAYOUTS[layout]
                ctx = _ctx(seed, shape=shape, offsets=offsets, layout=layout)
                run_backward(kind, x, g, out, rowwise, columnwise, np.dtype(np.float32), PARAMS, ctx, offsets)
                dx = DeviceArray.of(x, offsets[0])
                o = Outputs(out_shape(kind, shape), out, rowwise, columnwise, offsets[2])
                lib.activation_fwd(ACTIVATIONS.index(kind), dx.desc, *o.args(), stream=_stream(), **PARAMS)
                o.check(cpu_forward(x, kind, out, rowwise, columnwise, 0.0, PARAMS), ctx)


@pytest.mark.parametrize(
    "params",
    [
        dict(limit=3.0, alpha=1.0, glu_linear_offset=0.0),
        dict(limit=0.5, alpha=2.5, glu_linear_offset=-1.0),
        dict(limit=float("inf"), alpha=1.702, glu_linear_offset=1.0),
    ],
)
def test_clamped_swiglu_parameters(params, rng_and_seed):
    rng, seed = rng_and_seed
    x = make_input((217, 256), np.dtype(np.float32), rng)
    g = make_input((217, 128), np.dtype(np.float32), rng)
    for out, layout in [("float32", "rowwise"), ("e4m3", "both")]:
        rowwise, columnwise = LAYOUTS[layout]
        ctx = _ctx(seed, out=out, **params)
        run_backward("clamped_swiglu", x, g, out, rowwise, columnwise, np.dtype(np.float32), params, ctx)
        dx = DeviceArray.of(x)
        o = Outputs((217, 128), out, rowwise, columnwise)
        lib.activation_fwd(ACTIVATIONS.index("clamped_swiglu"), dx.desc, *o.args(), stream=_stream(), **params)
        o.check(cpu_forward(x, "clamped_swiglu", out, rowwise, columnwise, 0.0, params), ctx)


@pytest.mark.parametrize("out", ["bfloat16", "e5m2"])
def test_empty_input_writes_scale_inv_and_zero_dbias(out):
    x = np.zeros((0, 64), np.float32)
    g = np.zeros((0, 32), np.float32)
    rowwise, columnwise = (True, out in FP8)
    run_backward("swiglu", x, g, out, rowwise, columnwise, np.dtype(np.float32), PARAMS, "empty")


def test_dbias_workspace_is_required_on_cuda(rng_and_seed):
    rng, _ = rng_and_seed
    x = DeviceArray.of(make_input((100, 64), np.dtype(np.float32), rng))
    g = DeviceArray.of(make_input((100, 32), np.dtype(np.float32), rng))
    d, dbias = DeviceArray((100, 64), np.float32), DeviceArray((64,), np.float32)
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
            stream=_stream(),
        )
    small = DeviceArray((511,), np.uint8)
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
            stream=_stream(),
        )


def test_cuda_graph_capture(rng_and_seed):
    """Forward and backward (FP8, columnwise, dbias) captured in a graph and
    replayed: no host synchronization or allocation inside the calls."""
    rng, seed = rng_and_seed
    kind = ACTIVATIONS.index("swiglu")
    x_np = make_input((512, 1024), np.dtype(ml_dtypes.bfloat16), rng)
    g_np = make_input((512, 512), np.dtype(ml_dtypes.bfloat16), rng)
    x, g = DeviceArray.of(x_np), DeviceArray.of(g_np)
    y = Outputs((512, 512), "e4m3", True, True)
    d = Outputs((512, 1024), "e5m2", True, True)
    dbias = DeviceArray((1024,), np.float32)
    workspace = DeviceArray((lib.activation_bwd_workspace_size(x.desc, True),), np.uint8)
    torch.cuda.synchronize()  # the inputs' copies are done before the capture starts
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s = torch.cuda.current_stream().cuda_stream  # the capture stream
        lib.activation_fwd(kind, x.desc, *y.args(), stream=s)
        lib.activation_bwd(kind, g.desc, x.desc, *d.args(), dbias.desc, workspace.desc, stream=s)
    graph.replay()
    torch.cuda.synchronize()
    ctx = _ctx(seed, graph=True)
    y.check(cpu_forward(x_np, "swiglu", "e4m3", True, True, 0.0, PARAMS), ctx)
    want, want_dbias = cpu_backward(g_np, x_np, "swiglu", "e5m2", True, True, np.float32, PARAMS)
    d.check(want, ctx)
    assert_same_bytes(dbias.numpy(), want_dbias, "dbias", ctx)
