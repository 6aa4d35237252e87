"""float64 MultiheadAttention / TransformerLayer built from a module's own
parameters (the te-pytorch attention tests' oracle).

Plain torch written from the documented layouts: the fused QKV rows are
picked head by head, the attention is pt_attention_ref's per-sequence loop,
the norms and the MLP are pt_norm_mlp_ref's.
"""

from __future__ import annotations

import torch
from pt_attention_ref import attention
from pt_norm_mlp_ref import act64, norm64


def qkv_rows(heads, groups, d, interleaved):
    """Row indices of each query head, key head and value head in the fused QKV output."""
    n = heads // groups
    if interleaved:
        q = [((p // n) * (n + 2) + p % n) * d for p in range(heads)]
        k = [(g * (n + 2) + n) * d for g in range(groups)]
        v = [(g * (n + 2) + n + 1) * d for g in range(groups)]
    else:
        q = [p * d for p in range(heads)]
        k = [(heads + g) * d for g in range(groups)]
        v = [(heads + groups + g) * d for g in range(groups)]
    return q, k, v


def _heads(y, starts, d):
    return torch.stack([y[..., s : s + d] for s in starts], dim=-2)


def _linear(x, p, name):
    """x @ W^T + b of Linear `name` (its weight fused or split into query/key/value)."""
    if f"{name}.weight" in p:
        w, b = p[f"{name}.weight"], p.get(f"{name}.bias")
    else:
        parts = [s for s in ("query", "key", "value") if f"{name}.{s}_weight" in p]
        w = torch.cat([p[f"{name}.{s}_weight"] for s in parts])
        b = torch.cat([p[f"{name}.{s}_bias"] for s in parts]) if f"{name}.{parts[0]}_bias" in p else None
    return x @ w.T + (0 if b is None else b)


def rope_angles(positions, d2, base=10000.0):
    return positions.double()[:, None] * base ** (-2.0 * torch.arange(d2 // 2).double() / d2)


def rope(x, angles):
    """x [b, s, h, d] rotated on pairs (k, k + d2/2) by angles [b or 1, s, d2/2]."""
    half = angles.shape[-1]
    a, bb, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    c, s = torch.cos(angles)[:, :, None, :], torch.sin(angles)[:, :, None, :]
    return torch.cat((a * c - bb * s, bb * c + a * s, rest), dim=-1)


def _qk_norm(t, p, name, kind, eps):
    if kind is None:
        return t
    if kind == "L2Normalization":
        return t * torch.rsqrt((t * t).sum(-1, keepdim=True) + eps)
    return norm64(t, p[f"{name}.weight"], p.get(f"{name}.bias"), eps, False, kind == "RMSNorm")


def mha64(x, p, c, *, prefix="", encoder=None, cross=False, angles=None, lq=None, lkv=None, mask_type=None):
    """(output without proj bias, proj bias, normalized input) of a MultiheadAttention
    in bshd [b, s, hidden]; c: dict of the module's settings (see TransformerCase)."""
    pre = prefix
    h, g, d = c["heads"], c["groups"], c["d"]
    ln = None
    if cross:
        ln = norm64(
            x,
            p[f"{pre}layernorm_query.layer_norm_weight"],
            p.get(f"{pre}layernorm_query.layer_norm_bias"),
            c["eps"],
            c["zc"],
            c["rms"],
        )
        q = _linear(ln, p, f"{pre}layernorm_query").reshape(*x.shape[:2], h, d)
        kv = _linear(encoder, p, f"{pre}key_value")
        if c["interleaved"]:
            k = _heads(kv, [2 * gi * d for gi in range(g)], d)
            v = _heads(kv, [(2 * gi + 1) * d for gi in range(g)], d)
        else:
            k, v = _heads(kv, [gi * d for gi in range(g)], d), _heads(kv, [(g + gi) * d for gi in range(g)], d)
    else:
        name = f"{pre}layernorm_qkv" if c["input_ln"] else f"{pre}qkv"
        inp = x
        if c["input_ln"]:
            ln = inp = norm64(
                x, p[f"{name}.layer_norm_weight"], p.get(f"{name}.layer_norm_bias"), c["eps"], c["zc"], c["rms"]
            )
        y = _linear(inp, p, name)
        rq, rk, rv = qkv_rows(h, g, d, c["interleaved"])
        q, k, v = _heads(y, rq, d), _heads(y, rk, d), _heads(y, rv, d)
    before = c.get("qk_norm_before_rope", False)
    if before:
        q, k = (
            _qk_norm(q, p, f"{pre}q_norm", c.get("qk_norm"), 1e-6),
            _qk_norm(k, p, f"{pre}k_norm", c.get("qk_norm"), 1e-6),
        )
    if angles is not None:
        q, k = rope(q, angles), rope(k, angles)
    if not before:
        q, k = (
            _qk_norm(q, p, f"{pre}q_norm", c.get("qk_norm"), 1e-6),
            _qk_norm(k, p, f"{pre}k_norm", c.get("qk_norm"), 1e-6),
        )
    b, sq, skv = q.shape[0], q.shape[1], k.shape[1]
    lq = torch.full((b,), sq) if lq is None else lq
    lkv = torch.full((b,), skv) if lkv is None else lkv
    mt = mask_type or c["mask_type"]
    o = attention(q, k, v, lq, lkv, mask_type=mt, bottom_right=mt not in ("causal", "padding_causal"))
    out = o.reshape(b, sq, h * d) @ p[f"{pre}proj.weight"].T
    return out, p.get(f"{pre}proj.bias"), ln


def transformer64(x, p, c, encoder=None):
    """TransformerLayer in float64 (bshd [b, s, hidden], dropout off)."""

    def add(y, bias, res):
        return res + y + (0 if bias is None else bias)

    attn, ab, ln = mha64(x, p, c, prefix="self_attention.")
    post = c["post_ln"] and not c["output_ln"]
    h = x if c["parallel"] else add(attn, ab, ln if post else x)
    if c["decoder"]:
        cr, cb, cln = mha64(h, p, dict(c, mask_type="no_mask"), prefix="inter_attention.", encoder=encoder, cross=True)
        h = add(cr, cb, cln if c["post_ln"] else h)
    mln = norm64(
        h, p["layernorm_mlp.layer_norm_weight"], p.get("layernorm_mlp.layer_norm_bias"), c["eps"], c["zc"], c["rms"]
    )
    f1 = mln @ p["layernorm_mlp.fc1_weight"].T + p.get("layernorm_mlp.fc1_bias", 0)
    mlp = act64(f1, c["act"]) @ p["layernorm_mlp.fc2_weight"].T
    mb = p.get("layernorm_mlp.fc2_bias")
    if c["post_ln"]:
        out = add(mlp, mb, mln)
    elif c["parallel"]:
        out = add(mlp, mb, add(attn, ab, x))
    else:
        out = add(mlp, mb, h)
    if c["output_ln"]:
        out = norm64(out, p["layernorm.weight"], p.get("layernorm.bias"), c["eps"], c["zc"], c["rms"])
    return out
