"""The GEMM ("swizzled") layout of one-byte block scales (MXFP8 E8M0, NVFP4 E4M3).

cuBLASLt reads block scales in 128x4 tiles (core/include/te/swizzle.h). A
compact [R, C] scale matrix (R % 128 == 0, C % 4 == 0) is stored tile by tile
(tiles row-major over [R/128, C/4], 512 bytes each); inside a tile, row r and
scale j sit at (r % 32) * 16 + (r % 128 // 32) * 4 + j % 4. Columnwise scales
([M/32 padded to 4, K padded to 128]) are swizzled as their transpose.
"""

from __future__ import annotations

import numpy as np

from ._arrays import desc
from ._checks import contiguous, flag
from ._native import lib

_ONE_BYTE_KINDS = ("uint8", "float8_e8m0fnu", "float8_e4m3fn", "float8_e5m2")


def _scales(scales, name: str) -> np.ndarray:
    array = contiguous(scales, "scales")
    if array.dtype.name not in _ONE_BYTE_KINDS:
        raise TypeError(
            f"argument '{name}' must hold one-byte block scales ({', '.join(_ONE_BYTE_KINDS)}), got {array.dtype}"
        )
    return array


def swizzle_block_scales(scales, *, columnwise: bool = False) -> np.ndarray:
    """Compact padded scales -> the GEMM layout (same dtype and shape)."""
    scales = _scales(scales, "scales")
    out = np.empty_like(scales)
    lib.swizzle_block_scales(desc(scales), desc(out), flag(columnwise, "columnwise"))
    return out


def unswizzle_block_scales(scales, *, columnwise: bool = False) -> np.ndarray:
    """The GEMM layout -> compact padded scales (inverse of swizzle_block_scales)."""
    scales = _scales(scales, "scales")
    out = np.empty_like(scales)
    lib.unswizzle_block_scales(desc(scales), desc(out), flag(columnwise, "columnwise"))
    return out
