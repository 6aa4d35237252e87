"""Rotary position embedding (RoPE, https://arxiv.org/abs/2104.09864).

RotaryPositionEmbedding(dim)(max_seq_len) gives the angles freqs [s, 1, 1, d2]
(FP32): position p times inv_freq[k] = base^(-2k/d2), each angle twice. With
interleaved=False the two copies are the halves [f_0..f_{d2/2-1}, f_0..]
and apply_rotary_pos_emb rotates the pairs (x[k], x[k + d2/2]); with
interleaved=True they are adjacent [f_0, f_0, f_1, f_1, ...] and the pairs
are (x[2k], x[2k+1]). A pair (a, b) at angle f becomes
(a cos f - b sin f, b cos f + a sin f); the last d - d2 channels pass through.

fused=False is the reference's unfused torch math (cos/sin rounded to the
tensor's type, products in that type; thd walks the sequences on the host).
fused=True runs te-core's fused RoPE (te/rope.h): one pass forward and one
backward on the CPU or the GPU, FP32 arithmetic with one rounding, no host
synchronization for thd. The two agree within the tensor type's rounding, as
the reference's fused and unfused paths do.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..kernels import rope as _rope_kernels

__all__ = ["RotaryPositionEmbedding", "apply_rotary_pos_emb"]

_FORMATS = ("sbhd", "bshd", "thd")


class RotaryPositionEmbedding(torch.nn.Module):
    """Computes the RoPE angles (the reference's constructor and forward).

    dim: rotary dimension (times rotary_percent when < 1). rotary_base: the
    base of the inverse frequencies. seq_len_interpolation_factor with
    pretrained_max_position_embeddings: positions divided by the factor
    (https://arxiv.org/abs/2306.15595), or by max_seq_len / pretrained when
    max_seq_len exceeds pretrained * factor. forward(max_seq_len, offset)
    returns [max_seq_len, 1, 1, dim] FP32 for positions offset, offset + 1, ...
    """

    def __init__(
        self,
        dim: int,
        rotary_percent: float = 1.0,
        seq_len_interpolation_factor=None,
        pretrained_max_position_embeddings=None,
        rotary_base: float = 10000.0,
        interleaved: bool = False,
    ):
        super().__init__()
        if rotary_percent < 1.0:
            dim = int(dim * rotary_percent)
        if dim <= 0 or dim % 2:
            raise ValueError(f"RotaryPositionEmbedding: the rotary dimension must be even and > 0, got {dim}")
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.rotary_base = rotary_base
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.interleaved = interleaved
        device = "cuda" if torch.cuda.is_available() else "cpu"
        exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim
        self.register_buffer("inv_freq", 1.0 / (rotary_base**exponents))

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        pos = torch.arange(max_seq_len, device=self.inv_freq.device, dtype=self.inv_freq.dtype) + offset
        factor = self.seq_len_interpolation_factor
        pretrained = self.pretrained_max_position_embeddings
        if pretrained is not None and factor is not None:
            if max_seq_len > pretrained * factor:
                pos = pos * (pretrained / max_seq_len)  # dynamic: stretch to the trained range
            else:
                pos = pos / factor
        freqs = torch.outer(pos, self.inv_freq)
        if self.interleaved:
            emb = freqs.repeat_interleave(2, dim=-1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb.reshape(emb.size(0), 1, 1, emb.size(1))


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """(a, b) pairs -> (-b, a), pairs as described in the module docstring."""
    if not interleaved:
        first, second = x.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def _rotate(t: torch.Tensor, angles: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """t [..., d] rotated by angles broadcast to [..., d2] (d2 <= d)."""
    d2 = angles.shape[-1]
    if d2 > t.shape[-1]:
        raise ValueError(f"apply_rotary_pos_emb: freqs has {d2} channels, more than the tensor's {t.shape[-1]}")
    # cos/sin in FP32, then the tensor's type (the reference's order).
    cos, sin = torch.cos(angles).to(t.dtype), torch.sin(angles).to(t.dtype)
    rot, rest = t[..., :d2], t[..., d2:]
    rot = rot * cos + _rotate_half(rot, interleaved) * sin
    return torch.cat((rot, rest), dim=-1)


def _cp_positions(seqlen: int, cp_size: int, cp_rank: int, device) -> torch.Tensor:
    """Positions a context-parallel rank holds: chunks rank and 2*cp - 1 - rank
    of the full sequence cut into 2 * cp_size chunks (load balancing)."""
    pos = torch.arange(seqlen, device=device)
    if cp_size == 1:
        return pos
    half = seqlen // 2
    full = cp_size * seqlen
    first = cp_rank * half + pos[:half]
    second = full - (cp_rank + 1) * half + pos[: seqlen - half]
    return torch.cat((first, second))


def _angles_for(freqs, seqlen, start, cp_size, cp_rank):
    """freqs rows for one sequence of `seqlen` tokens starting at position `start`."""
    pos = _cp_positions(seqlen, cp_size, cp_rank, freqs.device) + start
    if int(pos.max()) >= freqs.shape[0]:
        raise ValueError(
            f"apply_rotary_pos_emb: freqs covers {freqs.shape[0]} positions, position {int(pos.max())} needed"
        )
    return freqs[pos]  # [s, 1, 1, d2]


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: torch.Tensor | None = None,
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> torch.Tensor:
    """Rotates t ([s, b, h, d] sbhd, [b, s, h, d] bshd or [t, h, d] thd) by
    freqs [s2, 1, 1, d2] (s2 >= s, d2 <= d). start_positions [b]: sequence i
    starts at position start_positions[i] (inference). thd needs cu_seqlens
    [b + 1] (each sequence starts at position 0). cp_size/cp_rank: t holds
    this rank's load-balanced share of each sequence."""
    if tensor_format not in _FORMATS:
        raise ValueError(f"apply_rotary_pos_emb: tensor_format must be one of {_FORMATS}, got {tensor_format!r}")
    if cp_size > 1 and start_positions is not None:
        raise ValueError("apply_rotary_pos_emb: start_positions is not supported with cp_size > 1")
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise ValueError(f"apply_rotary_pos_emb: freqs must have shape [s, 1, 1, d], got {tuple(freqs.shape)}")
    freqs = freqs.float()
    # (InferenceParams keeps its lengths on the host: the kernels read them on t's device)
    if start_positions is not None and start_positions.device != t.device:
        start_positions = start_positions.to(t.device, non_blocking=True)
    if cu_seqlens is not None and cu_seqlens.device != t.device:
        cu_seqlens = cu_seqlens.to(t.device, non_blocking=True)
    if fused:
        if tensor_format == "thd" and cu_seqlens is None:
            raise ValueError("apply_rotary_pos_emb: cu_seqlens is required when tensor_format is 'thd'")
        return _FusedRoPE.apply(
            t,
            freqs,
            cu_seqlens if tensor_format == "thd" else None,
            start_positions,
            _rope_kernels.TENSOR_FORMAT[tensor_format],
            bool(interleaved),
            int(cp_size),
            int(cp_rank),
        )
    if tensor_format == "thd":
        if cu_seqlens is None:
            raise ValueError("apply_rotary_pos_emb: cu_seqlens is required when tensor_format is 'thd'")
        bounds = (cu_seqlens // cp_size).tolist()
        starts = [0] * (len(bounds) - 1) if start_positions is None else start_positions.tolist()
        pieces = []
        for i in range(len(bounds) - 1):
            piece = t[bounds[i] : bounds[i + 1]]
            if piece.shape[0]:
                angles = _angles_for(freqs, piece.shape[0], int(starts[i]), cp_size, cp_rank)[:, 0]
                piece = _rotate(piece, angles, interleaved)
            pieces.append(piece)
        pieces.append(t[bounds[-1] :])  # (tokens past the last sequence stay as they are)
        return torch.cat(pieces)
    seq_dim = 0 if tensor_format == "sbhd" else 1
    seqlen = t.shape[seq_dim]
    if start_positions is None:
        angles = _angles_for(freqs, seqlen, 0, cp_size, cp_rank)  # [s, 1, 1, d2]
    else:
        angles = torch.cat([_angles_for(freqs, seqlen, int(p), 1, 0) for p in start_positions.tolist()], dim=1)
    if tensor_format == "bshd":
        angles = angles.transpose(0, 1)
    return _rotate(t, angles, interleaved)


class _FusedRoPE(torch.autograd.Function):
    """te-core's fused RoPE (kernels.rope_fwd / rope_bwd): one pass each way."""

    @staticmethod
    def forward(ctx, t, freqs, cu_seqlens, start_positions, tensor_format, interleaved, cp_size, cp_rank):
        ctx.save_for_backward(freqs, cu_seqlens, start_positions)
        ctx.settings = (tensor_format, interleaved, cp_size, cp_rank)
        return kernels.rope_fwd(t, freqs, cu_seqlens, start_positions, tensor_format, interleaved, cp_size, cp_rank)

    @staticmethod
    def backward(ctx, grad):
        freqs, cu_seqlens, start_positions = ctx.saved_tensors
        d_t = kernels.rope_bwd(grad, freqs, cu_seqlens, start_positions, *ctx.settings)
        return d_t, None, None, None, None, None, None, None
