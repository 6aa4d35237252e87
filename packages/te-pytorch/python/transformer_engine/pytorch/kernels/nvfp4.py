"""NVFP4 ops: torch.ops.te.quantize_nvfp4 and torch.ops.te.dequantize_nvfp4.

Numerics are te-core's (core/include/te/nvfp4.h); for x viewed as [M, K]:
    S_enc = min(2688 / amax, FLT_MAX) (1 when amax is 0 or inf),  S_dec = 1 / S_enc
    s_b   = e4m3(block_amax * (S_enc * (1/6)))    one E4M3 scale per 16 elements
    q     = e2m1(x * min(1 / (s_b * S_dec), FLT_MAX)),   x' = q * s_b * S_dec
Packed data is uint8, two E2M1 codes per byte (element 2i in the low nibble):
rowwise [..., K/2], columnwise the [K, M] transpose as [K, M/2]. Scales are
uint8 E4M3 bytes [roundup(rows,128), roundup(cols/16,4)] of the stored matrix.
block_2d uses 16x16 tiles (weights); random_hadamard transforms the
columnwise copy (and its amax); stochastic_rounding draws Philox words from
rng_state, an int64 [2] tensor (seed, offset) on x's device.
"""

from __future__ import annotations

import torch

from transformer_engine.core import DType, lib
from transformer_engine.core.nvfp4 import scale_shape

from ._common import compiling, contiguous, desc, hp_desc, matrix_t_shape, scalar_desc, stream_of
from .cast import _or_empty

FP4, E4M3, INT64 = int(DType.kFloat4E2M1), int(DType.kFloat8E4M3), int(DType.kInt64)


def fp4_desc(packed: torch.Tensor):
    """Descriptor of packed bytes [..., n] as the FP4 tensor [..., 2n]."""
    return _fp4(packed, (*packed.shape[:-1], 2 * packed.shape[-1]))


def _fp4(packed, shape):
    if packed.is_cuda:
        return lib.TensorDesc(packed.data_ptr(), FP4, shape, 1, packed.device.index)
    return lib.TensorDesc(packed.data_ptr(), FP4, shape, 0, 0)


def _outputs(x, rowwise, columnwise, alloc):
    """(row, row_scale, col, col_scale, amaxes FP32 [2]); None = not requested."""
    cols, rows = matrix_t_shape(x.shape)
    row = (alloc((*x.shape[:-1], cols // 2), torch.uint8), alloc(scale_shape(rows, cols), torch.uint8))
    col = (alloc((cols, rows // 2), torch.uint8), alloc(scale_shape(cols, rows), torch.uint8))
    return [*(row if rowwise else (None, None)), *(col if columnwise else (None, None)), alloc((2,), torch.float32)]


def _check_mask(mask: int) -> None:
    if not 0 <= mask <= 0xFFFF:
        raise ValueError(f"rht_sign_mask must be a 16-bit mask (0..0xFFFF), got {mask:#x}")


def _quantize_nvfp4(x, rowwise, columnwise, block_2d, stochastic_rounding, random_hadamard, rht_sign_mask, rng, amax):
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    _check_mask(rht_sign_mask)
    if stochastic_rounding and (rng is None or rng.dtype != torch.int64 or rng.numel() != 2):
        raise ValueError("stochastic_rounding needs 'rng_state': an int64 tensor of 2 elements (seed, offset)")
    x = contiguous(x)
    row, row_s, col, col_s, amaxes = _outputs(
        x, rowwise, columnwise, lambda s, d: torch.empty(s, dtype=d, device=x.device)
    )
    stream = stream_of(x)
    rht = random_hadamard and columnwise
    if amax is None:
        lib.nvfp4_compute_amax(
            hp_desc(x, "x"), scalar_desc(amaxes, 0), scalar_desc(amaxes, 1), rht, rht_sign_mask, stream
        )
    else:
        if amax.dtype != torch.float32 or amax.numel() != 2:
            raise ValueError("argument 'amax' must be an FP32 tensor of 2 elements (rowwise, columnwise amax)")
        amaxes.copy_(amax.reshape(2))
    lib.nvfp4_quantize(
        hp_desc(x, "x"),
        scalar_desc(amaxes, 0) if rowwise else None,
        None if row is None else _fp4(row, x.shape),
        None if row_s is None else desc(row_s, E4M3),
        scalar_desc(amaxes, 1) if columnwise else None,
        None if col is None else _fp4(col, (col.shape[0], 2 * col.shape[1])),
        None if col_s is None else desc(col_s, E4M3),
        block_2d,
        stochastic_rounding,
        rht,
        rht_sign_mask,
        desc(contiguous(rng), INT64) if stochastic_rounding else None,
        stream,
    )
    return [row, row_s, col, col_s, amaxes]


@torch.library.custom_op("te::quantize_nvfp4", mutates_args=())
def _quantize_nvfp4_op(
    x: torch.Tensor,
    rowwise: bool,
    columnwise: bool,
    block_2d: bool,
    stochastic_rounding: bool,
    random_hadamard: bool,
    rht_sign_mask: int,
    rng_state: torch.Tensor | None,
    amax: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    outs = _quantize_nvfp4(
        x, rowwise, columnwise, block_2d, stochastic_rounding, random_hadamard, rht_sign_mask, rng_state, amax
    )
    return tuple(_or_empty(t, x) for t in outs)


@_quantize_nvfp4_op.register_fake
def _(x, rowwise, columnwise, block_2d, stochastic_rounding, random_hadamard, rht_sign_mask, rng_state, amax):
    outs = _outputs(x, rowwise, columnwise, lambda s, d: x.new_empty(s, dtype=d))
    return tuple(_or_empty(t, x) for t in outs)


def quantize_nvfp4(
    x,
    rowwise: bool = True,
    columnwise: bool = False,
    block_2d: bool = False,
    stochastic_rounding: bool = False,
    random_hadamard: bool = False,
    rht_sign_mask: int = 0,
    rng_state=None,
    amax=None,
):
    """NVFP4-quantize x. amax: FP32 [2] (rowwise, columnwise global amax), or None
    to use x's own (post-RHT for columnwise with random_hadamard).

    Returns [row | None, row_scale | None, col | None, col_scale | None, amaxes FP32 [2]].
    """
    args = (x, rowwise, columnwise, block_2d, stochastic_rounding, random_hadamard, int(rht_sign_mask), rng_state, amax)
    if compiling():
        outs = list(torch.ops.te.quantize_nvfp4(*args))
        keep = (rowwise, rowwise, columnwise, columnwise, True)
        return [t if k else None for t, k in zip(outs, keep)]
    return _quantize_nvfp4(*args)


def _dequantize_nvfp4(data, scale, amax, out_dtype):
    if data.dtype != torch.uint8 or scale.dtype != torch.uint8:
        raise TypeError("arguments 'data' and 'scale' must be uint8 (packed E2M1 codes and E4M3 bytes)")
    data, scale = contiguous(data), contiguous(scale)
    out = torch.empty((*data.shape[:-1], 2 * data.shape[-1]), dtype=out_dtype, device=data.device)
    lib.nvfp4_dequantize(
        _fp4(data, out.shape),
        desc(scale, E4M3),
        scalar_desc(contiguous(amax.reshape(-1).to(torch.float32)), 0),
        hp_desc(out, "out_dtype"),
        stream_of(data),
    )
    return out


@torch.library.custom_op("te::dequantize_nvfp4", mutates_args=())
def _dequantize_nvfp4_op(
    data: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    return _dequantize_nvfp4(data, scale, amax, out_dtype)


@_dequantize_nvfp4_op.register_fake
def _(data, scale, amax, out_dtype):
    return data.new_empty((*data.shape[:-1], 2 * data.shape[-1]), dtype=out_dtype)


def dequantize_nvfp4(data, scale, amax, out_dtype=torch.float32) -> torch.Tensor:
    """Packed data [..., B/2] with its E4M3 scales and FP32 global amax (one element) -> [..., B]."""
    if compiling():
        return torch.ops.te.dequantize_nvfp4(data, scale, amax, out_dtype)
    return _dequantize_nvfp4(data, scale, amax, out_dtype)
