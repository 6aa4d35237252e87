"""Fused RoPE as torch operators: torch.ops.te.rope_fwd / rope_bwd over te-core's
te_rope_fwd / te_rope_bwd (te/rope.h states the formula, the position rules of
bshd/sbhd/thd, start_positions and context parallelism). One pass over t on the
CPU or the GPU, FP32 arithmetic, no host synchronization for thd's cu_seqlens."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_engine.core import lib

from ._common import FLOAT32, contiguous, desc, hp_desc, stream_of, te_op

TENSOR_FORMAT = {"bshd": 0, "sbhd": 1, "thd": 2}  # (te_qkv_format's numbers)
INT32 = 2  # te_dtype code of cu_seqlens / start_positions


def _int32(t: Tensor | None, name: str) -> Tensor | None:
    """t as a contiguous int32 tensor (the caller keeps it alive for the call)."""
    if t is None:
        return None
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"rope: argument '{name}' must be an int32 or int64 tensor, got {t.dtype}")
    return contiguous(t.to(torch.int32))


def _run(fn, x, freqs, cu_seqlens, start_positions, tensor_format, interleaved, cp_size, cp_rank, name):
    x = contiguous(x)
    if freqs.dtype != torch.float32:
        raise TypeError(f"rope: argument 'freqs' must be float32, got {freqs.dtype}")
    freqs = contiguous(freqs)
    cu, start = _int32(cu_seqlens, "cu_seqlens"), _int32(start_positions, "start_positions")
    out = torch.empty_like(x)
    if x.numel():
        fn(
            hp_desc(x, name),
            desc(freqs, FLOAT32),
            None if cu is None else desc(cu, INT32),
            None if start is None else desc(start, INT32),
            tensor_format,
            interleaved,
            cp_size,
            cp_rank,
            hp_desc(out, "out"),
            stream_of(x),
        )
    return out


@te_op("rope_fwd", shapes=lambda a: (a.t.shape, a.t.dtype))
def rope_fwd(
    t: Tensor,
    freqs: Tensor,
    cu_seqlens: Tensor | None,
    start_positions: Tensor | None,
    tensor_format: int,
    interleaved: bool,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> Tensor:
    """t rotated by freqs (FP32 [S, 1, 1, d2]); tensor_format 0 bshd, 1 sbhd, 2 thd."""
    return _run(lib.rope_fwd, t, freqs, cu_seqlens, start_positions, tensor_format, interleaved, cp_size, cp_rank, "t")


@te_op("rope_bwd", shapes=lambda a: (a.d_out.shape, a.d_out.dtype))
def rope_bwd(
    d_out: Tensor,
    freqs: Tensor,
    cu_seqlens: Tensor | None,
    start_positions: Tensor | None,
    tensor_format: int,
    interleaved: bool,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> Tensor:
    """The gradient of rope_fwd with respect to t."""
    return _run(
        lib.rope_bwd, d_out, freqs, cu_seqlens, start_positions, tensor_format, interleaved, cp_size, cp_rank, "d_out"
    )
