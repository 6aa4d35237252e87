"""NumPy + ml_dtypes oracle of FP8 block scaling, independent of the native code.

Written from the formulas of docs/numerics.md ("FP8 block scaling"), not from
the C++: pad the [M, K] view with zeros to whole blocks (so a cut block uses
only its valid elements: |x| >= 0 never raises a max), take each block's NaN-
skipping amax with reshapes, turn it into a scale, quantize with the
per-tensor cast of reference.py, then lay the scales out by index formulas.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .reference import FLT_MAX, FP8_MAX, FP8_NUMPY, cast_to_fp8_bytes

BLOCK = 128


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad4(n: int) -> int:
    return cdiv(n, 4) * 4


def as_matrix(x: np.ndarray) -> np.ndarray:
    """The [M, K] float32 view (K = last dim)."""
    x = np.asarray(x).astype(np.float32)
    return x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def max_finite(dtype) -> np.float32:
    """Largest finite value of the input type: what an overflowing scale becomes."""
    dtype = np.dtype(dtype)
    info = ml_dtypes.finfo(dtype) if dtype == np.dtype(ml_dtypes.bfloat16) else np.finfo(dtype)
    return np.float32(info.max)


def block_scales(amax: np.ndarray, fmt: str, force_pow2=True, epsilon=0.0, value_for_inf=FLT_MAX) -> np.ndarray:
    """compute_scale_from_amax element-wise, float32."""
    a = np.asarray(amax, np.float32)
    a = np.where(a < np.float32(epsilon), np.float32(epsilon), a).astype(np.float32)
    bad = (a == 0) | ~np.isfinite(a)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        s = (np.float32(FP8_MAX[fmt]) / a).astype(np.float32)
    s = np.where(np.isinf(s), np.float32(value_for_inf), s).astype(np.float32)
    if force_pow2:
        _, exponent = np.frexp(s)  # s = m * 2^e with m in [0.5, 1): round down to 2^(e-1)
        s = np.ldexp(np.float32(1.0), exponent - 1).astype(np.float32)
    return np.where(bad, np.float32(1.0), s).astype(np.float32)


def block_amax(x2d: np.ndarray, block_rows: int, block_cols: int) -> np.ndarray:
    """amax per block (NaN skipped) of an [M, K] matrix: [cdiv(M, br), cdiv(K, bc)]."""
    m, k = x2d.shape
    a = np.abs(x2d)
    a = np.where(np.isnan(a), np.float32(0), a)
    mb, kb = cdiv(m, block_rows), cdiv(k, block_cols)
    padded = np.zeros((mb * block_rows, kb * block_cols), np.float32)
    padded[:m, :k] = a
    if padded.size == 0:
        return np.zeros((mb, kb), np.float32)
    return padded.reshape(mb, block_rows, kb, block_cols).max(axis=(1, 3))


def expand(grid: np.ndarray, block_rows: int, block_cols: int, shape) -> np.ndarray:
    """Per-block values repeated over their elements, cut to `shape`."""
    full = np.repeat(np.repeat(grid, block_rows, axis=0), block_cols, axis=1)
    return full[: shape[0], : shape[1]]


def quantize_direction(x2d, fmt, block_rows, block_cols, force_pow2, epsilon, value_for_inf):
    """(q bytes [M, K], scale_inv grid) for one block shape."""
    s = block_scales(block_amax(x2d, block_rows, block_cols), fmt, force_pow2, epsilon, value_for_inf)
    q = cast_to_fp8_bytes(x2d * expand(s, block_rows, block_cols, x2d.shape), fmt)
    return q, (np.float32(1.0) / s).astype(np.float32)


def padded(grid: np.ndarray, inner: int) -> np.ndarray:
    """grid with its last dim zero-padded to `inner` entries."""
    out = np.zeros((grid.shape[0], inner), np.float32)
    out[:, : grid.shape[1]] = grid
    return out


def quantize(x, fmt="e4m3", block_dim=1, layout="gemm_ready", force_pow2=True, epsilon=0.0) -> dict:
    """Both copies as the core stores them: rowwise, rowwise_scale_inv, columnwise,
    columnwise_scale_inv (FP8 as uint8 bytes; rowwise keeps x's shape)."""
    x2d = as_matrix(x)
    m, k = x2d.shape
    b = BLOCK
    args = (force_pow2, epsilon, max_finite(np.asarray(x).dtype))
    if block_dim == 2:
        q, inv = quantize_direction(x2d, fmt, b, b, *args)  # inv [MB, KB]
        q_col, inv_col = q, inv
    else:
        q, inv = quantize_direction(x2d, fmt, 1, b, *args)  # inv [M, KB]
        q_col, inv_col = quantize_direction(x2d, fmt, b, 1, *args)  # [MB, K]
    if layout == "compact":
        row_scales, col_scales, col_data = inv, inv_col, q_col
    elif block_dim == 2:
        row_scales = padded(inv, pad4(inv.shape[1]))  # [MB, pad4(KB)]
        col_scales = padded(inv_col.T, pad4(inv_col.shape[0]))  # [KB, pad4(MB)]
        col_data = q_col.T
    else:
        row_scales = padded(inv.T, pad4(m))  # [KB, pad4(M)]
        col_scales = padded(inv_col, pad4(k))  # [MB, pad4(K)]
        col_data = q_col.T
    return {
        "rowwise": q.reshape(np.shape(x)),
        "rowwise_scale_inv": row_scales,
        "columnwise": np.ascontiguousarray(col_data) if layout == "gemm_ready" else col_data.reshape(np.shape(x)),
        "columnwise_scale_inv": col_scales,
    }


def stored_scales(scale_inv, shape, block_dim=1, layout="gemm_ready", columnwise=False) -> np.ndarray:
    """The scale_inv of every element of stored data of `shape` (its [R, C] view)."""
    r_count = int(np.prod(shape[:-1], dtype=np.int64))
    rr, cc = np.indices((r_count, shape[-1]))
    s = np.asarray(scale_inv, np.float32)
    if block_dim == 2:
        return s[rr // BLOCK, cc // BLOCK]
    if layout == "gemm_ready":
        return s[cc // BLOCK, rr]
    return s[rr // BLOCK, cc] if columnwise else s[rr, cc // BLOCK]


def dequantize(
    q_bytes, scale_inv, fmt, block_dim=1, layout="gemm_ready", columnwise=False, out_dtype=np.float32
) -> np.ndarray:
    """out_dtype(float32(q) * scale_inv of its block), shape of the stored data."""
    q_bytes = np.asarray(q_bytes).view(np.uint8)
    s = stored_scales(scale_inv, q_bytes.shape, block_dim, layout, columnwise)
    values = q_bytes.reshape(s.shape).view(FP8_NUMPY[fmt]).astype(np.float32) * s
    with np.errstate(over="ignore"):  # E5M2 values above the FP16 max become inf, as in C
        return values.astype(out_dtype).reshape(q_bytes.shape)
