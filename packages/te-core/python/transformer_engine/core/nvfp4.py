"""NVFP4 quantization on NumPy arrays (the CPU backend of the core).

Formulas, layouts and rounding rules are in core/include/te/nvfp4.h and
docs/numerics.md. In short, for a tensor viewed as [M, K] (K = last dim):

    S_enc = min(2688 / amax, FLT_MAX)  (1 when amax is 0 or inf),  S_dec = 1 / S_enc
    s_b   = e4m3(block_amax * (S_enc * (1/6)))        one E4M3 scale per 16 elements
    q     = e2m1(x * min(1 / (s_b * S_dec), FLT_MAX))  nearest-even or stochastic

Packed data is returned as uint8 arrays, two E2M1 codes per byte with element
2i in the low nibble; `unpack_fp4` turns them into ml_dtypes float4_e2m1fn.
The rowwise copy has the input's shape with the last dim halved; the
columnwise copy is the [K, M] transpose ([K, M/2] bytes).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from ._arrays import as_high_precision, desc, fp32_scalar, matrix_shape
from ._checks import contiguous, flag, integer
from ._native import lib
from .dtypes import DType

BLOCK = 16
# The reference library's fixed RHT signs (S_i = -1 where bit i is set):
# [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1].
RHT_SIGN_MASK = 0xD7E8


class Nvfp4Tensor(NamedTuple):
    """Result of an NVFP4 quantization (missing directions are None)."""

    shape: tuple  # logical shape of the input
    rowwise: np.ndarray | None  # uint8, shape[:-1] + (K/2,)
    rowwise_scale: np.ndarray | None  # float8_e4m3fn [roundup(M,128), roundup(K/16,4)]
    amax_rowwise: np.ndarray  # FP32 scalar the rowwise copy was scaled with
    columnwise: np.ndarray | None  # uint8 [K, M/2]
    columnwise_scale: np.ndarray | None  # float8_e4m3fn [roundup(K,128), roundup(M/16,4)]
    amax_columnwise: np.ndarray  # FP32 scalar (post-RHT amax with the RHT)


def scale_shape(rows: int, cols: int) -> tuple[int, int]:
    """Padded E4M3 scale-buffer shape for data [rows, cols] (blocks along cols)."""
    return (-(-rows // 128) * 128, -(-(cols // BLOCK) // 4) * 4)


def _fp4_desc(packed: np.ndarray) -> lib.TensorDesc:
    """Descriptor of packed bytes [..., n] as the FP4 tensor [..., 2n]."""
    if packed.dtype != np.uint8 or not packed.flags.c_contiguous:
        raise TypeError("packed FP4 data must be a C-contiguous uint8 array")
    shape = list(packed.shape[:-1]) + [2 * packed.shape[-1]] if packed.ndim else [2]
    return lib.TensorDesc(packed.ctypes.data, int(DType.kFloat4E2M1), shape, 0, 0)


def _scale_array(rows: int, cols: int) -> np.ndarray:
    return np.empty(scale_shape(rows, cols), ml_dtypes.float8_e4m3fn)


def _check_mask(mask: int) -> int:
    mask = integer(mask, "rht_sign_mask")
    if not 0 <= mask <= 0xFFFF:
        raise ValueError(f"argument 'rht_sign_mask' must be a 16-bit mask (0..0xFFFF), got {mask:#x}")
    return mask


def compute_amax_nvfp4(x, *, random_hadamard=False, rht_sign_mask=RHT_SIGN_MASK):
    """(amax_rowwise, amax_columnwise); the latter is ``max |RHT(x)|`` with the RHT."""
    x = as_high_precision(x, "x")
    row = np.zeros((), np.float32)
    col = np.zeros((), np.float32)
    lib.nvfp4_compute_amax(
        desc(x), desc(row), desc(col), flag(random_hadamard, "random_hadamard"), _check_mask(rht_sign_mask)
    )
    return row[()], col[()]


def quantize_nvfp4(
    x,
    *,
    rowwise=True,
    columnwise=False,
    block_2d=False,
    stochastic_rounding=False,
    seed=0,
    offset=0,
    random_hadamard=False,
    rht_sign_mask=RHT_SIGN_MASK,
    amax_rowwise=None,
    amax_columnwise=None,
) -> Nvfp4Tensor:
    """Quantize x (FP32/BF16/FP16, last dim % 16 == 0) to NVFP4.

    The global amaxes default to those of x (compute_amax_nvfp4); pass them to
    use e.g. all-reduced values. Stochastic rounding draws from the Philox
    stream of (seed, offset); the RHT applies to the columnwise copy only.
    """
    rowwise, columnwise = flag(rowwise, "rowwise"), flag(columnwise, "columnwise")
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    x = as_high_precision(x, "x")
    mask = _check_mask(rht_sign_mask)
    if amax_rowwise is None or amax_columnwise is None:
        row_amax, col_amax = compute_amax_nvfp4(x, random_hadamard=random_hadamard and columnwise, rht_sign_mask=mask)
        amax_rowwise = row_amax if amax_rowwise is None else amax_rowwise
        amax_columnwise = col_amax if amax_columnwise is None else amax_columnwise
    amax_row = fp32_scalar(amax_rowwise, "amax_rowwise")
    amax_col = fp32_scalar(amax_columnwise, "amax_columnwise")
    rows, cols = matrix_shape(x.shape)
    row_data = row_scale = col_data = col_scale = None
    if rowwise:
        row_data = np.empty(x.shape[:-1] + (cols // 2,), np.uint8)
        row_scale = _scale_array(rows, cols)
    if columnwise:
        col_data = np.empty((cols, rows // 2), np.uint8)
        col_scale = _scale_array(cols, rows)
    words = [integer(seed, "seed", low=0, high=2**64 - 1), integer(offset, "offset", low=0, high=2**64 - 1)]
    rng_state = np.array(words, dtype=np.uint64).view(np.int64)

    def data_desc(array):
        return None if array is None else _fp4_desc(array)

    def scale_desc(array):
        return None if array is None else desc(array)

    lib.nvfp4_quantize(
        desc(x),
        desc(amax_row) if rowwise else None,
        data_desc(row_data),
        scale_desc(row_scale),
        desc(amax_col) if columnwise else None,
        data_desc(col_data),
        scale_desc(col_scale),
        block_2d=flag(block_2d, "block_2d"),
        stochastic_rounding=flag(stochastic_rounding, "stochastic_rounding"),
        random_hadamard=flag(random_hadamard, "random_hadamard"),
        rht_sign_mask=mask,
        rng_state=desc(rng_state) if stochastic_rounding else None,
    )
    return Nvfp4Tensor(tuple(x.shape), row_data, row_scale, amax_row, col_data, col_scale, amax_col)


def dequantize_nvfp4(data, scale, amax, out_dtype=np.float32) -> np.ndarray:
    """Packed data [..., B/2] with its scale buffer and global amax -> [..., B]."""
    data = contiguous(_fp4_bytes(data, "data"), "data")
    scale = contiguous(scale, "scale")
    if scale.dtype != np.dtype(ml_dtypes.float8_e4m3fn):
        raise TypeError(f"argument 'scale' must be float8_e4m3fn, got {scale.dtype}")
    amax = fp32_scalar(amax, "amax")
    out = np.empty(data.shape[:-1] + (2 * data.shape[-1],), out_dtype)
    lib.nvfp4_dequantize(_fp4_desc(data), desc(scale), desc(amax), desc(out))
    return out


def transpose_nvfp4_2d(rowwise, rowwise_scale):
    """(columnwise, columnwise_scale) of 2-D (16x16) quantized rowwise data."""
    rowwise = contiguous(_fp4_bytes(rowwise, "rowwise"), "rowwise")
    rowwise_scale = contiguous(rowwise_scale, "rowwise_scale")
    rows, cols = matrix_shape(rowwise.shape[:-1] + (2 * rowwise.shape[-1],))
    col_data = np.empty((cols, rows // 2), np.uint8)
    col_scale = _scale_array(cols, rows)
    lib.nvfp4_transpose_2d(_fp4_desc(rowwise), desc(rowwise_scale), _fp4_desc(col_data), desc(col_scale))
    return col_data, col_scale


def unpack_fp4(packed) -> np.ndarray:
    """uint8 [..., n] -> float4_e2m1fn [..., 2n] (element 2i from the low nibble)."""
    packed = _fp4_bytes(packed, "packed")
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[:-1] + (-1,))
    return codes.view(ml_dtypes.float4_e2m1fn)


def _fp4_bytes(packed, name: str) -> np.ndarray:
    array = np.asarray(packed)
    if array.ndim == 0:
        raise ValueError(f"argument '{name}' must have at least 1 dim (bytes along the last), got a 0-d array")
    if array.dtype != np.uint8:
        raise TypeError(f"argument '{name}' must be uint8 (two FP4 codes per byte), got {array.dtype}")
    return array


def pack_fp4(values) -> np.ndarray:
    """float4_e2m1fn (or codes) [..., 2n] -> uint8 [..., n]."""
    codes = np.asarray(values)
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(
            "argument 'values' must have at least 1 dim and an even last dim (two codes per byte), "
            f"got shape {codes.shape}"
        )
    if codes.dtype == np.dtype(ml_dtypes.float4_e2m1fn):
        codes = codes.view(np.uint8)
    elif codes.dtype.kind not in "iu":
        raise TypeError(f"argument 'values' must be float4_e2m1fn or integer codes 0..15, got {codes.dtype}")
    codes = codes.astype(np.uint8) & 0xF
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def rht_sign_mask_from_seed(seed: int) -> int:
    """A 16-bit RHT sign mask from a seed: the low 16 bits of word 0 of the
    Philox4x32-10 stream (seed, offset 0), i.e. of Philox(counter 0, key seed)."""
    m0, m1, w0, w1, full = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF
    c = [0, 0, 0, 0]
    seed = integer(seed, "seed", low=0, high=2**64 - 1)
    k = [seed & full, (seed >> 32) & full]
    for r in range(10):
        if r:
            k = [(k[0] + w0) & full, (k[1] + w1) & full]
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & full, (p0 >> 32) ^ c[3] ^ k[1], p0 & full]
    return c[0] & 0xFFFF
