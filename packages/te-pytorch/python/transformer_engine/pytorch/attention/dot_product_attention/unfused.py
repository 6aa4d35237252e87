"""The "unfused" backend: attention as plain torch math (batched matmuls,
masking, softmax, dropout), differentiated by torch autograd.

Like the reference's UnfusedDotProductAttention it runs every combination
the module accepts (all mask types, windows, GQA/MQA, every bias type
including ALiBi, the three softmax types, softcap, sbhd/bshd/thd and mixed
query/key layouts of a KV cache), at the cost of materializing the
[b, h, sq, skv] scores. Scores are FP32 for 16-bit inputs (FP64 for FP64).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .utils import Padded, alibi_slopes_default, padding_validity


@dataclass
class AttnConfig:
    """One call's resolved settings (shared by the backends)."""

    qkv_format: str  # "bshd", "sbhd", "thd" or "<q>_2<kv>" (KV cache)
    mask_type: str
    window: tuple
    bottom_right: bool  # the diagonal of the window and ALiBi
    scale: float
    softmax_type: str
    bias_type: str
    dropout: float
    softcap: float = 0.0
    return_max_logit: bool = False


def _visible(cfg: AttnConfig, valid, b, sq, skv, device, attention_mask):
    """Boolean [b, 1 or h, sq, skv]: True where query i may attend to key j."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    if valid is None:
        vis = torch.ones(b, 1, sq, skv, dtype=torch.bool, device=device)
        lq = torch.full((b,), sq, device=device)
        lkv = torch.full((b,), skv, device=device)
    else:
        qv, kvv = valid
        qv = torch.ones(b, sq, dtype=torch.bool, device=device) if qv is None else qv
        kvv = torch.ones(b, skv, dtype=torch.bool, device=device) if kvv is None else kvv
        vis = qv[:, None, :, None] & kvv[:, None, None, :]
        lq, lkv = qv.sum(1), kvv.sum(1)
    shift = (lkv - lq)[:, None, None, None]  # the bottom-right diagonal of each sequence
    if "causal" in cfg.mask_type:
        vis = vis & (j <= i + (shift if "bottom_right" in cfg.mask_type else 0))
    left, right = cfg.window
    off = shift if cfg.bottom_right else 0
    if left >= 0:
        vis = vis & (j >= i + off - left)
    if right >= 0 and "causal" not in cfg.mask_type:  # (a causal mask's right bound is its own diagonal)
        vis = vis & (j <= i + off + right)
    if cfg.mask_type == "arbitrary":
        if attention_mask is None:
            raise ValueError("attn_mask_type='arbitrary' needs attention_mask (True = masked out)")
        if attention_mask.dtype != torch.bool:
            raise TypeError(f"attention_mask must be a bool tensor (True = masked out), got {attention_mask.dtype}")
        vis = vis & ~attention_mask.to(device)
    return vis, shift


def _add_bias(s, cfg, bias, alibi_slopes, shift, h, sq, skv):
    """Scores with the bias of cfg.bias_type (pre-scale bias is applied by the caller)."""
    if cfg.bias_type == "post_scale_bias":
        s = s + bias.to(s.dtype)
    elif cfg.bias_type == "alibi":
        slopes = alibi_slopes_default(h, s.device) if alibi_slopes is None else alibi_slopes
        slopes = slopes.to(s.dtype)
        slopes = slopes.view(1, h, 1, 1) if slopes.dim() == 1 else slopes.view(-1, h, 1, 1)
        i = torch.arange(sq, device=s.device)[:, None]
        j = torch.arange(skv, device=s.device)[None, :]
        off = shift if cfg.bottom_right else 0
        s = s - slopes * (i + off - j).abs().to(s.dtype)
    return s


def _softmax(s, vis, cfg, softmax_offset):
    """P = softmax over keys with the softmax type's sink; fully masked rows give 0."""
    s = s.masked_fill(~vis, float("-inf"))
    sink = None
    if cfg.softmax_type == "off-by-one":
        sink = torch.zeros((), dtype=s.dtype, device=s.device)
    elif cfg.softmax_type == "learnable":
        sink = softmax_offset.to(s.dtype).view(1, -1, 1, 1)
    peak = s.detach().amax(dim=-1, keepdim=True)
    if sink is not None:
        peak = torch.maximum(peak, sink.detach().expand_as(peak))
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))  # (shift invariance)
    e = torch.exp(s - peak)
    denom = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - peak)
    return e / torch.where(denom == 0, torch.ones_like(denom), denom)


def _heads_first(t):
    """[b, s, h, d] -> [b, h, s, d] contiguous."""
    return t.permute(0, 2, 1, 3).contiguous()


class UnfusedDotProductAttention(torch.nn.Module):
    """softmax(scale * QK^T + bias + mask) V in torch, every layout and mask."""

    def __init__(
        self,
        softmax_scale,
        attention_type="self",
        attention_dropout=0.0,
        layer_number=None,
        softmax_type="vanilla",
        return_max_logit=False,
    ):
        super().__init__()
        self.softmax_scale = softmax_scale
        self.attention_type = attention_type
        self.attention_dropout = attention_dropout
        self.layer_number = layer_number
        self.softmax_type = softmax_type
        self.return_max_logit = return_max_logit

    def forward(
        self,
        cfg: AttnConfig,
        q,
        k,
        v,
        *,
        attention_mask=None,
        cu_seqlens_q=None,
        cu_seqlens_kv=None,
        cu_seqlens_q_padded=None,
        cu_seqlens_kv_padded=None,
        max_seqlen_q=None,
        max_seqlen_kv=None,
        bias=None,
        alibi_slopes=None,
        softmax_offset=None,
        fp8=None,
    ):
        """fp8: the FP8 attention hooks (fp8.Hooks) of a recipe with fp8_dpa, or None."""
        from .utils import split_format

        q_fmt, kv_fmt = split_format(cfg.qkv_format)
        pq = Padded(q, q_fmt, cu_seqlens_q, cu_seqlens_q_padded, max_seqlen_q)
        pk = Padded(k, kv_fmt, cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_kv)
        pv = Padded(v, kv_fmt, cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_kv)
        qb, kb, vb = pq.data, pk.data, pv.data
        b, sq, h, d = qb.shape
        skv, hk, dv = kb.shape[1], kb.shape[2], vb.shape[3]
        device = qb.device
        mask_arg = attention_mask if cfg.mask_type == "arbitrary" else None
        valid = padding_validity(cfg.mask_type, attention_mask, cu_seqlens_q, cu_seqlens_kv, pq, pk, sq, skv, device)
        vis, shift = _visible(cfg, valid, b, sq, skv, device, mask_arg)
        compute = torch.float64 if qb.dtype == torch.float64 else torch.float32
        group = h // hk
        qh = _heads_first(qb).to(compute).view(b, hk, group * sq, d)
        kh = _heads_first(kb).to(compute)
        vh = _heads_first(vb).to(compute)
        if fp8 is not None:
            qh, kh, vh = fp8.inputs(qh, kh, vh)
        raw = torch.matmul(qh, kh.transpose(-1, -2)).view(b, h, sq, skv)
        if cfg.bias_type == "pre_scale_bias":
            raw = raw + bias.to(compute)
        s = raw * cfg.scale
        if cfg.softcap > 0:
            s = cfg.softcap * torch.tanh(s / cfg.softcap)
        s = _add_bias(s, cfg, bias, alibi_slopes, shift, h, sq, skv)
        if fp8 is not None:
            s = fp8.score_grad(s)
        p = _softmax(s, vis, cfg, softmax_offset)
        if cfg.dropout > 0 and self.training:
            p = torch.nn.functional.dropout(p, cfg.dropout)
        if fp8 is not None:
            p = fp8.probs(p)
        o = torch.matmul(p.view(b, hk, group * sq, skv), vh).view(b, h, sq, dv)
        if fp8 is not None:
            o = fp8.output(o)
        o = o.to(qb.dtype).permute(0, 2, 1, 3)  # [b, sq, h, dv]
        out = pq.restore(o)
        out = out.reshape(*out.shape[:-2], h * dv)
        if cfg.return_max_logit:
            masked = s.detach().masked_fill(~vis, float("-inf"))
            return out, masked.amax(dim=(0, 2, 3)).float()
        return out
