"""FP8 block scaling (Float8BlockScaling, DeepSeek-v3 style) on NumPy arrays.

Runs the core's CPU backend. Formulas and layouts: core/include/te/fp8_block.h
and docs/numerics.md. Per block of 1x128 (rowwise), 128x1 (columnwise) or
128x128 elements of the [M, K] view (K = last dim, a multiple of 16):
    s = scale_from_amax(block amax),  q = saturate(RNE(x * s)),  scale_inv = 1 / s
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._arrays import as_high_precision, desc, empty, matrix_shape
from ._checks import contiguous, flag, fp32_array, integer, real
from ._compat import renamed_keyword
from ._native import lib
from .dtypes import FP8_DTYPES, DType, te_dtype
from .dtypes import fp8_dtype as _fp8_dtype

BLOCK = 128
LAYOUTS = {"gemm_ready": 0, "compact": 1}


def _layout_code(layout: str) -> int:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"argument 'layout' must be 'gemm_ready' or 'compact', got {layout!r}")
    return LAYOUTS[layout]


def _block_dim(block_dim) -> int:
    value = integer(block_dim, "block_dim")
    if value not in (1, 2):
        raise ValueError(f"argument 'block_dim' must be 1 (1x128 blocks) or 2 (128x128 blocks), got {block_dim!r}")
    return value


def fp8_block_scale_shape(shape, *, block_dim=1, layout="gemm_ready", columnwise=False) -> tuple[int, int]:
    """Shape of the FP32 scale_inv array of a tensor of `shape` (see te/fp8_block.h)."""
    rows, cols = matrix_shape(shape)
    return tuple(
        lib.fp8_block_scale_shape(
            rows, cols, _block_dim(block_dim), _layout_code(layout), flag(columnwise, "columnwise")
        )
    )


def _stored_shape(shape, layout: str, columnwise: bool) -> tuple:
    """Shape of the stored data: GEMM-ready columnwise data is [K, M]."""
    if columnwise and layout == "gemm_ready":
        rows, cols = matrix_shape(shape)
        return (cols, rows)
    return tuple(shape)


class Fp8BlockTensor(NamedTuple):
    """Result of an FP8 block quantization; either copy may be None."""

    shape: tuple  # the input's shape
    block_dim: int  # 1 or 2
    layout: str  # "gemm_ready" or "compact"
    fp8_dtype: DType
    rowwise: np.ndarray | None  # FP8, the input's shape
    rowwise_scale_inv: np.ndarray | None  # FP32
    columnwise: np.ndarray | None  # FP8, [K, M] (gemm_ready) or the input's shape (compact)
    columnwise_scale_inv: np.ndarray | None  # FP32

    def dequantize(self, out_dtype=np.float32, *, columnwise=False) -> np.ndarray:
        """The tensor in its original shape, from the rowwise or the columnwise copy."""
        data = self.columnwise if columnwise else self.rowwise
        scales = self.columnwise_scale_inv if columnwise else self.rowwise_scale_inv
        if data is None:
            raise ValueError(f"this tensor has no {'columnwise' if columnwise else 'rowwise'} data")
        out = dequantize_fp8_block(
            data, scales, block_dim=self.block_dim, layout=self.layout, columnwise=columnwise, out_dtype=out_dtype
        )
        if columnwise and self.layout == "gemm_ready":
            out = contiguous(out.T, "out")
        return out.reshape(self.shape)


@renamed_keyword("force_pow2_scales", "force_pow_2_scales")
def quantize_fp8_block(
    x,
    fp8_dtype="e4m3",
    *,
    block_dim=1,
    layout="gemm_ready",
    rowwise=True,
    columnwise=False,
    force_pow_2_scales=True,
    amax_epsilon=0.0,
) -> Fp8BlockTensor:
    """Quantize x with one FP32 scale per block; rowwise and/or columnwise in one call.

    Columnwise 1-D data is quantized from x itself (its 128x1 blocks differ from
    the rowwise 1x128 ones); 2-D columnwise data equals the rowwise data transposed.
    """
    x = as_high_precision(x, "x")
    block_dim, code = _block_dim(block_dim), _layout_code(layout)
    fmt = _fp8_dtype(fp8_dtype)
    rowwise, columnwise = flag(rowwise, "rowwise"), flag(columnwise, "columnwise")
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    outputs = {}
    for name, wanted in (("rowwise", rowwise), ("columnwise", columnwise)):
        if wanted:
            is_col = name == "columnwise"
            data = empty(_stored_shape(x.shape, layout, is_col), fmt)
            scale_shape = fp8_block_scale_shape(x.shape, block_dim=block_dim, layout=layout, columnwise=is_col)
            outputs[name] = (data, np.empty(scale_shape, np.float32))
    row, col = outputs.get("rowwise", (None, None)), outputs.get("columnwise", (None, None))
    lib.fp8_block_quantize(
        desc(x),
        *(None if a is None else desc(a) for a in (*row, *col)),
        block_dim=block_dim,
        layout=code,
        force_pow2_scales=flag(force_pow_2_scales, "force_pow_2_scales"),
        amax_epsilon=real(amax_epsilon, "amax_epsilon"),
    )
    return Fp8BlockTensor(tuple(x.shape), block_dim, layout, fmt, *row, *col)


def _fp8_array(a, name: str) -> np.ndarray:
    a = contiguous(a, "a")
    if te_dtype(a.dtype) not in FP8_DTYPES:
        raise TypeError(f"argument '{name}' must be float8_e4m3fn or float8_e5m2, got {a.dtype}")
    return a


def dequantize_fp8_block(
    data, scale_inv, *, block_dim=1, layout="gemm_ready", columnwise=False, out_dtype=np.float32
) -> np.ndarray:
    """float32(q) * its block's scale_inv, rounded to out_dtype; the shape of `data` as stored."""
    data = _fp8_array(data, "data")
    scale_inv = fp32_array(scale_inv, "scale_inv")
    out = empty(data.shape, out_dtype)
    lib.fp8_block_dequantize(
        desc(data),
        desc(scale_inv),
        desc(out),
        _block_dim(block_dim),
        _layout_code(layout),
        flag(columnwise, "columnwise"),
    )
    return out


def transpose_fp8_block_2d(rowwise, rowwise_scale_inv, *, layout="gemm_ready"):
    """(columnwise, columnwise_scale_inv) of 2-D block data from the rowwise copy."""
    rowwise = _fp8_array(rowwise, "rowwise")
    rowwise_scale_inv = fp32_array(rowwise_scale_inv, "rowwise_scale_inv")
    code = _layout_code(layout)
    col = np.empty(_stored_shape(rowwise.shape, layout, True), rowwise.dtype)
    col_scales = np.empty(fp8_block_scale_shape(rowwise.shape, block_dim=2, layout=layout, columnwise=True), np.float32)
    lib.fp8_block_transpose_2d(desc(rowwise), desc(rowwise_scale_inv), desc(col), desc(col_scales), code)
    return col, col_scales
