"""The "fused" backend: te-core's attention op (kernels/attention.py) with an
autograd function, for the combinations the core supports.

plan() turns one call into the core's arguments, or returns why the core
cannot run it (the backend selection then falls back to the unfused
backend). What the core does not do: softcap, return_max_logit, float64,
a KV cache's thd queries, padding masks that are not right-padding, and a
window or ALiBi diagonal other than the core's own rule (window: top-left
for causal / padding_causal, bottom-right otherwise; ALiBi: bottom-right).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ...kernels import attention as ops
from .unfused import AttnConfig
from .utils import lengths, split_format

_TYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class Plan:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor | None
    offset: torch.Tensor | None
    extras: tuple  # alibi, cu_q, cu_kv, cu_q_padded, cu_kv_padded, mask, rng
    scalars: tuple  # the op's int/float arguments after the tensors
    sbhd_queries: bool  # queries were sbhd, keys a bshd cache: transpose the output back


def _cu_full(b, s, device):
    return torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=device)


def _padding(cfg, call, q, k, fmt):
    """(cu_q, cu_kv) for the core, or a reason string."""
    cu_q, cu_kv = call["cu_seqlens_q"], call["cu_seqlens_kv"]
    if fmt == 2 or "padding" not in cfg.mask_type:
        return cu_q, cu_kv
    b, sq, skv = (q.shape[0], q.shape[1], k.shape[1]) if fmt == 0 else (q.shape[1], q.shape[0], k.shape[0])
    mask = call["attention_mask"]
    if cu_q is None and cu_kv is None and mask is not None:
        mq, mkv = mask if isinstance(mask, (tuple, list)) else (mask, mask)
        cus = []
        for m, s in ((mq, sq), (mkv, skv)):
            valid = ~m.reshape(m.shape[0], s)
            n = valid.sum(-1)
            if not torch.equal(valid, torch.arange(s, device=m.device)[None, :] < n[:, None]):
                return "a padding attention_mask that is not right-padding (give cu_seqlens instead)"
            cus.append(torch.cat((n.new_zeros(1), n.cumsum(0))).to(torch.int32))
        return cus[0], cus[1]
    cu_q = _cu_full(b, sq, q.device) if cu_q is None else cu_q
    cu_kv = _cu_full(b, skv, q.device) if cu_kv is None else cu_kv
    return cu_q, cu_kv


def _arbitrary_mask(mask, b, h, sq, skv):
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if mask.shape[0] not in (1, b) or mask.shape[1] not in (1, h):
        return None
    return mask.expand(mask.shape[0], mask.shape[1], sq, skv).to(torch.uint8).contiguous()


def _diagonal_reason(cfg, padded, sq, skv):
    core_bottom_right = cfg.mask_type not in ("causal", "padding_causal")
    left, right = cfg.window
    windowed = left >= 0 or (right >= 0 and "causal" not in cfg.mask_type)
    if windowed and cfg.bottom_right != core_bottom_right:
        return f"a sliding window aligned {'bottom-right' if cfg.bottom_right else 'top-left'} with {cfg.mask_type}"
    if cfg.bias_type == "alibi" and not cfg.bottom_right and (padded or sq != skv):
        return "ALiBi aligned to the top-left diagonal with unequal query/key lengths"
    return None


def plan(cfg: AttnConfig, call) -> Plan | str:
    """The core's arguments for this call, or why the core cannot run it."""
    q, k, v = call["q"], call["k"], call["v"]
    if cfg.softcap > 0:
        return "softcap"
    if cfg.return_max_logit:
        return "return_max_logit"
    if q.dtype not in _TYPES:
        return f"{q.dtype} inputs"
    q_fmt, kv_fmt = split_format(cfg.qkv_format)
    sbhd_queries = q_fmt == "sbhd" and kv_fmt == "bshd"
    if q_fmt != kv_fmt and not sbhd_queries:
        return f"queries in {q_fmt} with keys/values in {kv_fmt}"
    if sbhd_queries:
        q = q.transpose(0, 1)
    fmt = ops.QKV_FORMAT[kv_fmt]
    padding = _padding(cfg, call, q, k, fmt)
    if isinstance(padding, str):
        return padding
    cu_q, cu_kv = padding
    if fmt == 2:
        b, h = cu_q.numel() - 1, q.shape[1]
        sq = call["max_seqlen_q"] or int(lengths(cu_q).max())
        skv = call["max_seqlen_kv"] or int(lengths(cu_kv).max())
    else:
        b, sq, h = (q.shape[0], q.shape[1], q.shape[2]) if fmt == 0 else (q.shape[1], q.shape[0], q.shape[2])
        skv = k.shape[1] if fmt == 0 else k.shape[0]
    why = _diagonal_reason(cfg, "padding" in cfg.mask_type, sq, skv)
    if why:
        return why
    mask = None
    if cfg.mask_type == "arbitrary":
        if call["attention_mask"] is None:
            return "an arbitrary mask without attention_mask"
        mask = _arbitrary_mask(call["attention_mask"], b, h, sq, skv)
        if mask is None:
            return f"an attention_mask of shape {tuple(call['attention_mask'].shape)}"
    bias = call["bias"]
    if bias is not None:
        if bias.shape[0] not in (1, b) or bias.shape[1] not in (1, h) or tuple(bias.shape[2:]) != (sq, skv):
            return f"a core_attention_bias of shape {tuple(bias.shape)}"
        bias = bias.to(q.dtype)
    offset = call["softmax_offset"].float() if cfg.softmax_type == "learnable" else None
    rng = None
    if cfg.dropout > 0:
        rng = torch.randint(0, 2**62, (2,), dtype=torch.int64)  # (seed, offset) from torch's generator
    alibi = call["alibi_slopes"] if cfg.bias_type == "alibi" else None
    device = q.device
    extras = tuple(
        None if t is None else t.to(device)
        for t in (alibi, cu_q, cu_kv, call["cu_seqlens_q_padded"], call["cu_seqlens_kv_padded"], mask)
    ) + (rng,)
    deterministic = os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1") == "0" or (
        torch.are_deterministic_algorithms_enabled()
    )
    scalars = (
        fmt,
        ops.MASK_TYPE[cfg.mask_type],
        ops.BIAS_TYPE[cfg.bias_type],
        ops.SOFTMAX_TYPE[cfg.softmax_type],
        float(cfg.scale),
        float(cfg.dropout),
        int(cfg.window[0]),
        int(cfg.window[1]),
        int(sq) if fmt == 2 else 0,
        int(skv) if fmt == 2 else 0,
        deterministic,
    )
    return Plan(q, k, v, bias, offset, extras, scalars, sbhd_queries)


_CUDNN: dict[tuple, bool] = {}  # per call signature: does te-core run it on cuDNN?


_PROBED: dict[int, bool] = {}  # per CUDA device: was te-core built with cuDNN attention?


def cudnn_built(device: torch.device) -> bool:
    """Whether te-core runs a plain call (bshd BF16, s 128, d 64, no mask) on cuDNN on this
    device: a build with TE_WITH_CUDNN=ON and a working cuDNN. Probed once per device."""
    if torch.compiler.is_compiling():
        return False  # (the probe reads a real tensor's descriptor; traced calls keep SDPA first)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _PROBED:
        t = torch.empty((1, 128, 1, 64), dtype=torch.bfloat16, device=device)  # (cuDNN refuses s = 1)
        extra = ops.AttentionTensors(*([None] * len(ops.AttentionTensors._fields)))
        cfg = ops.AttentionConfig(0, 0, 0, 0, 0.125, 0.0, -1, -1, 0, 0, False)
        _PROBED[index] = ops.core_backend(t, t, t, extra, cfg) == "cudnn"
    return _PROBED[index]


def uses_cudnn(p: Plan) -> bool:
    """Whether te-core would run this plan on cuDNN's fused attention (te_attention_backend):
    the backend selection then prefers it to torch SDPA (measured faster on the H200,
    docs/benchmarks.md). Asked once per call signature (shapes, dtype, device, the
    scalars and which optional tensors are given); never while torch.compile traces."""
    tensors = (p.q, p.k, p.v, p.bias, p.offset, *p.extras)
    key = (p.q.dtype, p.q.get_device(), p.scalars, *(None if t is None else tuple(t.shape) for t in tensors))
    hit = _CUDNN.get(key)
    if hit is None:
        if len(_CUDNN) >= 4096:  # (thd's max_seqlen varies per batch: keep the cache bounded)
            _CUDNN.clear()
        extra = _tensors(p.bias, p.offset, p.extras)
        hit = _CUDNN[key] = ops.core_backend(p.q, p.k, p.v, extra, ops.AttentionConfig(*p.scalars)) == "cudnn"
    return hit


def _tensors(bias, offset, extras) -> ops.AttentionTensors:
    """The op's optional tensors: bias and offset (autograd inputs of _FusedAttention)
    with the plan's extras (alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, rng)."""
    alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, rng = extras
    return ops.AttentionTensors(bias, alibi, cu_q, cu_kv, cu_qp, cu_kvp, mask, offset, rng)


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, offset, extras, scalars):
        cfg = ops.AttentionConfig(*scalars)
        o, lse = ops.attention_fwd(q, k, v, _tensors(bias, offset, extras), cfg)
        ctx.save_for_backward(q, k, v, o, lse, bias, offset)
        ctx.extras, ctx.cfg = extras, cfg
        return o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, lse, bias, offset = ctx.saved_tensors
        extra = _tensors(bias, offset, ctx.extras)
        dq, dk, dv, dbias, dalpha = ops.attention_bwd(q, k, v, o, d_o, lse, extra, ctx.cfg)
        return dq, dk, dv, dbias, dalpha, None, None


def run(p: Plan) -> torch.Tensor:
    """The attention output with heads merged, in the queries' format."""
    o = _FusedAttention.apply(p.q, p.k, p.v, p.bias, p.offset, p.extras, p.scalars)
    if p.sbhd_queries:
        o = o.transpose(0, 1)
    return o.reshape(*o.shape[:-2], o.shape[-2] * o.shape[-1])
