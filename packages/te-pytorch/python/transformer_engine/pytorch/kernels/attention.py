"""Fused attention: torch.ops.te.attention_fwd / attention_bwd over te-core's
attention op (core/include/te/attention.h has the formulas), plus the
autograd function and the support check DotProductAttention's backend
selection uses.

The ops take the core's configuration as ints/floats (enum codes numbered
like the reference's NVTE_* ones) and the optional tensors as None. Forward
returns (o, softmax_lse); backward (dq, dk, dv, dbias, dsoftmax_offset) with
empty placeholders for the gradients not asked for.
"""

from __future__ import annotations

import torch

from transformer_engine.core import lib

from ._common import FLOAT32, compiling, contiguous, desc, hp_desc, stream_of, workspace

QKV_FORMAT = {"bshd": 0, "sbhd": 1, "thd": 2}
MASK_TYPE = {"no_mask": 0, "padding": 1, "causal": 2, "padding_causal": 3, "causal_bottom_right": 4,
             "padding_causal_bottom_right": 5, "arbitrary": 6}
BIAS_TYPE = {"no_bias": 0, "pre_scale_bias": 1, "post_scale_bias": 2, "alibi": 3}
SOFTMAX_TYPE = {"vanilla": 0, "off-by-one": 1, "learnable": 2}
INT32, INT64, BYTE = 2, 3, 0  # te_dtype codes of cu_seqlens, rng_state, attn_mask


def available() -> bool:
    """Whether this te-core build has the attention op."""
    return hasattr(lib, "attention_fwd")


def _opt(t, code=None):
    if t is None:
        return None
    return desc(t, code) if code is not None else hp_desc(t, "attention tensor")


def _core_args(cfg_ints, bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng):
    fmt, mask_type, bias_type, softmax_type, scale, dropout, left, right, sq, skv, det = cfg_ints
    return dict(
        qkv_format=fmt, mask_type=mask_type, bias_type=bias_type, softmax_type=softmax_type, scale=scale,
        dropout=dropout, window_left=left, window_right=right, max_seqlen_q=sq, max_seqlen_kv=skv,
        deterministic=det, bias=_opt(bias), alibi_slopes=_opt(alibi, FLOAT32), cu_seqlens_q=_opt(cu_q, INT32),
        cu_seqlens_kv=_opt(cu_kv, INT32), cu_seqlens_q_padded=_opt(cu_qp, INT32),
        cu_seqlens_kv_padded=_opt(cu_kvp, INT32), attn_mask=_opt(mask, BYTE),
        softmax_offset=_opt(offset, FLOAT32), rng_state=_opt(rng, INT64),
    )


def _lse_shape(q, fmt):
    if fmt == 2:
        return (q.shape[0], q.shape[1])
    b, s = (q.shape[0], q.shape[1]) if fmt == 0 else (q.shape[1], q.shape[0])
    return (b, q.shape[-2], s)


def _fwd(q, k, v, bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng, fmt, mask_type, bias_type,
         softmax_type, scale, dropout, left, right, sq, skv, det):
    q, k, v = contiguous(q), contiguous(k), contiguous(v)
    cfg = (fmt, mask_type, bias_type, softmax_type, scale, dropout, left, right, sq, skv, det)
    args = _core_args(cfg, bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng)
    o = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(_lse_shape(q, fmt), dtype=torch.float32)
    qd, kd, vd = hp_desc(q, "q"), hp_desc(k, "k"), hp_desc(v, "v")
    stream = stream_of(q)
    ws = workspace(lib.attention_fwd_workspace_size(qd, kd, vd, **args), q, stream)
    lib.attention_fwd(qd, kd, vd, hp_desc(o, "o"), desc(lse, FLOAT32), **args, workspace=ws, stream=stream)
    return o, lse


@torch.library.custom_op("te::attention_fwd", mutates_args=())
def _fwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, alibi: torch.Tensor | None,
    cu_q: torch.Tensor | None, cu_kv: torch.Tensor | None, cu_qp: torch.Tensor | None,
    cu_kvp: torch.Tensor | None, mask: torch.Tensor | None, offset: torch.Tensor | None,
    rng: torch.Tensor | None, fmt: int, mask_type: int, bias_type: int, softmax_type: int, scale: float,
    dropout: float, left: int, right: int, sq: int, skv: int, det: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _fwd(q, k, v, bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng, fmt, mask_type, bias_type,
                softmax_type, scale, dropout, left, right, sq, skv, det)


@_fwd_op.register_fake
def _(q, k, v, bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng, fmt, *rest):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(_lse_shape(q, fmt), dtype=torch.float32)


def _bwd(q, k, v, o, d_o, lse, bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng, fmt, mask_type,
         bias_type, softmax_type, scale, dropout, left, right, sq, skv, det):
    q, k, v, o, d_o = (contiguous(t) for t in (q, k, v, o, d_o))
    cfg = (fmt, mask_type, bias_type, softmax_type, scale, dropout, left, right, sq, skv, det)
    args = _core_args(cfg, bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = torch.empty_like(bias) if bias is not None else q.new_empty((0,))
    dalpha = torch.empty_like(offset) if softmax_type == 2 else q.new_empty((0,), dtype=torch.float32)
    qd, kd, vd = hp_desc(q, "q"), hp_desc(k, "k"), hp_desc(v, "v")
    stream = stream_of(q)
    ws = workspace(lib.attention_bwd_workspace_size(qd, kd, vd, **args), q, stream)
    lib.attention_bwd(
        qd, kd, vd, hp_desc(o, "o"), hp_desc(d_o, "d_o"), desc(contiguous(lse), FLOAT32), hp_desc(dq, "dq"),
        hp_desc(dk, "dk"), hp_desc(dv, "dv"), **args, dbias=None if bias is None else hp_desc(dbias, "dbias"),
        dsoftmax_offset=desc(dalpha, FLOAT32) if softmax_type == 2 else None, workspace=ws, stream=stream,
    )
    return dq, dk, dv, dbias, dalpha


@torch.library.custom_op("te::attention_bwd", mutates_args=())
def _bwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, d_o: torch.Tensor, lse: torch.Tensor,
    bias: torch.Tensor | None, alibi: torch.Tensor | None, cu_q: torch.Tensor | None,
    cu_kv: torch.Tensor | None, cu_qp: torch.Tensor | None, cu_kvp: torch.Tensor | None,
    mask: torch.Tensor | None, offset: torch.Tensor | None, rng: torch.Tensor | None, fmt: int,
    mask_type: int, bias_type: int, softmax_type: int, scale: float, dropout: float, left: int, right: int,
    sq: int, skv: int, det: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd(q, k, v, o, d_o, lse, bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng, fmt,
                mask_type, bias_type, softmax_type, scale, dropout, left, right, sq, skv, det)


@_bwd_op.register_fake
def _(q, k, v, o, d_o, lse, bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng, fmt, mask_type,
      bias_type, softmax_type, *rest):
    dbias = torch.empty_like(bias) if bias is not None else q.new_empty((0,))
    dalpha = torch.empty_like(offset) if softmax_type == 2 else q.new_empty((0,), dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias, dalpha


def attention_fwd(*args):
    """(o, softmax_lse); the op's arguments (see _fwd_op)."""
    return _fwd_op(*args) if compiling() else _fwd(*args)


def attention_bwd(*args):
    """(dq, dk, dv, dbias, dsoftmax_offset); the op's arguments (see _bwd_op)."""
    return _bwd_op(*args) if compiling() else _bwd(*args)
