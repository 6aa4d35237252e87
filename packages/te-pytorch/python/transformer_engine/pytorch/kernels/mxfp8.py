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
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_engine.core import DType, lib
from transformer_engine.core.mxfp8 import mxfp8_scale_shape

from ._common import run_dequantizer, run_quantizer, te_op
from .cast import _check_fp8

E8M0 = int(DType.kFloat8E8M0)


def _outputs(shape, rowwise: bool, columnwise: bool):
    """(shape, uint8) of (row, row_scale, col, col_scale); None = not requested."""
    out = []
    for wanted, is_col in ((rowwise, False), (columnwise, True)):
        out += [(shape, torch.uint8), (mxfp8_scale_shape(shape, is_col), torch.uint8)] if wanted else [None, None]
    return tuple(out)


@te_op("quantize_mxfp8", shapes=lambda a: _outputs(a.x.shape, a.rowwise, a.columnwise))
def quantize_mxfp8(
    x: Tensor,
    fp8_dtype: int,
    rowwise: bool = True,
    columnwise: bool = False,
    use_2d_blocks: bool = False,
    swizzled_scales: bool = False,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """MXFP8-quantize x; returns (row | None, row_scale | None, col | None, col_scale | None), all uint8."""
    _check_fp8(fp8_dtype)
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    specs = _outputs(x.shape, rowwise, columnwise)
    codes = (fp8_dtype, E8M0, fp8_dtype, E8M0)
    return run_quantizer(lib.quantize_mxfp8, x, specs, codes, use_2d_blocks, swizzled_scales)


@te_op("dequantize_mxfp8", shapes=lambda a: (a.data.shape, a.out_dtype))
def dequantize_mxfp8(
    data: Tensor,
    scale_inv: Tensor,
    fp8_dtype: int,
    columnwise: bool = False,
    swizzled_scales: bool = False,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """q * 2^(e - 127) per block, rounded to out_dtype; data's shape."""
    _check_fp8(fp8_dtype)
    flags = (columnwise, swizzled_scales)
    return run_dequantizer(lib.dequantize_mxfp8, data, fp8_dtype, scale_inv, E8M0, out_dtype, *flags)
