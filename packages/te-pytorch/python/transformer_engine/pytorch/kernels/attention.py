"""Fused attention: torch.ops.te.attention_fwd / attention_bwd over te-core's
attention op (core/include/te/attention.h has the formulas), plus the
autograd function and the support check DotProductAttention's backend
selection uses.

The ops take the call's optional tensors as one AttentionTensors group and its
scalars (enum codes numbered like the reference's NVTE_* ones) as one
AttentionConfig group, shared by forward and backward. Forward
returns (o, softmax_lse); backward (dq, dk, dv, dbias | None,
dsoftmax_offset | None). Each op is one definition (kernels._common.te_op):
the implementation and its shape rule.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from transformer_engine.core import attention as _core
from transformer_engine.core import lib

from ._common import FLOAT32, contiguous, desc, hp_desc, stream_of, te_op, workspace

# The codes are te-core's (one table for every package).
QKV_FORMAT, MASK_TYPE, BIAS_TYPE = _core.QKV_FORMATS, _core.ATTN_MASK_TYPES, _core.ATTN_BIAS_TYPES
# The reference's spelling "off-by-one" (te-core's NumPy API says "off_by_one").
SOFTMAX_TYPE = {"vanilla": 0, "off-by-one": 1, "learnable": 2}
INT32, INT64, BYTE = 2, 3, 0  # te_dtype codes of cu_seqlens, rng_state, attn_mask


def available() -> bool:
    """Whether this te-core build has the attention op."""
    return hasattr(lib, "attention_fwd")


def core_backend(q: Tensor, k: Tensor, v: Tensor, extra: AttentionTensors, cfg: AttentionConfig) -> str:
    """Which of te-core's backends attention_fwd would run for this call ("cpu",
    "cudnn" or "cuda_fallback"): te_attention_backend, after validating the call.
    Reads descriptors only (no data, no launch): eager tensors, not fake ones."""
    args = _core_args(cfg, extra)
    return _core.BACKENDS[lib.attention_backend(hp_desc(q, "q"), hp_desc(k, "k"), hp_desc(v, "v"), **args)]


def _opt(t, code=None):
    if t is None:
        return None
    return desc(t, code) if code is not None else hp_desc(t, "attention tensor")


def _core_args(cfg: AttentionConfig, t: AttentionTensors) -> dict:
    return dict(
        qkv_format=cfg.fmt,
        mask_type=cfg.mask_type,
        bias_type=cfg.bias_type,
        softmax_type=cfg.softmax_type,
        scale=cfg.scale,
        dropout=cfg.dropout,
        window_left=cfg.left,
        window_right=cfg.right,
        max_seqlen_q=cfg.sq,
        max_seqlen_kv=cfg.skv,
        deterministic=cfg.det,
        bias=_opt(t.bias),
        alibi_slopes=_opt(t.alibi, FLOAT32),
        cu_seqlens_q=_opt(t.cu_q, INT32),
        cu_seqlens_kv=_opt(t.cu_kv, INT32),
        cu_seqlens_q_padded=_opt(t.cu_qp, INT32),
        cu_seqlens_kv_padded=_opt(t.cu_kvp, INT32),
        attn_mask=_opt(t.mask, BYTE),
        softmax_offset=_opt(t.offset, FLOAT32),
        rng_state=_opt(t.rng, INT64),
    )


def _prepare(workspace_size, q, k, v, cfg, extra):
    """What attention_fwd and attention_bwd both hand the core: the q/k/v
    descriptors, the keyword arguments (_core_args of cfg and the optional
    tensors), the stream and a workspace of workspace_size(qd, kd, vd, **args)."""
    args = _core_args(cfg, extra)
    qd, kd, vd = hp_desc(q, "q"), hp_desc(k, "k"), hp_desc(v, "v")
    stream = stream_of(q)
    ws = workspace(workspace_size(qd, kd, vd, **args), q, stream)
    return qd, kd, vd, args, stream, ws


def _lse_shape(q, fmt):
    if fmt == 2:
        return (q.shape[0], q.shape[1])
    b, s = (q.shape[0], q.shape[1]) if fmt == 0 else (q.shape[1], q.shape[0])
    return (b, q.shape[-2], s)


_Opt = Tensor | None


class AttentionTensors(NamedTuple):
    """The optional tensors of one attention call (None where not used); the op's
    arguments extra_<field>."""

    bias: _Opt
    alibi: _Opt
    cu_q: _Opt
    cu_kv: _Opt
    cu_qp: _Opt
    cu_kvp: _Opt
    mask: _Opt
    offset: _Opt
    rng: _Opt


class AttentionConfig(NamedTuple):
    """The scalars of one attention call: te-core's enum codes, softmax scale,
    dropout, window (left, right), max_seqlen_q/kv (thd only, else 0) and
    deterministic; the op's arguments cfg_<field>."""

    fmt: int
    mask_type: int
    bias_type: int
    softmax_type: int
    scale: float
    dropout: float
    left: int
    right: int
    sq: int
    skv: int
    det: bool


def _fwd_shapes(a):
    return (((*a.q.shape[:-1], a.v.shape[-1]), a.q.dtype), (_lse_shape(a.q, a.cfg.fmt), torch.float32))


@te_op("attention_fwd", shapes=_fwd_shapes)
def attention_fwd(
    q: Tensor, k: Tensor, v: Tensor, extra: AttentionTensors, cfg: AttentionConfig
) -> tuple[Tensor, Tensor]:
    """(o, softmax_lse) of te_attention_fwd."""
    q, k, v = contiguous(q), contiguous(k), contiguous(v)
    o = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(_lse_shape(q, cfg.fmt), dtype=torch.float32)
    qd, kd, vd, args, stream, ws = _prepare(lib.attention_fwd_workspace_size, q, k, v, cfg, extra)
    lib.attention_fwd(qd, kd, vd, hp_desc(o, "o"), desc(lse, FLOAT32), **args, workspace=ws, stream=stream)
    return o, lse


def _bwd_shapes(a):
    bias, offset = a.extra.bias, a.extra.offset
    dbias = (bias.shape, bias.dtype) if bias is not None else None
    dalpha = (offset.shape, torch.float32) if a.cfg.softmax_type == 2 else None
    return (a.q.shape, a.q.dtype), (a.k.shape, a.k.dtype), (a.v.shape, a.v.dtype), dbias, dalpha


@te_op("attention_bwd", shapes=_bwd_shapes)
def attention_bwd(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, d_o: Tensor, lse: Tensor, extra: AttentionTensors, cfg: AttentionConfig
) -> tuple[Tensor, Tensor, Tensor, _Opt, _Opt]:
    """(dq, dk, dv, dbias | None, dsoftmax_offset | None) of te_attention_bwd; the
    forward's arguments plus its o, softmax_lse and the output gradient d_o."""
    q, k, v, o, d_o = (contiguous(t) for t in (q, k, v, o, d_o))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = torch.empty_like(extra.bias) if extra.bias is not None else None
    dalpha = torch.empty_like(extra.offset) if cfg.softmax_type == 2 else None
    qd, kd, vd, args, stream, ws = _prepare(lib.attention_bwd_workspace_size, q, k, v, cfg, extra)
    lib.attention_bwd(
        qd,
        kd,
        vd,
        hp_desc(o, "o"),
        hp_desc(d_o, "d_o"),
        desc(contiguous(lse), FLOAT32),
        hp_desc(dq, "dq"),
        hp_desc(dk, "dk"),
        hp_desc(dv, "dv"),
        **args,
        dbias=None if dbias is None else hp_desc(dbias, "dbias"),
        dsoftmax_offset=None if dalpha is None else desc(dalpha, FLOAT32),
        workspace=ws,
        stream=stream,
    )
    return dq, dk, dv, dbias, dalpha
