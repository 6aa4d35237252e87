"""FP8 block-scaling ops (Float8BlockScaling): torch.ops.te.quantize_fp8_block
and torch.ops.te.dequantize_fp8_block.

Numerics are te-core's (core/include/te/fp8_block.h): per block of 1x128
(rowwise), 128x1 (columnwise) or 128x128 (block_dim 2) elements of the [M, K]
view,
    s = scale_from_amax(block amax),  q = saturate(RNE(x * s)),  scale_inv = 1 / s
Only the GEMM-ready layout is used here: columnwise data is the [K, M]
transpose, scales FP32 in the shapes lib.fp8_block_scale_shape gives.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_engine.core import lib

from ._common import FLOAT32, matrix_t_shape, run_dequantizer, run_quantizer, te_op
from .cast import _check_fp8

GEMM_READY = 0


def _check_block_dim(block_dim: int) -> None:
    if block_dim not in (1, 2):
        raise ValueError(f"block_dim must be 1 (1x128 blocks) or 2 (128x128 blocks), got {block_dim!r}")


def _scale_shape(shape, block_dim: int, columnwise: bool) -> tuple:
    cols, rows = matrix_t_shape(shape)
    return tuple(lib.fp8_block_scale_shape(rows, cols, block_dim, GEMM_READY, columnwise))


def _outputs(shape, rowwise, columnwise, block_dim):
    """(shape, dtype) of (row, row_scale, col, col_scale); None = not requested."""
    row = ((shape, torch.uint8), (_scale_shape(shape, block_dim, False), torch.float32))
    col = ((matrix_t_shape(shape), torch.uint8), (_scale_shape(shape, block_dim, True), torch.float32))
    return (*(row if rowwise else (None, None)), *(col if columnwise else (None, None)))


@te_op("quantize_fp8_block", shapes=lambda a: _outputs(a.x.shape, a.rowwise, a.columnwise, a.block_dim))
def quantize_fp8_block(
    x: Tensor,
    fp8_dtype: int,
    block_dim: int = 1,
    rowwise: bool = True,
    columnwise: bool = False,
    force_pow2_scales: bool = True,
    amax_epsilon: float = 0.0,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """Returns (row uint8 | None, row_scale FP32 | None, col uint8 [K, M] | None, col_scale FP32 | None)."""
    _check_fp8(fp8_dtype)
    _check_block_dim(block_dim)
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    specs = _outputs(x.shape, rowwise, columnwise, block_dim)
    codes = (fp8_dtype, FLOAT32, fp8_dtype, FLOAT32)
    flags = (block_dim, GEMM_READY, force_pow2_scales, amax_epsilon)
    return run_quantizer(lib.fp8_block_quantize, x, specs, codes, *flags)


@te_op("dequantize_fp8_block", shapes=lambda a: (a.data.shape, a.out_dtype))
def dequantize_fp8_block(
    data: Tensor,
    scale_inv: Tensor,
    fp8_dtype: int,
    block_dim: int = 1,
    columnwise: bool = False,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """float32(q) * its block's scale_inv, rounded to out_dtype; data's stored shape ([K, M] when columnwise)."""
    _check_fp8(fp8_dtype)
    _check_block_dim(block_dim)
    flags = (block_dim, GEMM_READY, columnwise)
    return run_dequantizer(lib.fp8_block_dequantize, data, fp8_dtype, scale_inv, FLOAT32, out_dtype, *flags)
