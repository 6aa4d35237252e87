"""Float64 oracle of the fused RoPE and the error bound the core must meet.

Written from the reference's unfused `apply_rotary_pos_emb` (per-token angle rows,
`rotate_half`, the context-parallel freqs slicing and the thd split by cu_seqlens),
independent of the native code's position formula. The core computes in FP32 with
its own sinf/cosf; the bound (docs/numerics.md, "RoPE") is, per rotated element,
    |core - exact| <= 2 * [(|x_i| + |x_p|) * (E_TRIG + u) + u * |exact|] + rounding to t's type
with u = 2^-24 and E_TRIG = 2u the absolute error allowed for an FP32 sin or cos
(CUDA's sinf/cosf are within 2 ulp, glibc's within 1; |sin|, |cos| <= 1 so an ulp is
at most u). Elements past the rotary dimension are copied exactly.
"""

from __future__ import annotations

import numpy as np

from .norm_reference import OUTPUT_ROUNDING, SAFETY, TINY32, U32

E_TRIG = 2 * U32


def _cp_rows(freqs: np.ndarray, seqlen: int, cp_size: int, cp_rank: int) -> np.ndarray:
    """The freqs rows a local sequence of `seqlen` tokens reads (reference semantics)."""
    if cp_size > 1:
        seg = seqlen // 2
        full = cp_size * seqlen
        return np.concatenate(
            [freqs[cp_rank * seg : (cp_rank + 1) * seg], freqs[full - (cp_rank + 1) * seg : full - cp_rank * seg]]
        )
    return freqs[:seqlen]


def token_angles(shape, freqs, tensor_format, start_positions=None, cu_seqlens=None, cp_size=1, cp_rank=0):
    """(angles [tokens, d2] float64, rotated [tokens] bool) for t of `shape` viewed as
    [tokens, h, d] in memory order; rotated is False for thd tokens of no sequence."""
    f = np.asarray(freqs, np.float64).reshape(freqs.shape[0], freqs.shape[-1])
    d2 = f.shape[1]
    if tensor_format == "thd":
        ntok = shape[0]
        angles = np.zeros((ntok, d2))
        rotated = np.zeros(ntok, bool)
        cu = np.asarray(cu_seqlens, np.int64) // cp_size
        for k in range(len(cu) - 1):
            lo, hi = int(cu[k]), int(cu[k + 1])
            if hi == lo:
                continue
            rows = _cp_rows(f, hi - lo, cp_size, cp_rank)
            if start_positions is not None:
                rows = f[int(start_positions[k]) : int(start_positions[k]) + hi - lo]
            angles[lo:hi] = rows
            rotated[lo:hi] = True
        return angles, rotated
    s, b = (shape[0], shape[1]) if tensor_format == "sbhd" else (shape[1], shape[0])
    per_batch = np.empty((b, s, d2))
    for bb in range(b):
        if start_positions is not None:
            st = int(start_positions[bb])
            per_batch[bb] = f[st : st + s]
        else:
            per_batch[bb] = _cp_rows(f, s, cp_size, cp_rank)
    order = per_batch.transpose(1, 0, 2) if tensor_format == "sbhd" else per_batch
    return order.reshape(-1, d2), np.ones(s * b, bool)


def _rotate_half(x: np.ndarray, interleaved: bool) -> np.ndarray:
    if not interleaved:
        x1, x2 = np.split(x, 2, axis=-1)
        return np.concatenate([-x2, x1], axis=-1)
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def _rotate_half_transposed(z: np.ndarray, interleaved: bool) -> np.ndarray:
    """R^T z for the rotate_half map R (R^T = -R: a rotation by a quarter turn)."""
    return -_rotate_half(z, interleaved)


def _view(t):
    a = np.asarray(t).astype(np.float64)
    return a.reshape(-1, a.shape[-2], a.shape[-1])


def _bound(x_rot, partner, exact_rot, dtype):
    unit, tiny = OUTPUT_ROUNDING[np.dtype(dtype)]
    with np.errstate(invalid="ignore"):
        b32 = SAFETY * ((np.abs(x_rot) + np.abs(partner)) * (E_TRIG + U32) + U32 * np.abs(exact_rot) + 2 * TINY32)
        return b32 * (1 + unit) + unit * np.abs(exact_rot) + tiny


def rope(
    t,
    freqs,
    tensor_format="sbhd",
    start_positions=None,
    interleaved=False,
    cu_seqlens=None,
    cp_size=1,
    cp_rank=0,
    backward=False,
):
    """(exact float64 result of t's shape, bound): the forward of t, or (backward) the
    gradient for the output gradient t."""
    x = _view(t)
    d2 = freqs.shape[-1]
    angles, rotated = token_angles(np.shape(t), freqs, tensor_format, start_positions, cu_seqlens, cp_size, cp_rank)
    c = np.cos(angles)[:, None, :]
    s = np.sin(angles)[:, None, :]
    xr = x[..., :d2]
    with np.errstate(invalid="ignore", over="ignore"):
        if backward:
            out_rot = xr * c + _rotate_half_transposed(xr * s, interleaved)
        else:
            out_rot = xr * c + _rotate_half(xr, interleaved) * s
    partner = np.abs(_rotate_half(xr, interleaved))
    out = x.copy()
    out[rotated, :, :d2] = out_rot[rotated]
    bound = np.zeros_like(x)
    bound[rotated, :, :d2] = _bound(xr, partner, out_rot, np.asarray(t).dtype)[rotated]
    return out.reshape(np.shape(t)), bound.reshape(np.shape(t))
