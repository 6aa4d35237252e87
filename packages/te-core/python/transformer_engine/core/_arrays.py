"""Descriptors for NumPy arrays, and argument checks of the NumPy-level API."""

from __future__ import annotations

import numpy as np

from ._checks import contiguous, fp32_scalar
from ._native import lib
from .dtypes import numpy_dtype, te_dtype

HIGH_PRECISION = (np.dtype(np.float32), np.dtype(np.float16), np.dtype("bfloat16"))


def desc(array: np.ndarray) -> lib.TensorDesc:
    """A CPU descriptor of a C-contiguous array (the array must stay alive)."""
    if not array.flags.c_contiguous:
        raise ValueError("arrays passed to the core must be C-contiguous")
    return lib.TensorDesc(array.ctypes.data, int(te_dtype(array.dtype)), list(array.shape), 0, 0)


def empty(shape, dtype) -> np.ndarray:
    return np.empty(shape, dtype=numpy_dtype(te_dtype(dtype)))


def as_high_precision(x, name: str) -> np.ndarray:
    """x as a C-contiguous FP32/BF16/FP16 array, or TypeError naming the argument."""
    array = contiguous(x, name)
    if array.dtype not in HIGH_PRECISION:
        raise TypeError(f"argument '{name}' must be float32, bfloat16 or float16, got {array.dtype}")
    return array


__all__ = ["HIGH_PRECISION", "as_high_precision", "desc", "empty", "fp32_scalar", "matrix_shape"]


def matrix_shape(shape) -> tuple[int, int]:
    """[M, K] view of a shape: K its last dim, M the product of the others."""
    if len(shape) == 0:
        return 1, 1
    cols = int(shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return rows, cols
