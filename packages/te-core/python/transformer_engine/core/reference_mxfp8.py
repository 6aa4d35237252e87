"""NumPy + ml_dtypes oracle of MXFP8 quantization and the block-scale swizzle.

Written from the formulas in docs/numerics.md ("MXFP8") with NumPy reshapes and
ml_dtypes conversions, independently of the native code:

    amax  = max |x| over the block's non-NaN elements (0 when none)
    v     = float32(amax) * float32(1 / fp8_max)        FP32 product
    e     = clip(ceil(log2(v)) + 127, 0, 254);  inf -> 254, NaN -> 255, 0 -> 0
    q     = fp8(float32(x) * 2^(127 - e))               saturating RNE, NaN -> 0x7F
    x'    = float32(q) * 2^(e - 127)                    decode via float8_e8m0fnu
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .reference import FP8_MAX, FP8_NUMPY, cast_to_fp8_bytes

BLOCK = 32
E8M0 = ml_dtypes.float8_e8m0fnu


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def max_reciprocal(fmt: str) -> np.float32:
    """float32(1 / fp8_max): the constant the block amax is multiplied by."""
    return np.float32(1.0 / FP8_MAX[fmt])


def e8m0_round_up(v) -> np.ndarray:
    """Smallest E8M0 byte e in [0, 254] with 2^(e - 127) >= v (v >= 0, float32)."""
    v = np.asarray(v, dtype=np.float32)
    mantissa, exponent = np.frexp(v.astype(np.float64))  # v = mantissa * 2^exponent, exact
    ceil_log2 = np.where(mantissa == 0.5, exponent - 1, exponent)  # exact powers of two
    e = np.clip(ceil_log2 + 127, 0, 254).astype(np.uint8)
    e[v == 0] = 0
    e[np.isinf(v)] = 254
    e[np.isnan(v)] = 255
    return e


def quantize_factor(e: np.ndarray) -> np.ndarray:
    """2^(127 - e) as float32 (exact, subnormal 2^-127 for e = 254)."""
    return np.exp2(127.0 - np.asarray(e, np.float64)).astype(np.float32)


def _abs_no_nan(x: np.ndarray) -> np.ndarray:
    a = np.abs(np.asarray(x).astype(np.float32))
    a[np.isnan(a)] = 0  # amax skips NaN
    return a


def block_exponents(x2d: np.ndarray, fmt: str, blocks: str) -> np.ndarray:
    """E8M0 bytes per block of a [M, K] matrix.

    blocks: "rowwise" -> [M, K/32], "columnwise" -> [M/32, K], "2d" -> [M/32, K/32].
    """
    a = _abs_no_nan(x2d)
    m, k = a.shape
    if blocks == "rowwise":
        amax = a.reshape(m, k // BLOCK, BLOCK).max(axis=2, initial=0)
    elif blocks == "columnwise":
        amax = a.reshape(m // BLOCK, BLOCK, k).max(axis=1, initial=0)
    else:
        amax = a.reshape(m // BLOCK, BLOCK, k // BLOCK, BLOCK).max(axis=(1, 3), initial=0)
    return e8m0_round_up(amax.astype(np.float32) * max_reciprocal(fmt))


def expand_to_elements(e: np.ndarray, blocks: str) -> np.ndarray:
    """Block bytes repeated over the [M, K] elements they scale."""
    if blocks == "rowwise":
        return np.repeat(e, BLOCK, axis=1)
    if blocks == "columnwise":
        return np.repeat(e, BLOCK, axis=0)
    return np.repeat(np.repeat(e, BLOCK, axis=0), BLOCK, axis=1)


def pad_scales(e: np.ndarray, m: int, k: int, columnwise: bool) -> np.ndarray:
    """Compact block bytes in the padded scale buffer (padding 0), as E8M0."""
    if columnwise:
        shape = (round_up(m // BLOCK, 4), round_up(k, 128))
    else:
        shape = (round_up(m, 128), round_up(k // BLOCK, 4))
    out = np.zeros(shape, np.uint8)
    out[: e.shape[0], : e.shape[1]] = e
    return out.view(E8M0)


def quantize_mxfp8(
    x: np.ndarray, fmt: str, columnwise: bool = False, use_2d_blocks: bool = False, swizzled: bool = False
):
    """(data bytes of x's shape, padded E8M0 scales) of one direction.

    With use_2d_blocks one scale per 32x32 tile scales the data; the scale
    buffer repeats it over the tile's 32 rows (rowwise layout) or 32 columns
    (columnwise layout).
    """
    x = np.asarray(x)
    k = x.shape[-1]
    x2d = x.reshape(-1, k).astype(np.float32)
    m = x2d.shape[0]
    blocks = "2d" if use_2d_blocks else ("columnwise" if columnwise else "rowwise")
    e = block_exponents(x2d, fmt, blocks)
    with np.errstate(over="ignore", invalid="ignore"):
        q = cast_to_fp8_bytes(x2d * quantize_factor(expand_to_elements(e, blocks)), fmt)
    if use_2d_blocks:
        e = np.repeat(e, BLOCK, axis=1 if columnwise else 0)
    scales = pad_scales(e, m, k, columnwise)
    if swizzled:
        scales = swizzle(scales, columnwise)
    return q.reshape(x.shape), scales


def swizzle(scales: np.ndarray, columnwise: bool = False) -> np.ndarray:
    """Compact [R, C] -> the cuBLAS 128x4-tile layout, same shape and dtype.

    Row r = 128*tr + 32*a + b and scale j = 4*tc + d go to tile (tr, tc), offset
    16*b + 4*a + d. Columnwise scales are swizzled as their transpose.
    """
    s = np.asarray(scales)
    t = s.T if columnwise else s
    rows, cols = t.shape
    tiles = t.reshape(rows // 128, 4, 32, cols // 4, 4)  # [tr, a, b, tc, d]
    return np.ascontiguousarray(tiles.transpose(0, 3, 2, 1, 4)).reshape(s.shape)


def unswizzle(scales: np.ndarray, columnwise: bool = False) -> np.ndarray:
    """Inverse of swizzle."""
    s = np.asarray(scales)
    rows, cols = (s.shape[1], s.shape[0]) if columnwise else s.shape
    tiles = s.reshape(rows // 128, cols // 4, 32, 4, 4)  # [tr, tc, b, a, d]
    t = np.ascontiguousarray(tiles.transpose(0, 3, 2, 1, 4)).reshape(rows, cols)
    return np.ascontiguousarray(t.T) if columnwise else t


def dequantize_mxfp8(
    q_bytes: np.ndarray,
    scales: np.ndarray,
    fmt: str,
    columnwise: bool = False,
    swizzled: bool = False,
    out_dtype=np.float32,
) -> np.ndarray:
    """float32(q) * 2^(e - 127), rounded to out_dtype."""
    q = np.asarray(q_bytes).view(np.uint8)
    k = q.shape[-1]
    q2d = q.reshape(-1, k)
    m = q2d.shape[0]
    compact = unswizzle(scales, columnwise) if swizzled else np.asarray(scales)
    if columnwise:
        e = np.repeat(compact[: m // BLOCK, :k], BLOCK, axis=0)
    else:
        e = np.repeat(compact[:m, : k // BLOCK], BLOCK, axis=1)
    decode = e.view(np.uint8).view(E8M0).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # e = 254 can overflow to inf, as in C
        values = q2d.view(FP8_NUMPY[fmt]).astype(np.float32) * decode
        return values.astype(out_dtype).reshape(q.shape)
