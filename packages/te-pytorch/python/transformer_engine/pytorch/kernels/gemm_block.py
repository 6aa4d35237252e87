"""Block-scaled GEMM ops: torch.ops.te.gemm_block and torch.ops.te.gemm_block_accumulate.

te-core's te_gemm_block (core/include/te/gemm_block.h), row-major:
    D = alpha * op(A) @ op(B) + beta * C + bias[n]     op(A) [M, K], op(B) [K, N]
where every element of op(A) and op(B) is its dequantized value. An operand is
its stored data plus its scaling mode (SCALING below), its dtype code (the FP8
code for uint8 FP8 bytes; -1 for high precision and NVFP4), its scales and,
for NVFP4, the FP32 global amax it was quantized with. FP8 block and NVFP4
take the TN form only (transa = False, transb = True); MXFP8 takes any form,
the flags saying which copy each operand is.

Paths: "native" (cuBLASLt block-scaled kernels: FP8 block on Hopper) or
"emulated" (each operand dequantized, then a dense GEMM; every CPU call). The
eager wrappers return the path taken so that callers can tell the user; under
torch.compile it is None. The CUDA workspace is sized by te_gemm_block_plan
and taken from the per-stream cache in _common.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from transformer_engine.core import DType, lib

from ._common import (
    FLOAT32,
    TORCH_TO_CODE,
    check_accumulate_out,
    check_out_dtype,
    contiguous,
    desc,
    scalar_desc,
    stream_of,
    te_op,
    workspace,
)
from .nvfp4 import fp4_desc

SCALING = {"none": 0, "tensor": 1, "fp8_block_1d": 2, "fp8_block_2d": 3, "mxfp8": 4, "nvfp4": 5}
PATHS = ("native", "emulated")
_SCALE_CODES = {1: FLOAT32, 2: FLOAT32, 3: FLOAT32, 4: int(DType.kFloat8E8M0), 5: int(DType.kFloat8E4M3)}


class BlockOperand(NamedTuple):
    """One operand of a block-scaled GEMM (a plain tuple in this order works too)."""

    data: Tensor
    scaling: int  # a value of SCALING
    dtype: int  # the FP8 code for uint8 FP8 bytes; -1 for high precision and NVFP4
    scale_inv: Tensor | None
    amax: Tensor | None  # NVFP4: the FP32 global amax it was quantized with
    swizzled: bool


def _operand(data, scaling, code, scale, amax, swizzled, name):
    """lib.GemmOperandDesc of one operand, with checks that name it."""
    if scaling not in _SCALE_CODES and scaling != 0:
        raise ValueError(f"argument '{name}_scaling' must be one of {SCALING}, got {scaling!r}")
    data = contiguous(data)
    if data.dim() < 2:
        raise ValueError(f"argument '{name}' must have at least 2 dims, got shape {tuple(data.shape)}")
    if scaling == 0:
        ddesc = desc(data, TORCH_TO_CODE[data.dtype])
    elif scaling == 5:
        ddesc = fp4_desc(data)
    else:
        if data.dtype != torch.uint8:
            raise TypeError(f"argument '{name}' must hold FP8 bytes as torch.uint8, got {data.dtype}")
        ddesc = desc(data, code)
    sdesc = None
    if scale is not None:
        scale = contiguous(scale)
        sdesc = scalar_desc(scale, 0) if scaling == 1 else desc(scale, _SCALE_CODES[scaling])
    adesc = None if amax is None else scalar_desc(contiguous(amax.reshape(-1)), 0)
    return lib.GemmOperandDesc(ddesc, scaling, sdesc, adesc, swizzled), (data, scale, amax)


def _logical_rows_cols(data, scaling) -> tuple[int, int]:
    cols = data.shape[-1] * (2 if scaling == 5 else 1)
    return data.numel() // data.shape[-1] if data.shape[-1] else 0, cols


def _out_mn(a, a_scaling, b, b_scaling, transa, transb) -> tuple[int, int]:
    a_rows, a_cols = _logical_rows_cols(a, a_scaling)
    b_rows, b_cols = _logical_rows_cols(b, b_scaling)
    return (a_cols if transa else a_rows), (b_rows if transb else b_cols)


def _run(a_args, b_args, transa, transb, d, beta, bias, split, force):
    a_desc, a_keep = _operand(*a_args, "a")
    b_desc, b_keep = _operand(*b_args, "b")
    d_desc = desc(d, TORCH_TO_CODE[d.dtype])
    bias_desc = None
    if bias is not None:
        bias = contiguous(bias)
        bias_desc = desc(bias, TORCH_TO_CODE[bias.dtype])
    params = lib.GemmBlockParams(
        a_desc,
        b_desc,
        d_desc,
        c=d_desc if beta != 0.0 else None,
        bias=bias_desc,
        alpha=1.0,
        beta=beta,
        transa=transa,
        transb=transb,
        use_split_accumulator=split,
        force_emulation=force,
    )
    ws = None
    stream = stream_of(d)
    if d.is_cuda:
        _, nbytes = lib.gemm_block_plan(params)
        ws = workspace(nbytes, d, stream)
    path = lib.gemm_block(params, ws, stream)
    del a_keep, b_keep, bias
    return PATHS[path]


def _shapes(a):
    m, n = _out_mn(a.a[0], a.a[1], a.b[0], a.b[1], a.transa, a.transb)
    return ((m, n), a.out_dtype), None


@te_op("gemm_block", shapes=_shapes)
def gemm_block(
    a: BlockOperand,
    b: BlockOperand,
    *,
    transa: bool = False,
    transb: bool = True,
    out_dtype: torch.dtype = torch.float32,
    bias: Tensor | None = None,
    use_split_accumulator: bool = True,
    force_emulation: bool = False,
) -> tuple[Tensor, str | None]:
    """D (M, N) = op(A) @ op(B) (+ bias). a / b: BlockOperand (data, scaling,
    dtype code, scale_inv | None, amax | None, swizzled_scales) tuples.

    Returns (D, path): path is "native" or "emulated" (None under torch.compile).
    """
    check_out_dtype(out_dtype)
    m, n = _out_mn(a[0], a[1], b[0], b[1], transa, transb)
    d = torch.empty((m, n), dtype=out_dtype, device=a[0].device)
    return d, _run(a, b, transa, transb, d, 0.0, bias, use_split_accumulator, force_emulation)


@te_op("gemm_block_accumulate", mutates_args=("out",))
def gemm_block_accumulate(
    a: BlockOperand,
    b: BlockOperand,
    out: Tensor,
    *,
    beta: float = 1.0,
    transa: bool = False,
    transb: bool = True,
    use_split_accumulator: bool = True,
    force_emulation: bool = False,
) -> str | None:
    """out = op(A) @ op(B) + beta * out in place; returns the path (None under torch.compile)."""
    m, n = _out_mn(a[0], a[1], b[0], b[1], transa, transb)
    check_accumulate_out(out, m, n)
    return _run(a, b, transa, transb, out, beta, None, use_split_accumulator, force_emulation)
