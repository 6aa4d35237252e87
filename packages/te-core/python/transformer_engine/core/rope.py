"""Fused rotary position embedding (RoPE) on NumPy arrays (the core's CPU backend).

The semantics of the reference's `apply_rotary_pos_emb` (core/include/te/rope.h):
t is [s, b, h, d] (sbhd), [b, s, h, d] (bshd) or [t, h, d] packed (thd, with
cu_seqlens); freqs is FP32 [S, 1, 1, d2] with d2 <= d the rotary dimension (the rest
of each head passes through). Per head, with angles f = freqs[position]:
    out = t * cos(f) + rotate_half(t) * sin(f)         (interleaved: rotate pairs)
The backward is the transpose of that map (the rotation by -f for the frequencies
RotaryPositionEmbedding builds). FP32 arithmetic, the result in t's type.
"""

from __future__ import annotations

import numpy as np

from ._arrays import as_high_precision, desc
from ._checks import contiguous, flag, integer
from ._native import lib

TENSOR_FORMATS = {"bshd": 0, "sbhd": 1, "thd": 2}


def _format_code(tensor_format) -> int:
    if tensor_format not in TENSOR_FORMATS:
        raise ValueError(f"argument 'tensor_format' must be one of {sorted(TENSOR_FORMATS)}, got {tensor_format!r}")
    return TENSOR_FORMATS[tensor_format]


def _int32_vector(values, name: str):
    if values is None:
        return None
    array = np.asarray(values)
    if array.dtype.kind not in "iu":
        raise TypeError(f"argument '{name}' must hold integers, got {array.dtype}")
    return contiguous(array.astype(np.int32, copy=False), name)


def _run(entry, t, name, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank):
    t = as_high_precision(t, name)
    freqs = np.asarray(freqs)
    if freqs.dtype != np.float32:
        raise TypeError(f"argument 'freqs' must be float32, got {freqs.dtype}")
    freqs = contiguous(freqs, "freqs")
    cu = _int32_vector(cu_seqlens, "cu_seqlens")
    starts = _int32_vector(start_positions, "start_positions")
    out = np.empty_like(t)
    opt = lambda a: None if a is None else desc(a)  # noqa: E731
    entry(
        desc(t),
        desc(freqs),
        opt(cu),
        opt(starts),
        _format_code(tensor_format),
        flag(interleaved, "interleaved"),
        integer(cp_size, "cp_size"),
        integer(cp_rank, "cp_rank"),
        desc(out),
    )
    return out


def fused_rope_forward(
    t,
    freqs,
    tensor_format="sbhd",
    start_positions=None,
    interleaved=False,
    cu_seqlens=None,
    cp_size=1,
    cp_rank=0,
) -> np.ndarray:
    """RoPE of t (arguments as the reference's apply_rotary_pos_emb); returns t's shape and type."""
    return _run(lib.rope_fwd, t, "t", freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank)


def fused_rope_backward(
    grad_output,
    freqs,
    tensor_format="sbhd",
    start_positions=None,
    interleaved=False,
    cu_seqlens=None,
    cp_size=1,
    cp_rank=0,
) -> np.ndarray:
    """The gradient of fused_rope_forward with respect to t, given the output gradient."""
    return _run(
        lib.rope_bwd,
        grad_output,
        "d_out",
        freqs,
        tensor_format,
        start_positions,
        interleaved,
        cu_seqlens,
        cp_size,
        cp_rank,
    )
