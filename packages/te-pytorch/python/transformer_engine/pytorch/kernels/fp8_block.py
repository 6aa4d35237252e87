"""FP8 block-scaling ops (Float8BlockScaling): torch.ops.te.quantize_fp8_block
and torch.ops.te.dequantize_fp8_block.

Numerics are te-core's (core/include/te/fp8_block.h): per block of 1x128
(rowwise), 128x1 (columnwise) or 128x128 (block_dim 2) elements of the [M, K]
view,
    s = scale_from_amax(block amax),  q = saturate(RNE(x * s)),  scale_inv = 1 / s
Only the GEMM-ready layout is used here: columnwise data is the [K, M]
transpose, scales FP32 in the shapes lib.fp8_block_scale_shape gives.
Eager calls run the implementation directly, torch.compile the registered op.
"""

from __future__ import annotations

import torch

from transformer_engine.core import lib

from ._common import FLOAT32, compiling, contiguous, desc, hp_desc, matrix_t_shape, stream_of
from .cast import _check_fp8, _or_empty

GEMM_READY = 0


def _check_block_dim(block_dim: int) -> None:
    if block_dim not in (1, 2):
        raise ValueError(f"block_dim must be 1 (1x128 blocks) or 2 (128x128 blocks), got {block_dim!r}")


def _scale_shape(shape, block_dim: int, columnwise: bool) -> tuple:
    cols, rows = matrix_t_shape(shape)
    return tuple(lib.fp8_block_scale_shape(rows, cols, block_dim, GEMM_READY, columnwise))


def _outputs(x, rowwise, columnwise, block_dim, alloc):
    """(row, row_scale, col, col_scale); alloc(shape, dtype) allocates; None = not requested."""
    row = (alloc(x.shape, torch.uint8), alloc(_scale_shape(x.shape, block_dim, False), torch.float32))
    col = (alloc(matrix_t_shape(x.shape), torch.uint8), alloc(_scale_shape(x.shape, block_dim, True), torch.float32))
    return [*(row if rowwise else (None, None)), *(col if columnwise else (None, None))]


def _quantize_fp8_block(x, fp8_dtype, block_dim, rowwise, columnwise, force_pow2_scales, amax_epsilon):
    _check_fp8(fp8_dtype)
    _check_block_dim(block_dim)
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    x = contiguous(x)
    outs = _outputs(x, rowwise, columnwise, block_dim, lambda s, d: torch.empty(s, dtype=d, device=x.device))
    codes = (fp8_dtype, FLOAT32, fp8_dtype, FLOAT32)
    lib.fp8_block_quantize(
        hp_desc(x, "x"),
        *(None if t is None else desc(t, c) for t, c in zip(outs, codes)),
        block_dim,
        GEMM_READY,
        force_pow2_scales,
        amax_epsilon,
        stream_of(x),
    )
    return outs


@torch.library.custom_op("te::quantize_fp8_block", mutates_args=())
def _quantize_fp8_block_op(
    x: torch.Tensor,
    fp8_dtype: int,
    block_dim: int,
    rowwise: bool,
    columnwise: bool,
    force_pow2_scales: bool,
    amax_epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    outs = _quantize_fp8_block(x, fp8_dtype, block_dim, rowwise, columnwise, force_pow2_scales, amax_epsilon)
    return tuple(_or_empty(t, x) for t in outs)


@_quantize_fp8_block_op.register_fake
def _(x, fp8_dtype, block_dim, rowwise, columnwise, force_pow2_scales, amax_epsilon):
    outs = _outputs(x, rowwise, columnwise, block_dim, lambda s, d: x.new_empty(s, dtype=d))
    return tuple(_or_empty(t, x) for t in outs)


def quantize_fp8_block(
    x,
    fp8_dtype: int,
    block_dim: int = 1,
    rowwise: bool = True,
    columnwise: bool = False,
    force_pow2_scales: bool = True,
    amax_epsilon: float = 0.0,
):
    """Returns (row uint8 | None, row_scale FP32 | None, col uint8 [K, M] | None, col_scale FP32 | None)."""
    args = (x, fp8_dtype, block_dim, rowwise, columnwise, force_pow2_scales, float(amax_epsilon))
    if compiling():
        outs = torch.ops.te.quantize_fp8_block(*args)
        keep = (rowwise, rowwise, columnwise, columnwise)
        return [t if k else None for t, k in zip(outs, keep)]
    return _quantize_fp8_block(*args)


def _dequantize_fp8_block(data, scale_inv, fp8_dtype, block_dim, columnwise, out_dtype):
    _check_fp8(fp8_dtype)
    _check_block_dim(block_dim)
    data, scale_inv = contiguous(data), contiguous(scale_inv)
    out = torch.empty(data.shape, dtype=out_dtype, device=data.device)
    lib.fp8_block_dequantize(
        desc(data, fp8_dtype),
        desc(scale_inv, FLOAT32),
        hp_desc(out, "out_dtype"),
        block_dim,
        GEMM_READY,
        columnwise,
        stream_of(data),
    )
    return out


@torch.library.custom_op("te::dequantize_fp8_block", mutates_args=())
def _dequantize_fp8_block_op(
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    fp8_dtype: int,
    block_dim: int,
    columnwise: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return _dequantize_fp8_block(data, scale_inv, fp8_dtype, block_dim, columnwise, out_dtype)


@_dequantize_fp8_block_op.register_fake
def _(data, scale_inv, fp8_dtype, block_dim, columnwise, out_dtype):
    return data.new_empty(data.shape, dtype=out_dtype)


def dequantize_fp8_block(data, scale_inv, fp8_dtype: int, block_dim=1, columnwise=False, out_dtype=torch.float32):
    """float32(q) * its block's scale_inv, rounded to out_dtype; data's stored shape ([K, M] when columnwise)."""
    if compiling():
        return torch.ops.te.dequantize_fp8_block(data, scale_inv, fp8_dtype, block_dim, columnwise, out_dtype)
    return _dequantize_fp8_block(data, scale_inv, fp8_dtype, block_dim, columnwise, out_dtype)
