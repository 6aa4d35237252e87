"""Transpose of the [M, K] matrix view of an array (any 1/2/4/8-byte type)."""

from __future__ import annotations

import numpy as np

from ._arrays import desc, matrix_shape
from ._checks import contiguous
from ._native import lib


def transpose(x) -> np.ndarray:
    """x viewed as [M, K] (K = last dim), returned as [K, M]."""
    x = contiguous(x, "x")
    rows, cols = matrix_shape(x.shape)
    out = np.empty((cols, rows), dtype=x.dtype)
    lib.transpose(desc(x), desc(out))
    return out
