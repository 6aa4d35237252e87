"""Scaled dot-product attention on JAX arrays through te-core's kernels (XLA FFI).

Formulas, layouts and the meaning of every option: core/include/te/attention.h
(the same as transformer_engine.core.attention, whose keyword names these
wrappers take). Per batch b, query head h and kv head h // (H // Hk):

    S = scale * q k^T (+ bias before or after the scale; ALiBi), masked -inf,
    P = softmax(S) (vanilla / off_by_one / learnable), O = dropout(P) V,
    softmax_lse = log(sum_j exp(S) (+ sink))       FP32, saved for the backward

    o, lse = attention_fwd(q, k, v, qkv_format="bshd", attn_mask_type="causal")
    dq, dk, dv, dbias, dsoftmax_offset = attention_bwd(q, k, v, o, d_o, lse, ...)

Optional tensors are None when unused (zero-element placeholders reach the
handler). rng_state: the dropout (seed, offset) as int32 [4] = (seed lo, seed
hi, offset lo, offset hi) -- JAX without x64 has no int64 arrays; the handler
reads those 16 bytes as te-core's INT64 [2]. make_rng_state builds it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

import jax
import jax.numpy as jnp
from transformer_engine.core.attention import ATTN_BIAS_TYPES, ATTN_MASK_TYPES, QKV_FORMATS, SOFTMAX_TYPES

from . import _registry  # noqa: F401 - registers the FFI targets
from ._checks import HIGH_PRECISION, check_dtype, dtype_name
from ._outputs import placeholder


class AttentionForward(NamedTuple):
    o: jax.Array  # q's type, [.., H, Dv] in the layout
    softmax_lse: jax.Array  # float32 [B, H, Sq] (bshd, sbhd) or [Tq, H] (thd)


class AttentionGrad(NamedTuple):
    dq: jax.Array
    dk: jax.Array
    dv: jax.Array
    dbias: jax.Array | None  # pre/post_scale_bias with want_dbias only
    dsoftmax_offset: jax.Array | None  # learnable softmax only: float32, softmax_offset's shape


_OPTIONAL = (
    "bias",
    "alibi_slopes",
    "cu_seqlens_q",
    "cu_seqlens_kv",
    "cu_seqlens_q_padded",
    "cu_seqlens_kv_padded",
    "attn_mask",
    "softmax_offset",
    "rng_state",
)


def make_rng_state(seed, offset=0) -> jax.Array:
    """int32 [4] (seed lo, seed hi, offset lo, offset hi) from a uint32 [2]
    array or a JAX PRNG key (its two words: seed = w0 + 2^32 w1) and a Python
    int offset."""
    if jnp.issubdtype(jnp.asarray(seed).dtype, jax.dtypes.prng_key):
        seed = jax.random.key_data(seed)
    words = jnp.asarray(seed).reshape(-1).astype(jnp.uint32)
    if words.shape[0] < 2:
        words = jnp.concatenate([words, jnp.zeros((2 - words.shape[0],), jnp.uint32)])
    off = jnp.asarray([offset & 0xFFFFFFFF, (offset >> 32) & 0xFFFFFFFF], jnp.uint32)
    return jax.lax.bitcast_convert_type(jnp.concatenate([words[:2], off]), jnp.int32)


def _code(table: dict, value: str, name: str) -> int:
    if value not in table:
        raise ValueError(f"argument '{name}' must be one of {', '.join(table)}, got {value!r}")
    return table[value]


def _attributes(
    qkv_format="bshd",
    attn_mask_type="no_mask",
    attn_bias_type="no_bias",
    softmax_type="vanilla",
    scale=None,
    dropout=0.0,
    window_size=(-1, -1),
    max_seqlen_q=0,
    max_seqlen_kv=0,
    deterministic=False,
    *,
    head_dim,
) -> dict:
    """The handler's attributes (named like te_attention_config's fields)."""
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"argument 'dropout' must be in [0, 1), got {dropout}")
    left, right = (-1, -1) if window_size is None else window_size
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"argument 'scale' must be finite, got {scale}")
    return dict(
        qkv_format=np.int64(_code(QKV_FORMATS, qkv_format, "qkv_format")),
        mask_type=np.int64(_code(ATTN_MASK_TYPES, attn_mask_type, "attn_mask_type")),
        bias_type=np.int64(_code(ATTN_BIAS_TYPES, attn_bias_type, "attn_bias_type")),
        softmax_type=np.int64(_code(SOFTMAX_TYPES, softmax_type, "softmax_type")),
        scale=np.float32(scale),
        dropout=np.float32(dropout),
        window_left=np.int64(left),
        window_right=np.int64(right),
        max_seqlen_q=np.int64(max_seqlen_q),
        max_seqlen_kv=np.int64(max_seqlen_kv),
        deterministic=np.bool_(deterministic),
    )


def _operands(tensors: dict) -> list:
    """The nine optional operands in the handler's order (placeholders for None)."""
    out = []
    for name in _OPTIONAL:
        x = tensors.get(name)
        if x is None:
            out.append(placeholder())
        elif name == "attn_mask":
            out.append(jnp.asarray(x).astype(jnp.uint8))  # nonzero = masked out
        elif name.startswith("cu_seqlens"):
            out.append(jnp.asarray(x).astype(jnp.int32))
        elif name == "rng_state":
            if tuple(x.shape) != (4,) or jnp.dtype(x.dtype) != jnp.int32:
                raise ValueError(
                    f"argument 'rng_state' must be int32 of shape (4,) (make_rng_state), "
                    f"got {dtype_name(x.dtype)} {tuple(x.shape)}"
                )
            out.append(x)
        else:
            out.append(x)
    return out


def _check_qkv(q, k, v) -> None:
    check_dtype(q, "q", HIGH_PRECISION)
    for name, x in (("k", k), ("v", v)):
        if jnp.dtype(x.dtype) != jnp.dtype(q.dtype):
            raise TypeError(f"argument '{name}' must have q's type ({dtype_name(q.dtype)}), got {dtype_name(x.dtype)}")
    if not (q.ndim == k.ndim == v.ndim) or q.ndim not in (3, 4):
        raise ValueError(
            "arguments 'q', 'k', 'v' must all be 4-D (bshd, sbhd) or all 3-D (thd), "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )


def _lse_shape(q, qkv_format: str) -> tuple:
    if qkv_format == "thd":
        return (q.shape[0], q.shape[1])
    b, s = (q.shape[0], q.shape[1]) if qkv_format == "bshd" else (q.shape[1], q.shape[0])
    return (b, q.shape[2], s)


def _split(kwargs: dict) -> tuple[dict, dict]:
    tensors = {name: kwargs.pop(name) for name in _OPTIONAL if name in kwargs}
    return tensors, kwargs


def attention_fwd(q, k, v, **kwargs) -> AttentionForward:
    """(o, softmax_lse). Keywords: the optional tensors (bias, alibi_slopes,
    cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
    attn_mask, softmax_offset, rng_state) and the configuration (qkv_format,
    attn_mask_type, attn_bias_type, softmax_type, scale (None: 1/sqrt(D)),
    dropout, window_size (left, right), max_seqlen_q, max_seqlen_kv (thd),
    deterministic)."""
    tensors, config = _split(dict(kwargs))
    _check_qkv(q, k, v)
    attrs = _attributes(**config, head_dim=q.shape[-1])
    fmt = config.get("qkv_format", "bshd")
    results = (
        jax.ShapeDtypeStruct((*q.shape[:-1], v.shape[-1]), q.dtype),
        jax.ShapeDtypeStruct(_lse_shape(q, fmt), jnp.float32),
    )
    call = jax.ffi.ffi_call("te_jax_attention_fwd", results, vmap_method="sequential")
    o, lse = call(q, k, v, *_operands(tensors), **attrs)
    return AttentionForward(o, lse)


def attention_bwd(q, k, v, o, d_o, softmax_lse, *, want_dbias=True, **kwargs) -> AttentionGrad:
    """(dq, dk, dv, dbias, dsoftmax_offset) from the forward's o and
    softmax_lse; keywords as attention_fwd. dbias (bias's shape and type) is
    returned when a bias is given and want_dbias; dsoftmax_offset (float32,
    softmax_offset's shape) with the learnable softmax."""
    tensors, config = _split(dict(kwargs))
    _check_qkv(q, k, v)
    attrs = _attributes(**config, head_dim=q.shape[-1])
    bias, offset = tensors.get("bias"), tensors.get("softmax_offset")
    asked_dbias = bias is not None and want_dbias
    learnable = config.get("softmax_type", "vanilla") == "learnable" and offset is not None
    none = jax.ShapeDtypeStruct((0,), jnp.float32)
    results = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, q.dtype),
        jax.ShapeDtypeStruct(v.shape, q.dtype),
        jax.ShapeDtypeStruct(bias.shape, bias.dtype) if asked_dbias else none,
        jax.ShapeDtypeStruct(offset.shape, jnp.float32) if learnable else none,
    )
    call = jax.ffi.ffi_call("te_jax_attention_bwd", results, vmap_method="sequential")
    dq, dk, dv, dbias, doffset = call(q, k, v, o, d_o, softmax_lse, *_operands(tensors), **attrs)
    return AttentionGrad(dq, dk, dv, dbias if asked_dbias else None, doffset if learnable else None)
