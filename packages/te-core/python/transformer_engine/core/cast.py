"""Per-tensor FP8 quantization on NumPy arrays (the CPU backend of the core).

Formulas (see core/include/te/cast.h):
    q = saturate(round_to_nearest_even(float32(x) * scale)),  scale_inv = 1 / scale
A tensor is viewed as a matrix [M, K] (K = last dim); the columnwise copy is
its transpose [K, M], which Hopper FP8 GEMMs need.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._arrays import as_high_precision, desc, empty, fp32_scalar, matrix_shape
from ._checks import contiguous, flag, real
from ._compat import renamed_keyword
from ._native import lib
from .dtypes import FP8_DTYPES, te_dtype
from .dtypes import fp8_dtype as _fp8_dtype


class Fp8Tensor(NamedTuple):
    """Result of a per-tensor FP8 quantization."""

    rowwise: np.ndarray | None  # FP8, shape of the input
    columnwise: np.ndarray | None  # FP8, [K, M]
    scale: np.ndarray  # FP32 scalar used for the cast
    scale_inv: np.ndarray  # FP32 scalar 1/scale: what GEMM and dequantize use
    amax: np.ndarray  # FP32 scalar


def _outputs(x: np.ndarray, dtype, rowwise: bool, columnwise: bool):
    rowwise, columnwise = flag(rowwise, "rowwise"), flag(columnwise, "columnwise")
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    code = _fp8_dtype(dtype)
    rows, cols = matrix_shape(x.shape)
    row = empty(x.shape, code) if rowwise else None
    col = empty((cols, rows), code) if columnwise else None
    return row, col


def quantize_fp8(x, scale, fp8_dtype="e4m3", *, rowwise=True, columnwise=False, amax=None) -> Fp8Tensor:
    """Delayed-scaling quantize with a given scale; amax (if given) is max-accumulated."""
    x = as_high_precision(x, "x")
    scale = fp32_scalar(scale, "scale")
    row, col = _outputs(x, fp8_dtype, rowwise, columnwise)
    scale_inv = np.zeros((), np.float32)
    amax = fp32_scalar(0.0 if amax is None else amax, "amax").copy()
    lib.quantize_fp8(
        desc(x),
        desc(scale),
        None if row is None else desc(row),
        None if col is None else desc(col),
        desc(scale_inv),
        desc(amax),
    )
    return Fp8Tensor(row, col, scale, scale_inv, amax)


def compute_amax(x) -> np.float32:
    """``max |x|`` over the non-NaN elements (0 when there are none)."""
    x = as_high_precision(x, "x")
    amax = np.zeros((), np.float32)
    lib.compute_amax(desc(x), desc(amax))
    return amax[()]


@renamed_keyword("force_pow2_scales", "force_pow_2_scales")
def compute_scale_from_amax(amax, fp8_dtype="e4m3", *, force_pow_2_scales=False, amax_epsilon=0.0):
    """(scale, scale_inv) from amax with the reference library's rules."""
    amax = fp32_scalar(amax, "amax")
    scale = np.zeros((), np.float32)
    scale_inv = np.zeros((), np.float32)
    lib.compute_scale_from_amax(
        desc(amax),
        desc(scale),
        desc(scale_inv),
        int(_fp8_dtype(fp8_dtype)),
        flag(force_pow_2_scales, "force_pow_2_scales"),
        real(amax_epsilon, "amax_epsilon"),
    )
    return scale[()], scale_inv[()]


@renamed_keyword("force_pow2_scales", "force_pow_2_scales")
def quantize_fp8_current_scaling(
    x, fp8_dtype="e4m3", *, rowwise=True, columnwise=False, force_pow_2_scales=False, amax_epsilon=0.0
) -> Fp8Tensor:
    """amax(x), scale from amax, then quantize: one call."""
    x = as_high_precision(x, "x")
    row, col = _outputs(x, fp8_dtype, rowwise, columnwise)
    scale, scale_inv, amax = (np.zeros((), np.float32) for _ in range(3))
    lib.quantize_fp8_current_scaling(
        desc(x),
        None if row is None else desc(row),
        None if col is None else desc(col),
        desc(scale),
        desc(scale_inv),
        desc(amax),
        flag(force_pow_2_scales, "force_pow_2_scales"),
        real(amax_epsilon, "amax_epsilon"),
    )
    return Fp8Tensor(row, col, scale, scale_inv, amax)


def dequantize_fp8(q, scale_inv, out_dtype=np.float32) -> np.ndarray:
    """float32(q) * scale_inv, rounded to out_dtype."""
    q = contiguous(q, "q")
    if te_dtype(q.dtype) not in FP8_DTYPES:
        raise TypeError(f"argument 'q' must be float8_e4m3fn or float8_e5m2, got {q.dtype}")
    scale_inv = fp32_scalar(scale_inv, "scale_inv")
    out = empty(q.shape, out_dtype)
    lib.dequantize_fp8(desc(q), desc(scale_inv), desc(out))
    return out
