"""te_activation_bwd_with_fwd_columnwise on CUDA against the CPU backend:
identical bytes.

The CUDA backend fuses the forward output's FP8 columnwise copy into the
backward's tile kernel (and takes that kernel even for a high-precision
grad_input, which alone would take the rowwise kernel); the CPU backend is
the composition of the backward and the forward. Every output is compared
byte for byte: grad_input (FP8 rowwise / columnwise, or FP32/BF16/FP16), its
amax and scale_inv, dbias, fwd_columnwise and fwd_scale_inv. Inputs are hostile
(NaN, +-inf, subnormals), shapes ragged against the 128 x 64 tiles, pointers
aligned and off the grid.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_activation_gpu import (  # noqa: E402  (the activation GPU test helpers)
    NUMPY_OUT,
    PARAMS,
    CpuOutputs,
    Outputs,
    matrix,
    out_shape,
    shapes_for,
)
from test_cuda_backends import (  # noqa: E402
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
from transformer_engine.core.activation import ACTIVATIONS  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.activation]

# grad_input's (type, rowwise, columnwise): FP8 with and without its own
# columnwise copy, FP8 columnwise only, and high precision.
GRAD_OUTPUTS = [
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
    "fp32": int(te_core.DType.kFloat32),
    "bf16": int(te_core.DType.kBFloat16),
    "fp16": int(te_core.DType.kFloat16),
}


@pytest.fixture
def rng_and_seed():
    seed = int(np.random.SeedSequence().entropy % (2**32))  # printed in failure messages
    return np.random.default_rng(seed), seed


@pytest.fixture(autouse=True)
def _require_cuda():
    if not (torch.cuda.is_available() and te_core.built_with_cuda()):
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")


def cpu_fused(g, x, kind, out, rowwise, columnwise, dbias_dtype, fwd_fmt, values, params):
    """The CPU backend's outputs: ((grad_input result, amax), dbias, fwd_columnwise, fwd_scale_inv)."""
    o = CpuOutputs(x.shape, out, rowwise, columnwise, 0.0)
    dbias = np.zeros(x.shape[-1], dbias_dtype) if dbias_dtype is not None else None
    rows, cols = matrix(out_shape(kind, x.shape))
    fwd_col = np.zeros((cols, rows), FP8[fwd_fmt])
    fwd_scale = np.array(FWD_SCALE[fwd_fmt], np.float32)
    fwd_scale_inv = np.zeros((), np.float32)
    d = host_desc
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
    """GPU call (x, g, grad_input and fwd_columnwise at byte offsets) against the CPU backend."""
    dx, dg = DeviceArray.of(x, offsets[0]), DeviceArray.of(g, offsets[1])
    o = Outputs(x.shape, out, rowwise, columnwise, offsets[2])
    dbias = DeviceArray((x.shape[-1],), dbias_dtype) if dbias_dtype is not None else None
    size = lib.activation_bwd_workspace_size(dx.desc, dbias is not None)
    workspace = DeviceArray((size,), np.uint8) if size else None
    rows, cols = matrix(out_shape(kind, x.shape))
    fwd_col = DeviceArray((cols, rows), FP8[fwd_fmt], offsets[3])
    fwd_scale, fwd_scale_inv = scalar(FWD_SCALE[fwd_fmt]), scalar(-1.0)
    lib.activation_bwd_with_fwd_columnwise(
        ACTIVATIONS.index(kind),
        dg.desc,
        dx.desc,
        *o.args(),
        _desc(dbias),
        _desc(workspace),
        fwd_col.desc,
        fwd_scale.desc,
        fwd_scale_inv.desc,
        VALUES[values],
        stream=_stream(),
        **params,
    )
    want, want_dbias, want_col, want_scale_inv = cpu_fused(
        g, x, kind, out, rowwise, columnwise, dbias_dtype, fwd_fmt, values, params
    )
    o.check(want, ctx)
    if dbias is not None:
        assert_same_bytes(dbias.numpy(), want_dbias, "dbias", ctx)
    assert_same_bytes(fwd_col.numpy(), want_col, "fwd_columnwise", ctx)
    assert_same_bytes(fwd_scale_inv.numpy(), want_scale_inv, "fwd_scale_inv", ctx)


@pytest.mark.parametrize("grad_out", GRAD_OUTPUTS, ids=lambda o: f"{o[0]}-r{int(o[1])}c{int(o[2])}")
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_fused_matches_cpu(kind, dtype, grad_out, rng_and_seed):
    rng, seed = rng_and_seed
    out, rowwise, columnwise = grad_out
    for i, shape in enumerate(shapes_for(kind, out)):
        x = make_input(shape, dtype, rng)
        g = make_input(out_shape(kind, shape), dtype, rng)
        fwd_fmt = "e4m3" if i % 2 == 0 else "e5m2"
        # FP32 dbias, BF16 dbias and none, in turn.
        dbias_dtype = [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), None][i % 3]
        values = ["fp32", "bf16", "fp16"][(i + 1) % 3]
        ctx = _ctx(seed, shape=shape, fwd=fwd_fmt, dbias=dbias_dtype, values=values)
        run_fused(kind, x, g, out, rowwise, columnwise, dbias_dtype, fwd_fmt, PARAMS, ctx, values=values)


@pytest.mark.parametrize("kind", ["swiglu", "gelu"])
@pytest.mark.parametrize("out", ["bfloat16", "e4m3"])
def test_large(kind, out, rng_and_seed):
    """The LayerNormMLP shape family: 8192 rows, 2 x 1024 columns (many full tiles)."""
    rng, seed = rng_and_seed
    dtype = np.dtype(ml_dtypes.bfloat16)
    shape = (8192, 2048)
    x = make_input(shape, dtype, rng, "finite")
    g = make_input(out_shape(kind, shape), dtype, rng, "finite")
    fp8 = out in FP8
    for values in ("fp32", "bf16"):
        ctx = _ctx(seed, large=True, values=values)
        run_fused(kind, x, g, out, True, fp8, np.dtype(np.float32), "e4m3", PARAMS, ctx, values=values)


@pytest.mark.parametrize("kind", ["swiglu", "clamped_swiglu", "srelu"])
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("out", ["bfloat16", "float32", "e4m3"])
def test_unaligned_pointers(kind, dtype, out, rng_and_seed):
    """Pointers off the 16-byte grid: element-wise loads and stores, narrow columnwise stores."""
    rng, seed = rng_and_seed
    item, out_item = np.dtype(dtype).itemsize, NUMPY_OUT[out].itemsize
    for shape in [(256, 192), (130, 72), (1000, 128)]:
        x = make_input(shape, dtype, rng)
        g = make_input(out_shape(kind, shape), dtype, rng)
        for offsets in [(item, 0, 0, 0), (0, item, 0, 0), (0, 0, out_item, 0), (0, 0, 0, 1), (0, 0, 0, 8)]:
            ctx = _ctx(seed, shape=shape, offsets=offsets)
            values = "bf16" if offsets[3] else "fp32"
            run_fused(kind, x, g, out, True, out in FP8, np.dtype(np.float32), "e5m2", PARAMS, ctx, offsets, values)


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
    for out, rowwise, columnwise in [("float32", True, False), ("e4m3", True, True)]:
        ctx = _ctx(seed, out=out, **params)
        run_fused("clamped_swiglu", x, g, out, rowwise, columnwise, np.dtype(np.float32), "e4m3", params, ctx)


@pytest.mark.parametrize("out", ["bfloat16", "e5m2"])
def test_empty_input_writes_the_scales(out):
    x = np.zeros((0, 64), np.float32)
    g = np.zeros((0, 32), np.float32)
    run_fused("swiglu", x, g, out, True, out in FP8, np.dtype(np.float32), "e4m3", PARAMS, "empty")
