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

import torch

from transformer_engine.core import DType, lib

from ._common import (
    FLOAT32,
    TORCH_TO_CODE,
    check_accumulate_out,
    check_out_dtype,
    compiling,
    contiguous,
    desc,
    scalar_desc,
    stream_of,
    workspace,
)
from .nvfp4 import fp4_desc

SCALING = {"none": 0, "tensor": 1, "fp8_block_1d": 2, "fp8_block_2d": 3, "mxfp8": 4, "nvfp4": 5}
PATHS = ("native", "emulated")
_SCALE_CODES = {1: FLOAT32, 2: FLOAT32, 3: FLOAT32, 4: int(DType.kFloat8E8M0), 5: int(DType.kFloat8E4M3)}


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


def _gemm_block(a_args, b_args, transa, transb, out_dtype, bias, split, force):
    check_out_dtype(out_dtype)
    m, n = _out_mn(a_args[0], a_args[1], b_args[0], b_args[1], transa, transb)
    d = torch.empty((m, n), dtype=out_dtype, device=a_args[0].device)
    return d, _run(a_args, b_args, transa, transb, d, 0.0, bias, split, force)


@torch.library.custom_op("te::gemm_block", mutates_args=())
def _gemm_block_op(
    a: torch.Tensor,
    a_scaling: int,
    a_dtype: int,
    a_scale_inv: torch.Tensor | None,
    a_amax: torch.Tensor | None,
    a_swizzled: bool,
    b: torch.Tensor,
    b_scaling: int,
    b_dtype: int,
    b_scale_inv: torch.Tensor | None,
    b_amax: torch.Tensor | None,
    b_swizzled: bool,
    transa: bool,
    transb: bool,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None,
    use_split_accumulator: bool,
    force_emulation: bool,
) -> torch.Tensor:
    a_args = (a, a_scaling, a_dtype, a_scale_inv, a_amax, a_swizzled)
    b_args = (b, b_scaling, b_dtype, b_scale_inv, b_amax, b_swizzled)
    return _gemm_block(a_args, b_args, transa, transb, out_dtype, bias, use_split_accumulator, force_emulation)[0]


@_gemm_block_op.register_fake
def _(a, a_scaling, a_dtype, a_scale_inv, a_amax, a_swizzled, b, b_scaling, *rest):
    transa, transb, out_dtype = rest[4], rest[5], rest[6]
    m, n = _out_mn(a, a_scaling, b, b_scaling, transa, transb)
    return a.new_empty((m, n), dtype=out_dtype)


def gemm_block(
    a_args: tuple,
    b_args: tuple,
    *,
    transa: bool = False,
    transb: bool = True,
    out_dtype=torch.float32,
    bias=None,
    use_split_accumulator: bool = True,
    force_emulation: bool = False,
):
    """D (M, N) = op(A) @ op(B) (+ bias). a_args / b_args: (data, scaling, dtype
    code, scale_inv | None, amax | None, swizzled_scales), scaling a value of SCALING.

    Returns (D, path): path is "native" or "emulated" (None under torch.compile).
    """
    if compiling():
        d = torch.ops.te.gemm_block(
            *a_args, *b_args, transa, transb, out_dtype, bias, use_split_accumulator, force_emulation
        )
        return d, None
    return _gemm_block(a_args, b_args, transa, transb, out_dtype, bias, use_split_accumulator, force_emulation)


def _gemm_block_accumulate(a_args, b_args, transa, transb, out, beta, split, force):
    m, n = _out_mn(a_args[0], a_args[1], b_args[0], b_args[1], transa, transb)
    check_accumulate_out(out, m, n)
    return _run(a_args, b_args, transa, transb, out, beta, None, split, force)


@torch.library.custom_op("te::gemm_block_accumulate", mutates_args=("out",))
def _gemm_block_accumulate_op(
    a: torch.Tensor,
    a_scaling: int,
    a_dtype: int,
    a_scale_inv: torch.Tensor | None,
    a_amax: torch.Tensor | None,
    a_swizzled: bool,
    b: torch.Tensor,
    b_scaling: int,
    b_dtype: int,
    b_scale_inv: torch.Tensor | None,
    b_amax: torch.Tensor | None,
    b_swizzled: bool,
    transa: bool,
    transb: bool,
    out: torch.Tensor,
    beta: float,
    use_split_accumulator: bool,
    force_emulation: bool,
) -> None:
    a_args = (a, a_scaling, a_dtype, a_scale_inv, a_amax, a_swizzled)
    b_args = (b, b_scaling, b_dtype, b_scale_inv, b_amax, b_swizzled)
    _gemm_block_accumulate(a_args, b_args, transa, transb, out, beta, use_split_accumulator, force_emulation)


@_gemm_block_accumulate_op.register_fake
def _(*args):
    return None


def gemm_block_accumulate(
    a_args: tuple,
    b_args: tuple,
    out,
    *,
    beta: float = 1.0,
    transa: bool = False,
    transb: bool = True,
    use_split_accumulator: bool = True,
    force_emulation: bool = False,
):
    """out = op(A) @ op(B) + beta * out in place; returns the path (None under torch.compile)."""
    if compiling():
        torch.ops.te.gemm_block_accumulate(
            *a_args, *b_args, transa, transb, out, float(beta), use_split_accumulator, force_emulation
        )
        return None
    return _gemm_block_accumulate(
        a_args, b_args, transa, transb, out, float(beta), use_split_accumulator, force_emulation
    )
