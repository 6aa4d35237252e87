"""MXFP8 quantization on NumPy arrays (the CPU backend of the core).

Formulas (core/include/te/mxfp8.h): one E8M0 byte e per block of 32 elements
(1x32 rowwise, 32x1 columnwise, or one 32x32 tile for both with use_2d_blocks):
    e = e8m0_round_up(fl32(amax_block * fl32(1 / fp8_max))),   q = fp8(x * 2^(127 - e))
and dequantize is q * 2^(e - 127). Columnwise data keeps the input's shape (it is
not transposed). Scales come back as float8_e8m0fnu arrays padded to
[roundup(M, 128), roundup(K/32, 4)] (rowwise) and [roundup(M/32, 4), roundup(K, 128)]
(columnwise), M = product of the leading dims, K = last dim; padding bytes are 0.
With swizzled_scales=True the same buffers hold the GEMM tile layout (swizzle.py).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from ._arrays import as_high_precision, desc, empty, matrix_shape
from ._checks import contiguous, flag
from ._native import lib
from .dtypes import FP8_DTYPES, te_dtype
from .dtypes import fp8_dtype as _fp8_dtype

BLOCK = 32
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


class Mxfp8Tensor(NamedTuple):
    """Result of an MXFP8 quantization; a direction not requested is None."""

    rowwise: np.ndarray | None  # FP8, the input's shape, 1x32 blocks
    rowwise_scale_inv: np.ndarray | None  # E8M0 [roundup(M,128), roundup(K/32,4)]
    columnwise: np.ndarray | None  # FP8, the input's shape, 32x1 blocks
    columnwise_scale_inv: np.ndarray | None  # E8M0 [roundup(M/32,4), roundup(K,128)]
    swizzled_scales: bool  # scales in the GEMM layout


def _round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def mxfp8_scale_shape(shape, columnwise: bool = False) -> tuple[int, int]:
    """Padded shape of the E8M0 scale buffer for data of `shape`."""
    m, k = matrix_shape(tuple(shape))
    if columnwise:
        return _round_up(m // BLOCK, 4), _round_up(k, 128)
    return _round_up(m, 128), _round_up(k // BLOCK, 4)


def quantize_mxfp8(
    x, fp8_dtype="e4m3", *, rowwise=True, columnwise=False, use_2d_blocks=False, swizzled_scales=False
) -> Mxfp8Tensor:
    """MXFP8-quantize x (rank >= 2, last dim % 32 == 0) in one pass."""
    rowwise, columnwise = flag(rowwise, "rowwise"), flag(columnwise, "columnwise")
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    x = as_high_precision(x, "x")
    code = _fp8_dtype(fp8_dtype)
    outputs = []
    for wanted, is_col in ((rowwise, False), (columnwise, True)):
        data = empty(x.shape, code) if wanted else None
        scales = np.empty(mxfp8_scale_shape(x.shape, is_col), E8M0) if wanted else None
        outputs += [data, scales]
    lib.quantize_mxfp8(
        desc(x),
        *(None if a is None else desc(a) for a in outputs),
        flag(use_2d_blocks, "use_2d_blocks"),
        flag(swizzled_scales, "swizzled_scales"),
    )
    return Mxfp8Tensor(*outputs, flag(swizzled_scales, "swizzled_scales"))


def dequantize_mxfp8(q, scale_inv, *, columnwise=False, swizzled_scales=False, out_dtype=np.float32) -> np.ndarray:
    """q * 2^(e - 127) per block, rounded to out_dtype (float32, bfloat16 or float16)."""
    q = contiguous(q, "q")
    if te_dtype(q.dtype) not in FP8_DTYPES:
        raise TypeError(f"argument 'q' must be float8_e4m3fn or float8_e5m2, got {q.dtype}")
    scale_inv = contiguous(scale_inv, "scale_inv")
    if scale_inv.dtype != E8M0:
        raise TypeError(f"argument 'scale_inv' must be float8_e8m0fnu, got {scale_inv.dtype}")
    out = empty(q.shape, out_dtype)
    lib.dequantize_mxfp8(
        desc(q), desc(scale_inv), desc(out), flag(columnwise, "columnwise"), flag(swizzled_scales, "swizzled_scales")
    )
    return out
