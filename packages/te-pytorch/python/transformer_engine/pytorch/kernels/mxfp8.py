"""MXFP8 ops: torch.ops.te.quantize_mxfp8 and torch.ops.te.dequantize_mxfp8.

Numerics are te-core's (core/include/te/mxfp8.h): one E8M0 exponent e per
block of 32 elements (1x32 rowwise, 32x1 columnwise; one 32x32 tile for both
with use_2d_blocks),
    e = e8m0_round_up(amax_block * (1 / fp8_max)),   q = fp8(x * 2^(127 - e)),
    x' = q * 2^(e - 127)
A tensor is viewed as [M, K] (K = last dim). Both copies keep the input's
shape (MXFP8 never transposes). Scales are uint8 E8M0 bytes padded to
[roundup(M,128), roundup(K/32,4)] (rowwise) and [roundup(M/32,4),
roundup(K,128)] (columnwise); swizzled_scales writes the GEMM tile order.
Eager calls run the implementation directly, torch.compile the registered op
(the pattern of cast.py).
"""

from __future__ import annotations

import torch

from transformer_engine.core import DType, lib
from transformer_engine.core.mxfp8 import mxfp8_scale_shape

from ._common import compiling, contiguous, desc, hp_desc, stream_of
from .cast import _check_fp8, _or_empty

E8M0 = int(DType.kFloat8E8M0)


def _outputs(x: torch.Tensor, rowwise: bool, columnwise: bool, alloc):
    """(row, row_scale, col, col_scale); alloc(shape) makes a uint8 tensor, None = not requested."""
    out = []
    for wanted, is_col in ((rowwise, False), (columnwise, True)):
        out += [alloc(x.shape) if wanted else None, alloc(mxfp8_scale_shape(x.shape, is_col)) if wanted else None]
    return out


def _quantize_mxfp8(x, fp8_dtype, rowwise, columnwise, use_2d_blocks, swizzled_scales):
    _check_fp8(fp8_dtype)
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    x = contiguous(x)
    outs = _outputs(x, rowwise, columnwise, lambda s: torch.empty(s, dtype=torch.uint8, device=x.device))
    codes = (fp8_dtype, E8M0, fp8_dtype, E8M0)
    lib.quantize_mxfp8(
        hp_desc(x, "x"),
        *(None if t is None else desc(t, c) for t, c in zip(outs, codes)),
        use_2d_blocks,
        swizzled_scales,
        stream_of(x),
    )
    return outs


@torch.library.custom_op("te::quantize_mxfp8", mutates_args=())
def _quantize_mxfp8_op(
    x: torch.Tensor, fp8_dtype: int, rowwise: bool, columnwise: bool, use_2d_blocks: bool, swizzled_scales: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    outs = _quantize_mxfp8(x, fp8_dtype, rowwise, columnwise, use_2d_blocks, swizzled_scales)
    return tuple(_or_empty(t, x) for t in outs)


@_quantize_mxfp8_op.register_fake
def _(x, fp8_dtype, rowwise, columnwise, use_2d_blocks, swizzled_scales):
    outs = _outputs(x, rowwise, columnwise, lambda s: x.new_empty(s, dtype=torch.uint8))
    return tuple(_or_empty(t, x) for t in outs)


def quantize_mxfp8(
    x, fp8_dtype: int, rowwise: bool = True, columnwise: bool = False, use_2d_blocks=False, swizzled_scales=False
):
    """MXFP8-quantize x; returns (row | None, row_scale | None, col | None, col_scale | None), all uint8."""
    if compiling():
        outs = torch.ops.te.quantize_mxfp8(x, fp8_dtype, rowwise, columnwise, use_2d_blocks, swizzled_scales)
        keep = (rowwise, rowwise, columnwise, columnwise)
        return [t if k else None for t, k in zip(outs, keep)]
    return _quantize_mxfp8(x, fp8_dtype, rowwise, columnwise, use_2d_blocks, swizzled_scales)


def _dequantize_mxfp8(data, scale_inv, fp8_dtype, columnwise, swizzled_scales, out_dtype):
    _check_fp8(fp8_dtype)
    data, scale_inv = contiguous(data), contiguous(scale_inv)
    out = torch.empty(data.shape, dtype=out_dtype, device=data.device)
    lib.dequantize_mxfp8(
        desc(data, fp8_dtype),
        desc(scale_inv, E8M0),
        hp_desc(out, "out_dtype"),
        columnwise,
        swizzled_scales,
        stream_of(data),
    )
    return out


@torch.library.custom_op("te::dequantize_mxfp8", mutates_args=())
def _dequantize_mxfp8_op(
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    fp8_dtype: int,
    columnwise: bool,
    swizzled_scales: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return _dequantize_mxfp8(data, scale_inv, fp8_dtype, columnwise, swizzled_scales, out_dtype)


@_dequantize_mxfp8_op.register_fake
def _(data, scale_inv, fp8_dtype, columnwise, swizzled_scales, out_dtype):
    return data.new_empty(data.shape, dtype=out_dtype)


def dequantize_mxfp8(data, scale_inv, fp8_dtype: int, columnwise=False, swizzled_scales=False, out_dtype=torch.float32):
    """q * 2^(e - 127) per block, rounded to out_dtype; data's shape."""
    if compiling():
        return torch.ops.te.dequantize_mxfp8(data, scale_inv, fp8_dtype, columnwise, swizzled_scales, out_dtype)
    return _dequantize_mxfp8(data, scale_inv, fp8_dtype, columnwise, swizzled_scales, out_dtype)
