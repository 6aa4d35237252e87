"""Scaled dot-product attention on NumPy arrays (the core's CPU backend).

Formulas and layouts: core/include/te/attention.h. Per batch b, query head h
and kv head h // (H // Hk):
    S = scale * q k^T (+ bias before or after the scale, or - slope * |i + skv - sq - j|
        for ALiBi), masked entries -inf,
    P = softmax(S) (vanilla, off_by_one: one more zero logit, learnable: one more
        logit softmax_offset[h]),  O = dropout(P) V,  lse = log(sum exp(S) (+ sink)).
Rows with no visible key give O = 0 and lse = -inf. Arithmetic is FP32; O is
rounded once to the inputs' type.

    o, lse = attention_fwd(q, k, v, qkv_format="bshd", attn_mask_type="causal")
    dq, dk, dv, dbias, dsoftmax_offset = attention_bwd(q, k, v, o, d_o, lse, ...)

Arrays: q [B, Sq, H, D] (bshd), [Sq, B, H, D] (sbhd) or [Tq, H, D] (thd, with
cu_seqlens_q/kv and max_seqlen_q/kv); k [.., Hk, D], v [.., Hk, Dv]. attn_mask
(arbitrary masks) is boolean [B or 1, H or 1, Sq, Skv], True = masked out.
rng_state = (seed, offset) for dropout > 0.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._arrays import as_high_precision, desc
from ._checks import contiguous, flag, fp32_array, integer, real
from ._native import lib

QKV_FORMATS = {"bshd": 0, "sbhd": 1, "thd": 2}
ATTN_MASK_TYPES = {
    "no_mask": 0,
    "padding": 1,
    "causal": 2,
    "padding_causal": 3,
    "causal_bottom_right": 4,
    "padding_causal_bottom_right": 5,
    "arbitrary": 6,
}
ATTN_BIAS_TYPES = {"no_bias": 0, "pre_scale_bias": 1, "post_scale_bias": 2, "alibi": 3}
SOFTMAX_TYPES = {"vanilla": 0, "off_by_one": 1, "learnable": 2}
BACKENDS = {0: "cpu", 1: "cudnn", 2: "cuda_fallback"}


class AttentionForward(NamedTuple):
    o: np.ndarray  # q's type, [.., H, Dv] in the layout
    softmax_lse: np.ndarray  # FP32 [B, H, Sq] (bshd/sbhd) or [Tq, H] (thd)


class AttentionGrad(NamedTuple):
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dbias: np.ndarray | None  # pre/post_scale_bias only
    dsoftmax_offset: np.ndarray | None  # learnable softmax only (FP32 [H])


def _code(table: dict, value: str, name: str) -> int:
    if value not in table:
        raise ValueError(f"argument '{name}' must be one of {', '.join(table)}, got {value!r}")
    return table[value]


def _int32_vector(x, name):
    if x is None:
        return None
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"argument '{name}' must hold integers, got {a.dtype}")
    return contiguous(a.astype(np.int32, copy=False), name)


def _fp32(x, name):
    return None if x is None else fp32_array(x, name)


def _config(q, k, v, kw: dict) -> tuple[dict, list]:
    """The keyword arguments of lib.attention_* and the arrays they point into (kept alive)."""
    q = as_high_precision(q, "q")
    k, v = contiguous(k, "k"), contiguous(v, "v")
    window = kw["window_size"] if kw["window_size"] is not None else (-1, -1)
    if len(window) != 2:
        raise ValueError(f"argument 'window_size' must be (left, right), got {window!r}")
    scale = kw["attn_scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    bias = kw["attn_bias"]
    bias = None if bias is None else contiguous(bias, "bias")  # q's type: the core checks
    mask = kw["attn_mask"]
    mask = None if mask is None else contiguous(np.asarray(mask).astype(np.uint8), "attn_mask")
    rng = kw["rng_state"]
    if rng is not None:  # (seed, offset): 64-bit words, signed or not
        words = rng.reshape(-1).tolist() if isinstance(rng, np.ndarray) else list(rng)
        rng = np.array([integer(x, "rng_state") % 2**64 for x in words], dtype=np.uint64).view(np.int64)
    arrays = {
        "bias": bias,
        "alibi_slopes": _fp32(kw["alibi_slopes"], "alibi_slopes"),
        "cu_seqlens_q": _int32_vector(kw["cu_seqlens_q"], "cu_seqlens_q"),
        "cu_seqlens_kv": _int32_vector(kw["cu_seqlens_kv"], "cu_seqlens_kv"),
        "cu_seqlens_q_padded": _int32_vector(kw["cu_seqlens_q_padded"], "cu_seqlens_q_padded"),
        "cu_seqlens_kv_padded": _int32_vector(kw["cu_seqlens_kv_padded"], "cu_seqlens_kv_padded"),
        "attn_mask": mask,
        "softmax_offset": _fp32(kw["softmax_offset"], "softmax_offset"),
        "rng_state": rng,
    }
    args = {name: (None if a is None else desc(a)) for name, a in arrays.items()}
    args.update(
        qkv_format=_code(QKV_FORMATS, kw["qkv_format"], "qkv_format"),
        mask_type=_code(ATTN_MASK_TYPES, kw["attn_mask_type"], "attn_mask_type"),
        bias_type=_code(ATTN_BIAS_TYPES, kw["attn_bias_type"], "attn_bias_type"),
        softmax_type=_code(SOFTMAX_TYPES, kw["softmax_type"], "softmax_type"),
        scale=real(scale, "scale"),
        dropout=real(kw["dropout"], "dropout"),
        window_left=integer(window[0], "window_size[0]"),
        window_right=integer(window[1], "window_size[1]"),
        max_seqlen_q=integer(kw["max_seqlen_q"] or 0, "max_seqlen_q"),
        max_seqlen_kv=integer(kw["max_seqlen_kv"] or 0, "max_seqlen_kv"),
        deterministic=flag(kw["deterministic"], "deterministic"),
    )
    keep = [q, k, v, *arrays.values()]
    return args, keep


def _lse_shape(q, kw, heads):
    fmt = kw["qkv_format"]
    if fmt == "thd":
        return (q.shape[0], heads)
    b, s = (q.shape[0], q.shape[1]) if fmt == "bshd" else (q.shape[1], q.shape[0])
    return (b, heads, s)


_DEFAULTS = dict(
    qkv_format="bshd",
    attn_mask_type="no_mask",
    attn_bias_type="no_bias",
    softmax_type="vanilla",
    attn_scale=None,
    dropout=0.0,
    window_size=None,
    cu_seqlens_q=None,
    cu_seqlens_kv=None,
    cu_seqlens_q_padded=None,
    cu_seqlens_kv_padded=None,
    max_seqlen_q=None,
    max_seqlen_kv=None,
    attn_bias=None,
    alibi_slopes=None,
    attn_mask=None,
    softmax_offset=None,
    rng_state=None,
    deterministic=False,
)


def _options(kwargs: dict) -> dict:
    unknown = set(kwargs) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(unknown))}")
    return {**_DEFAULTS, **kwargs}


def attention_fwd(q, k, v, **kwargs) -> AttentionForward:
    """Attention forward. Keyword arguments (defaults): qkv_format ('bshd'),
    attn_mask_type ('no_mask'), attn_bias_type ('no_bias'), softmax_type ('vanilla'),
    attn_scale (1/sqrt(D)), dropout (0), window_size ((-1, -1)), cu_seqlens_q/kv,
    cu_seqlens_q/kv_padded, max_seqlen_q/kv (thd), attn_bias, alibi_slopes, attn_mask,
    softmax_offset, rng_state ((seed, offset)), deterministic."""
    kw = _options(kwargs)
    args, keep = _config(q, k, v, kw)
    q, k, v = keep[:3]
    o = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    lse = np.empty(_lse_shape(q, kw, q.shape[-2]), dtype=np.float32)
    lib.attention_fwd(desc(q), desc(k), desc(v), desc(o), desc(lse), **args)
    return AttentionForward(o, lse)


def attention_bwd(q, k, v, o, d_o, softmax_lse, **kwargs) -> AttentionGrad:
    """Attention backward from the forward's inputs, its o and softmax_lse and the output
    gradient d_o; the same keyword arguments as attention_fwd."""
    kw = _options(kwargs)
    args, keep = _config(q, k, v, kw)
    q, k, v = keep[:3]
    o = contiguous(o, "o")
    d_o = contiguous(d_o, "d_o")
    lse = fp32_array(softmax_lse, "softmax_lse")
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    bias = keep[3]
    dbias = None if bias is None else np.empty_like(bias)
    dalpha = None if kw["softmax_type"] != "learnable" else np.empty(q.shape[-2], dtype=np.float32)
    lib.attention_bwd(
        desc(q),
        desc(k),
        desc(v),
        desc(o),
        desc(d_o),
        desc(lse),
        desc(dq),
        desc(dk),
        desc(dv),
        dbias=None if dbias is None else desc(dbias),
        dsoftmax_offset=None if dalpha is None else desc(dalpha),
        **args,
    )
    return AttentionGrad(dq, dk, dv, dbias, dalpha)


def attention_backend(q, k, v, **kwargs) -> str:
    """Which backend attention_fwd would run for these arguments ('cpu' for NumPy arrays)."""
    kw = _options(kwargs)
    args, keep = _config(q, k, v, kw)
    q, k, v = keep[:3]
    return BACKENDS[lib.attention_backend(desc(q), desc(k), desc(v), **args)]
