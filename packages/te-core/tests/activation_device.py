"""The activation tests on raw device buffers (the `device` fixture): outputs
on the test's device and the CPU backend's result through the C binding, to
compare byte for byte. Both backends evaluate the same FP32 operations
(functions.h: every operation rounded once, the core's own exp, one
canonical NaN), so every output is compared exactly: FP32/BF16/FP16 values,
FP8 bytes (rowwise and the transposed columnwise copy), amax, scale_inv and
the bias gradient, whose summation order is specified.
"""

from __future__ import annotations

import math

import backend_checks as bc
import core_device
import ml_dtypes
import numpy as np

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core._arrays import desc as host_desc
from transformer_engine.core.activation import ACTIVATIONS, GATED_ACTIVATIONS

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
    **bc.FP8,
}
PARAMS = {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0}


def device_shapes(kind, out):
    """The shapes of a kind; the large one (many blocks) only for BF16 and E4M3
    outputs. On the CPU backend the shapes sized for the CUDA kernels' blocks
    (2^18 elements and more) are left out: the smaller ones run the same code."""
    all_shapes = GATED_SHAPES if kind in GATED_ACTIVATIONS else PLAIN_SHAPES
    shapes = [s for s in all_shapes if s[0] < 4000 or out in ("bfloat16", "e4m3")]
    if core_device.current() == "cpu":
        shapes = [s for s in shapes if math.prod(s) < 2**18]
    return shapes


def out_shape(kind, shape):
    return shape[:-1] + (shape[-1] // 2,) if kind in GATED_ACTIVATIONS else shape


class Outputs:
    """Outputs of one call on the test's device: rowwise (any type) and/or columnwise bc.FP8, scalars."""

    def __init__(self, shape, out: str, rowwise=True, columnwise=False, offset=0, amax0=0.0):
        fp8 = out in bc.FP8
        rows, cols = bc.matrix(shape)
        self.row = bc.DeviceArray(shape, NUMPY_OUT[out], offset) if rowwise else None
        self.col = bc.DeviceArray((cols, rows), NUMPY_OUT[out], offset) if columnwise else None
        self.scale = bc.scalar(0.37 if out == "e4m3" else 64.0) if fp8 else None
        self.scale_inv = bc.scalar(-1.0) if fp8 else None
        self.amax = bc.scalar(amax0)

    def args(self):
        return (
            bc.desc_or_none(self.row),
            bc.desc_or_none(self.col),
            bc.desc_or_none(self.scale),
            bc.desc_or_none(self.scale_inv),
            self.amax.desc,
        )

    def check(self, want, ctx: str):
        """want: the CPU result (ndarray or Fp8Tensor) and the CPU amax."""
        result, amax = want
        if self.scale is None:
            bc.assert_same_bytes(self.row.numpy(), result, "output", ctx)
        else:
            if self.row is not None:
                bc.assert_same_bytes(self.row.numpy(), result.rowwise, "rowwise", ctx)
            if self.col is not None:
                bc.assert_same_bytes(self.col.numpy(), result.columnwise, "columnwise", ctx)
            bc.assert_same_bytes(self.scale_inv.numpy(), result.scale_inv, "scale_inv", ctx)
        bc.assert_same_bytes(self.amax.numpy(), amax, "amax", ctx)


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
        fp8 = out in bc.FP8
        rows, cols = bc.matrix(shape)
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
        return tc.Fp8Tensor(self.row, self.col, self.scale, self.scale_inv, self.amax)


def layouts(out):
    return list(bc.LAYOUTS) if out in bc.FP8 else ["rowwise"]


def run_backward(kind, x, g, out, rowwise, columnwise, dbias_dtype, params, ctx, offsets=(0, 0, 0)):
    dx, dg = bc.DeviceArray.of(x, offsets[0]), bc.DeviceArray.of(g, offsets[1])
    o = Outputs(x.shape, out, rowwise, columnwise, offsets[2])
    dbias = bc.DeviceArray((x.shape[-1],), dbias_dtype) if dbias_dtype is not None else None
    size = lib.activation_bwd_workspace_size(dx.desc, dbias is not None)
    rows, cols = bc.matrix(x.shape)
    # (activation.h: 4 * ceil(M / 64) * K bytes for dbias on CUDA; the CPU backend needs none)
    cuda = core_device.current() == "cuda"
    assert size == (4 * -(-rows // 64) * cols if dbias is not None and cuda else 0)
    workspace = bc.DeviceArray((size,), np.uint8) if size else None
    lib.activation_bwd(
        ACTIVATIONS.index(kind),
        dg.desc,
        dx.desc,
        *o.args(),
        bc.desc_or_none(dbias),
        bc.desc_or_none(workspace),
        stream=core_device.stream(),
        **params,
    )
    want, want_dbias = cpu_backward(g, x, kind, out, rowwise, columnwise, dbias_dtype, params)
    o.check(want, ctx)
    if dbias is not None:
        bc.assert_same_bytes(dbias.numpy(), want_dbias, "dbias", ctx)
