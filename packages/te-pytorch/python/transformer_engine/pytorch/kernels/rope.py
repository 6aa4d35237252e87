"""Fused RoPE as torch operators: torch.ops.te.rope_fwd / rope_bwd over te-core's
te_rope_fwd / te_rope_bwd (te/rope.h states the formula, the position rules of
bshd/sbhd/thd, start_positions and context parallelism). One pass over t on the
CPU or the GPU, FP32 arithmetic, no host synchronization for thd's cu_seqlens."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_engine.core import lib

from ._common import FLOAT32, contiguous, desc, hp_desc, signature_without, stream_of, te_op

TENSOR_FORMAT = {"bshd": 0, "sbhd": 1, "thd": 2}  # (te_qkv_format's numbers)
INT32 = 2  # te_dtype code of cu_seqlens / start_positions


def _int32(t: Tensor | None, name: str) -> Tensor | None:
    """t as a contiguous int32 tensor (the caller keeps it alive for the call)."""
    if t is None:
        return None
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"rope: argument '{name}' must be an int32 or int64 tensor, got {t.dtype}")
    return contiguous(t.to(torch.int32))


def _run(
    fn,
    name,
    x: Tensor,
    freqs: Tensor,
    cu_seqlens: Tensor | None,
    start_positions: Tensor | None,
    tensor_format: int,
    interleaved: bool,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> Tensor:
    """fn (lib.rope_fwd or lib.rope_bwd) on x, the op's argument `name`: the
    implementation of both ops (the rest of this signature is theirs)."""
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


def _op(name: str, x_name: str, doc: str):
    """The op `name`: _run with te-core's function of that name and _run's
    signature, its tensor argument called x_name."""

    def impl(x, *args, **kwargs):
        return _run(getattr(lib, name), x_name, x, *args, **kwargs)

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = doc
    signature = signature_without(_run, "fn", "name", rename={"x": x_name})
    return te_op(name, shapes=lambda a: (getattr(a, x_name).shape, getattr(a, x_name).dtype), signature=signature)(impl)


rope_fwd = _op("rope_fwd", "t", "t rotated by freqs (FP32 [S, 1, 1, d2]); tensor_format 0 bshd, 1 sbhd, 2 thd.")
rope_bwd = _op("rope_bwd", "d_out", "The gradient of rope_fwd with respect to t (rope_fwd's other arguments).")
