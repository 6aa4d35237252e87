"""Flax DotProductAttention and RelativePositionBiases (the reference's fields and names).

DotProductAttention runs transformer_engine.jax.attention.fused_attn (te-core's kernels)
when NVTE_FUSED_ATTN is not "0" and is_fused_attn_kernel_available says yes, else an
unfused jax.numpy implementation of the same formulas (core/include/te/attention.h: masks,
windows, bias, softmax variants; rows without a visible key give 0 in both paths).
The learnable softmax's offset is a param "softmax_offset" [1, H, 1, 1] float32 (zeros) of
the inner module (_FusedDotProductAttention_0 or _UnfusedDotProductAttention_0, as in
the reference). Dropout draws from the rng collection `dropout_rng_name`; the fused and
unfused paths draw different bits (te-core's Philox vs jax.random).
"""

from __future__ import annotations

import math
import os
from typing import Any

import flax.linen as nn  # (ruff's isort files it apart: this package is named flax too)
import numpy as np

import jax
import jax.numpy as jnp

from ..attention import (
    AttnBiasType,
    AttnMaskType,
    AttnSoftmaxType,
    CPStrategy,
    QKVLayout,
    SequenceDescriptor,
    canonicalize_attn_mask_type,
    fused_attn,
    is_fused_attn_kernel_available,
)


def _offset_param(module: nn.Module, softmax_type, heads: int):
    if softmax_type != AttnSoftmaxType.LEARNABLE_SOFTMAX:
        return None
    return module.param("softmax_offset", nn.initializers.zeros, (1, heads, 1, 1), jnp.float32)


def visible_mask(mask_type: AttnMaskType, window, sq: int, skv: int):
    """[sq, skv] bool: the keys each query sees under the mask type's causal rule and the
    window (te/attention.h: top-left diagonal for causal / padding_causal, bottom-right
    otherwise)."""
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    off = 0 if mask_type in (AttnMaskType.CAUSAL_MASK, AttnMaskType.PADDING_CAUSAL_MASK) else skv - sq
    keep = np.ones((sq, skv), bool)
    if mask_type.is_causal():
        keep &= j <= i + off
    left, right = (-1, -1) if window is None else window
    if left >= 0:
        keep &= j >= i + off - left
    if right >= 0:
        keep &= j <= i + off + right
    return keep


def unfused_attention(q, k, v, mask, bias, softmax_offset, *, mask_type, bias_type, softmax_type, scale, window,
                      dropout, dropout_rng, float32_logits=False):  # fmt: skip
    """The jax.numpy attention of bshd q [b, sq, h, d], k/v [b, skv, hk, d(v)]; mask [b or 1,
    1 or h, sq, skv] True = masked out (used by padding mask types only)."""
    dtype = q.dtype
    b, sq, h, d = q.shape
    skv, hk = k.shape[1], k.shape[2]
    if float32_logits:
        q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    grouped = q.reshape(b, sq, hk, h // hk, d)
    logits = jnp.einsum("bqhgd,bkhd->bhgqk", grouped, k, preferred_element_type=jnp.float32).reshape(b, h, sq, skv)
    if bias_type == AttnBiasType.PRE_SCALE_BIAS:
        logits = (logits + bias.astype(jnp.float32)) * scale
    elif bias_type == AttnBiasType.POST_SCALE_BIAS:
        logits = logits * scale + bias.astype(jnp.float32)
    else:
        logits = logits * scale
    keep = jnp.asarray(visible_mask(mask_type, window, sq, skv))[None, None]
    if mask is not None and mask_type.is_padding():
        keep = keep & jnp.logical_not(mask.astype(bool))
    logits = jnp.where(keep, logits, -jnp.inf)
    sink = None
    if softmax_type == AttnSoftmaxType.OFF_BY_ONE_SOFTMAX:
        sink = jnp.zeros((1, h, 1, 1), jnp.float32)
    elif softmax_type == AttnSoftmaxType.LEARNABLE_SOFTMAX:
        sink = softmax_offset.reshape(1, h, 1, 1).astype(jnp.float32)
    m = jnp.max(logits, axis=-1, keepdims=True)
    if sink is not None:
        m = jnp.maximum(m, sink)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(logits - m)
    denom = jnp.sum(e, axis=-1, keepdims=True) + (0.0 if sink is None else jnp.exp(sink - m))
    any_visible = jnp.any(keep, axis=-1, keepdims=True)
    p = jnp.where(any_visible, e / jnp.where(denom > 0, denom, 1.0), 0.0)
    if dropout > 0.0:
        kept = jax.random.bernoulli(dropout_rng, 1.0 - dropout, p.shape)
        p = jnp.where(kept, p / (1.0 - dropout), 0.0)
    p = p.astype(dtype).reshape(b, hk, h // hk, sq, skv)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", p, v, preferred_element_type=jnp.float32)
    return out.reshape(b, sq, h, v.shape[-1]).astype(dtype)


def _split_packed(query, key, value, layout: QKVLayout):
    if layout.is_qkvpacked():
        return query[..., 0, :, :], query[..., 1, :, :], query[..., 2, :, :]
    if layout.is_kvpacked():
        return query, key[..., 0, :, :], key[..., 1, :, :]
    return query, key, value


class _UnfusedDotProductAttention(nn.Module):
    """The jax.numpy path of DotProductAttention (bshd inputs)."""

    attention_dropout: float = 0.0
    attn_mask_type: AttnMaskType = AttnMaskType.CAUSAL_MASK
    attn_bias_type: AttnBiasType = AttnBiasType.NO_BIAS
    float32_logits: bool = False
    scale_factor: float = 1.0
    window_size: tuple | None = None
    softmax_type: AttnSoftmaxType = AttnSoftmaxType.VANILLA_SOFTMAX

    @nn.compact
    def __call__(self, query, key, value, mask=None, bias=None, *, dropout_rng=None, deterministic=False):
        offset = _offset_param(self, self.softmax_type, query.shape[-2])
        return unfused_attention(
            query, key, value, mask, bias, offset, mask_type=self.attn_mask_type, bias_type=self.attn_bias_type,
            softmax_type=self.softmax_type, scale=self.scale_factor, window=self.window_size,
            dropout=0.0 if deterministic else self.attention_dropout, dropout_rng=dropout_rng,
            float32_logits=self.float32_logits,
        )  # fmt: skip


class _FusedDotProductAttention(nn.Module):
    """The fused_attn path of DotProductAttention (bshd / thd inputs, packed or not)."""

    attention_dropout: float = 0.0
    attn_mask_type: AttnMaskType = AttnMaskType.CAUSAL_MASK
    attn_bias_type: AttnBiasType = AttnBiasType.NO_BIAS
    qkv_layout: QKVLayout = QKVLayout.BSHD_BSHD_BSHD
    scale_factor: float = 1.0
    window_size: tuple | None = None
    max_segments_per_seq: int = 1
    softmax_type: AttnSoftmaxType = AttnSoftmaxType.VANILLA_SOFTMAX

    @nn.compact
    def __call__(self, qkv, sequence_descriptor=None, bias=None, *, dropout_rng=None, deterministic=False):
        offset = _offset_param(self, self.softmax_type, qkv[0].shape[-2])
        return fused_attn(
            qkv, bias, sequence_descriptor, dropout_rng, self.attn_bias_type, self.attn_mask_type, self.qkv_layout,
            self.softmax_type, self.scale_factor, self.attention_dropout, not deterministic,
            max_segments_per_seq=self.max_segments_per_seq, window_size=self.window_size, softmax_offset=offset,
        )  # fmt: skip


class DotProductAttention(nn.Module):
    """softmax(scale * q k^T (+ bias), mask) v over heads, q [b, s, h, d] (transpose_batch_sequence:
    [s, b, h, d]); qkv_layout 'bshd_bshd_bshd' (query, key, value), 'bshd_bs2hd' (query, kv
    [.., 2, hk, d] as key, value ignored), 'bs3hd' (qkv [.., 3, h, d] as query) and the thd
    ones (fused path only). Called as (query, key, value, sequence_descriptor=None, bias=None,
    *, deterministic=False, mask=None): sequence_descriptor a SequenceDescriptor or a legacy
    boolean mask [b, 1, sq, skv] (True = masked out; read only by padding mask types).
    attn_bias_type None: post_scale_bias when a bias is given. scale_factor None: 1/sqrt(d).
    Not supported (NotImplementedError): context parallelism (context_parallel_*), score_mod,
    return_max_logit; FP8 inputs (te-core has no FP8 attention yet)."""

    head_dim: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    attention_dropout: float = 0.0
    attn_mask_type: str = "causal"
    attn_bias_type: str | None = None
    dtype: Any = None
    dropout_rng_name: str = "dropout"
    float32_logits: bool = False
    qkv_layout: str = "bshd_bshd_bshd"
    scale_factor: float | None = None
    transpose_batch_sequence: bool | None = None
    window_size: tuple | None = None
    max_segments_per_seq: int = 1
    context_parallel_causal_load_balanced: bool = False
    context_parallel_axis: str = ""
    context_parallel_strategy: str = "DEFAULT"
    context_checkpoint_name: str = "context"
    softmax_type: str = "vanilla"
    score_mod: Any = None
    score_mod_bprop: Any = None
    return_max_logit: bool = False

    @nn.compact
    def __call__(self, query, key, value, sequence_descriptor=None, bias=None, *, deterministic=False, mask=None,
                 score_mod_tensors=None, score_mod_bprop_tensors=None):  # fmt: skip
        self._check_unsupported(score_mod_tensors, score_mod_bprop_tensors)
        if mask is not None:
            if sequence_descriptor is not None:
                raise ValueError("arguments 'sequence_descriptor' and 'mask' cannot both be given")
            sequence_descriptor = mask
        layout, mask_type, bias_type, softmax_type = self._enums(bias)
        if self.dtype is not None and jnp.dtype(self.dtype) != jnp.dtype(query.dtype):
            raise ValueError(
                f"field 'dtype' of DotProductAttention ({jnp.dtype(self.dtype).name}) must match the inputs' type "
                f"({jnp.dtype(query.dtype).name}) or be None (the module has no parameters of its own)"
            )
        if bias is not None:
            bias = bias.astype(query.dtype)
        if self.transpose_batch_sequence:  # [s, b, ...] -> [b, s, ...]
            query, key, value = (None if x is None else jnp.swapaxes(x, 0, 1) for x in (query, key, value))
        q, k, v = _split_packed(query, key, value, layout)
        scale = 1.0 / math.sqrt(q.shape[-1]) if self.scale_factor is None else float(self.scale_factor)
        dropout_rng = None
        if not deterministic and self.attention_dropout > 0.0:
            dropout_rng = self.make_rng(self.dropout_rng_name)
        if self._use_fused(q, k, v, layout, mask_type, bias_type, softmax_type, deterministic):
            qkv = (query,) if layout.is_qkvpacked() else (query, key) if layout.is_kvpacked() else (q, k, v)
            out = _FusedDotProductAttention(
                attention_dropout=self.attention_dropout, attn_mask_type=mask_type, attn_bias_type=bias_type,
                qkv_layout=layout, scale_factor=scale, window_size=self.window_size,
                max_segments_per_seq=self.max_segments_per_seq, softmax_type=softmax_type,
            )(qkv, sequence_descriptor, bias, dropout_rng=dropout_rng, deterministic=deterministic)  # fmt: skip
        else:
            if layout.is_thd() or isinstance(sequence_descriptor, SequenceDescriptor):
                raise ValueError(
                    "the unfused DotProductAttention (NVTE_FUSED_ATTN=0) takes bshd layouts and a boolean mask "
                    "(or None) as sequence_descriptor"
                )
            out = _UnfusedDotProductAttention(
                attention_dropout=self.attention_dropout, attn_mask_type=mask_type, attn_bias_type=bias_type,
                float32_logits=self.float32_logits, scale_factor=scale, window_size=self.window_size,
                softmax_type=softmax_type,
            )(q, k, v, sequence_descriptor, bias, dropout_rng=dropout_rng, deterministic=deterministic)  # fmt: skip
        return jnp.swapaxes(out, 0, 1) if self.transpose_batch_sequence else out

    def _enums(self, bias):
        try:
            layout = QKVLayout[self.qkv_layout.upper()]
        except KeyError:
            names = ", ".join(m.name.lower() for m in QKVLayout)
            raise ValueError(f"field 'qkv_layout' must be one of {names}, got {self.qkv_layout!r}") from None
        if self.attn_bias_type is None:
            bias_type = AttnBiasType.NO_BIAS if bias is None else AttnBiasType.POST_SCALE_BIAS
        else:
            bias_type = _bias_type(self.attn_bias_type)
        if (bias_type == AttnBiasType.NO_BIAS) != (bias is None):
            raise ValueError(f"argument 'bias' must be {'None' if bias is not None else 'given'} with "
                             f"attn_bias_type={bias_type.name.lower()}")  # fmt: skip
        return (
            layout,
            canonicalize_attn_mask_type(self.attn_mask_type),
            bias_type,
            AttnSoftmaxType.from_str(self.softmax_type),
        )

    def _use_fused(self, q, k, v, layout, mask_type, bias_type, softmax_type, deterministic) -> bool:
        if os.environ.get("NVTE_FUSED_ATTN", "1") == "0":
            return False
        return is_fused_attn_kernel_available(
            not deterministic, q.dtype, k.dtype, layout, bias_type, mask_type, softmax_type, self.attention_dropout,
            q.shape[-2], k.shape[-2], q.shape[1], k.shape[1], q.shape[-1], v.shape[-1], self.window_size,
        )  # fmt: skip

    def _check_unsupported(self, score_mod_tensors, score_mod_bprop_tensors) -> None:
        for name, value, default in (
            ("context_parallel_causal_load_balanced", self.context_parallel_causal_load_balanced, False),
            ("context_parallel_axis", self.context_parallel_axis, ""),
            ("score_mod", self.score_mod, None),
            ("score_mod_bprop", self.score_mod_bprop, None),
            ("return_max_logit", self.return_max_logit, False),
            ("score_mod_tensors", score_mod_tensors, None),
            ("score_mod_bprop_tensors", score_mod_bprop_tensors, None),
        ):
            if value != default and value is not default:
                raise NotImplementedError(f"DotProductAttention: '{name}' is not yet supported by te-jax")
        if str(self.context_parallel_strategy).upper() != CPStrategy.DEFAULT.name:
            raise NotImplementedError("DotProductAttention: context_parallel_strategy other than 'DEFAULT' is not yet "
                                      "supported by te-jax")  # fmt: skip


def _bias_type(name) -> AttnBiasType:
    if isinstance(name, AttnBiasType):
        return name
    try:
        return AttnBiasType[str(name).upper()]
    except KeyError:
        raise ValueError(
            f"field 'attn_bias_type' must be None, 'no_bias', 'pre_scale_bias' or 'post_scale_bias', got {name!r}"
        ) from None


def relative_position_buckets(q_seqlen: int, k_seqlen: int, num_buckets: int, max_distance: int, bidirectional: bool):
    """T5's bucket of each (query i, key j) distance, int [q_seqlen, k_seqlen]: exact buckets
    for small distances, logarithmic ones up to max_distance, the last bucket beyond;
    bidirectional gives keys after the query their own half of the buckets."""
    distance = np.arange(q_seqlen)[:, None] - np.arange(k_seqlen)[None, :]  # query minus key
    n = num_buckets
    bucket = np.zeros_like(distance)
    if bidirectional:
        n //= 2
        bucket += (distance < 0) * n
        distance = np.abs(distance)
    else:
        distance = np.maximum(distance, 0)
    exact = n // 2
    with np.errstate(divide="ignore"):
        log_ratio = np.log(distance.astype(np.float32) / exact + np.finfo(np.float32).eps) / np.log(
            max_distance / exact
        )
    large = np.minimum(exact + (log_ratio * (n - exact)).astype(np.int32), n - 1)
    return bucket + np.where(distance < exact, distance, large)


class RelativePositionBiases(nn.Module):
    """T5-style relative position biases: (q_seqlen, k_seqlen, bidirectional=True) ->
    [1, num_attention_heads, q_seqlen, k_seqlen], from the param "rel_embedding"
    [num_attention_heads, num_buckets] (embedding_init, dtype)."""

    num_buckets: int
    max_distance: int
    num_attention_heads: int
    embedding_init: Any = nn.linear.default_embed_init
    embedding_axes: tuple = ("heads", "relpos_buckets")
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, q_seqlen, k_seqlen, bidirectional=True):
        buckets = relative_position_buckets(q_seqlen, k_seqlen, self.num_buckets, self.max_distance, bidirectional)
        table = self.param(
            "rel_embedding", self.embedding_init, (self.num_attention_heads, self.num_buckets), self.dtype
        )
        one_hot = jnp.asarray(buckets[None] == np.arange(self.num_buckets)[:, None, None], self.dtype)
        return jnp.einsum("hn,nqk->hqk", jnp.asarray(table, self.dtype), one_hot)[None]
