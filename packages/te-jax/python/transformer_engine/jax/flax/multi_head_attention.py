"""Flax MultiHeadAttention (the reference's fields, parameter names and cache variables).

    [LayerNorm ->] q, k, v projections [-> rotary embedding] -> DotProductAttention -> out projection

Params (as the reference, so checkpoints map):
  fuse_qkv_params and self-attention without GQA: "qkv" (LayerNormDenseGeneral, kernel
      [hidden, 3, h * d]: q, k, v stacked on axis -2; scale, ln_bias with input_layernorm);
  fuse_qkv_params otherwise: "query" (LayerNormDenseGeneral [hidden, h * d]) and "kv"
      (DenseGeneral [hidden, 2, hk * d]);
  not fused: "query", "key", "value" (DenseGeneral [hidden, hk * d]);
  then "out" (DenseGeneral [h * d, hidden]); DotProductAttention_0 holds softmax_offset
  (learnable softmax).
Decode (decode=True): the "cache" collection holds cached_key, cached_value [b, L, hk, d]
(the full length L is the first call's, made at init) and cache_index; each later call
takes one query token, writes its key/value at cache_index and attends to keys
0..cache_index (and, with rotary embeddings, rotates at position cache_index).
Returns (out, ln_out): ln_out is the LayerNorm output with return_layernorm_output, else None.
"""

from __future__ import annotations

import warnings
from typing import Any

import flax.linen as nn  # (ruff's isort files it apart: this package is named flax too)

import jax
import jax.numpy as jnp

from .. import sharding as sh
from .attention import DotProductAttention
from .module import DenseGeneral, LayerNormDenseGeneral

# The projections' logical axes (the reference's): q / k / v column parallel over tp (heads),
# the out projection row parallel; hidden dims of the kernels over fsdp. They partition only
# under a mesh with a MeshResource (docs/te_jax.md).
_QKV_AXES = (sh.W_FSDP_AXES, sh.W_JOINED_AXES, sh.W_TP_AXES)  # [hidden, 3 or 2, heads * d]
_PROJ_AXES = (sh.W_FSDP_AXES, sh.W_TP_AXES)  # [hidden, heads * d]
_OUT_AXES = (sh.W_TP_AXES, sh.W_FSDP_AXES)  # [heads * d, hidden]


def rotary_pos_emb(x, windows, transpose_batch_sequence: bool, group_method: str = "consecutive", positions=None):
    """x [b, s, ..., d] ([s, b, ...] transposed) rotated by position: angle = pos / t_i with
    t_i = min * (max / min)^(2 i / d), i < d / 2; 'consecutive' rotates the pairs (2i, 2i+1),
    'alternate' the pairs (i, i + d/2). positions: [s] (default 0..s-1)."""
    method = group_method.lower().replace("-", "").replace("_", "").strip()
    if method not in ("consecutive", "alternate"):
        raise ValueError(f"rotary_pos_emb_group_method must be 'consecutive' or 'alternate', got {group_method!r}")
    d = x.shape[-1]
    lo, hi = windows
    timescale = lo * (hi / lo) ** (2.0 * jnp.arange(d // 2) / d)
    seq_axis = 0 if transpose_batch_sequence else 1
    pos = jnp.arange(x.shape[seq_axis]) if positions is None else positions
    shape = [1] * x.ndim
    shape[seq_axis] = x.shape[seq_axis]
    angle = pos.astype(jnp.float32).reshape(*shape[:-1], 1) / timescale  # [.., d / 2]
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    xf = x.astype(jnp.float32)
    if method == "alternate":
        a, b = xf[..., : d // 2], xf[..., d // 2 :]
        out = jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    else:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = jnp.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(x.shape)
    return out.astype(x.dtype)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with the reference's fields (see the module docstring).
    Not supported (NotImplementedError): low_rank_adaptation_scope other than 'none',
    score_mod, output_layernorm (deprecated in the reference). enable_sequence_parallel
    puts the inputs' sequence on tpsp. Under a mesh the q / k / v projections are column
    parallel over the heads, the attention splits over the batch and heads and the out
    projection is row parallel (docs/te_jax.md)."""

    head_dim: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    attention_dropout: float = 0.0
    dropout_rng_name: str = "dropout"
    input_layernorm: bool = True
    layernorm_type: str = "layernorm"
    layernorm_epsilon: float = 1e-6
    return_layernorm_output: bool = False
    zero_centered_gamma: bool = False
    kernel_init: Any = None
    use_bias: bool = False
    bias_init: Any = nn.initializers.zeros
    attn_mask_type: str = "causal"
    attn_bias_type: str | None = None
    enable_rotary_pos_emb: bool = False
    rotary_pos_emb_windows: tuple = (1, 10000)
    rotary_pos_emb_group_method: str = "consecutive"
    low_rank_adaptation_scope: str = "none"
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    dtype: Any = jnp.float32
    fuse_qkv_params: bool = True
    transpose_batch_sequence: bool | None = None
    enable_sequence_parallel: bool = False
    scale_attn_logits: bool = False
    scaled_query_init: bool = True
    float32_logits: bool = False
    window_size: tuple | None = None
    softmax_type: str = "vanilla"
    score_mod: Any = None
    score_mod_bprop: Any = None
    num_heads: int | None = None
    dropout_rate: float | None = None
    output_layernorm: bool | None = None
    apply_residual_connection_post_layernorm: bool | None = None
    fuse_qkv: bool | None = None

    # The deprecated aliases of the reference, resolved once.
    def _heads(self) -> tuple[int, int]:
        h = self.num_attention_heads if self.num_heads is None else self.num_heads
        return h, (h if self.num_gqa_groups is None else self.num_gqa_groups)

    def _check(self) -> None:
        for name, old in (
            ("num_heads", self.num_heads),
            ("dropout_rate", self.dropout_rate),
            ("fuse_qkv", self.fuse_qkv),
        ):
            if old is not None:
                warnings.warn(f"MultiHeadAttention.{name} is deprecated (the reference's rename)", DeprecationWarning,
                              stacklevel=3)  # fmt: skip
        if self.output_layernorm is not None:
            raise NotImplementedError("MultiHeadAttention: 'output_layernorm' is deprecated and not supported")
        if self.low_rank_adaptation_scope != "none":
            raise NotImplementedError("MultiHeadAttention: low_rank_adaptation_scope is not yet supported (no LoRA)")
        if self.score_mod is not None or self.score_mod_bprop is not None:
            raise NotImplementedError("MultiHeadAttention: 'score_mod' is not yet supported by te-jax")

    def _kernel_init(self):
        if self.kernel_init is not None:
            return self.kernel_init
        return nn.initializers.variance_scaling(1.0, "fan_in", "normal", dtype=self.dtype)

    def _query_init(self, key, shape, dtype):
        scale = jnp.sqrt(self.head_dim).astype(dtype) if self.scaled_query_init else 1.0
        return self._kernel_init()(key, shape, dtype) / scale

    def _stacked_init(self, n: int):
        """Kernel init of [hidden, n, features]: q (scaled, for n == 3), k, v drawn separately."""

        def init(key, shape, dtype):
            keys = jax.random.split(key, n)
            inits = ([self._query_init] if n == 3 else []) + [self._kernel_init()] * (2 if n == 3 else n)
            return jnp.stack([f(k, (shape[0], shape[-1]), dtype) for f, k in zip(inits, keys)], axis=-2)

        return init

    def _activation_axes(self, hidden_axis):
        """Logical axes of a [b, s, hidden] activation ([s, b, ...] transposed); the sequence
        over tpsp with enable_sequence_parallel."""
        seq = sh.SEQLEN_TP_AXES if self.enable_sequence_parallel else sh.SEQLEN_AXES
        lead = (seq, sh.BATCH_AXES) if self.transpose_batch_sequence else (sh.BATCH_AXES, seq)
        return (*lead, hidden_axis)

    def _ln_dense(self, features, kernel_init, name, return_ln):
        return LayerNormDenseGeneral(
            features=features, enable_layernorm=self.input_layernorm, layernorm_type=self.layernorm_type,
            epsilon=self.layernorm_epsilon, zero_centered_gamma=self.zero_centered_gamma, kernel_init=kernel_init,
            use_bias=self.use_bias, bias_init=self.bias_init, return_layernorm_output=return_ln, dtype=self.dtype,
            kernel_axes=_QKV_AXES if isinstance(features, tuple) else _PROJ_AXES,
            layernorm_input_axes=self._activation_axes(sh.HIDDEN_AXES), name=name,
        )  # fmt: skip

    def _dense(self, features, kernel_init, name, out=False):
        kernel_axes = _OUT_AXES if out else _QKV_AXES if isinstance(features, tuple) else _PROJ_AXES
        input_axes = self._activation_axes(sh.HIDDEN_TP_AXES if out else sh.HIDDEN_AXES)
        return DenseGeneral(features=features, kernel_init=kernel_init, use_bias=self.use_bias,
                            bias_init=self.bias_init, dtype=self.dtype, kernel_axes=kernel_axes,
                            input_axes=input_axes, name=name)  # fmt: skip

    def _project(self, inputs_q, inputs_kv, self_attn: bool):
        """(q, k, v) as [.., s, heads, d] each and ln_out."""
        h, hk = self._heads()
        d = self.head_dim
        lead = inputs_q.shape[:2]
        if self.fuse_qkv_params and self_attn and h == hk:
            qkv, ln_out = self._ln_dense((3, h * d), self._stacked_init(3), "qkv", self.return_layernorm_output)(
                inputs_q
            )
            qkv = qkv.reshape(*lead, 3, h, d)
            return qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :], ln_out
        return_ln = self.return_layernorm_output or self_attn
        query, ln_out = self._ln_dense(h * d, self._query_init, "query", return_ln)(inputs_q)
        if self_attn:
            inputs_kv = ln_out
        kv_lead = inputs_kv.shape[:2]
        if self.fuse_qkv_params:
            kv = self._dense((2, hk * d), self._stacked_init(2), "kv")(inputs_kv).reshape(*kv_lead, 2, hk, d)
            key, value = kv[..., 0, :, :], kv[..., 1, :, :]
        else:
            key = self._dense(hk * d, self._kernel_init(), "key")(inputs_kv).reshape(*kv_lead, hk, d)
            value = self._dense(hk * d, self._kernel_init(), "value")(inputs_kv).reshape(*kv_lead, hk, d)
        return query.reshape(*lead, h, d), key, value, (ln_out if self.return_layernorm_output else None)

    @nn.compact
    def __call__(self, inputs_q, inputs_kv, mask=None, bias=None, *, decode=False, deterministic=False,
                 score_mod_tensors=None, score_mod_bprop_tensors=None):  # fmt: skip
        self._check()
        if score_mod_tensors is not None or score_mod_bprop_tensors is not None:
            raise NotImplementedError("MultiHeadAttention: score_mod tensors are not yet supported by te-jax")
        if jnp.dtype(inputs_q.dtype) != jnp.dtype(inputs_kv.dtype):
            raise TypeError(f"arguments 'inputs_q' and 'inputs_kv' must have one type, got {inputs_q.dtype} and "
                            f"{inputs_kv.dtype}")  # fmt: skip
        transposed = bool(self.transpose_batch_sequence)
        dtype = inputs_q.dtype
        q, k, v, ln_out = self._project(inputs_q, inputs_kv, inputs_q is inputs_kv)
        q, k, v = (x.astype(dtype) for x in (q, k, v))
        mask_type = self.attn_mask_type
        positions = None
        if decode:
            k, v, mask, bias, positions, mask_type = self._decode_step(q, k, v, mask, bias, mask_type, transposed)
        if self.enable_rotary_pos_emb:
            rotate = lambda x, p: rotary_pos_emb(  # noqa: E731
                x, self.rotary_pos_emb_windows, transposed, self.rotary_pos_emb_group_method, p
            )
            q = rotate(q, positions)
            if positions is None:  # (a decode step rotated its key before caching it)
                k = rotate(k, None)
        h, hk = self._heads()
        x = DotProductAttention(
            head_dim=self.head_dim, num_attention_heads=h, num_gqa_groups=hk, attn_mask_type=mask_type,
            attn_bias_type=self.attn_bias_type, attention_dropout=self._dropout(),
            dropout_rng_name=self.dropout_rng_name, float32_logits=self.float32_logits,
            scale_factor=(self.head_dim**-0.5 if self.scale_attn_logits else 1.0),
            transpose_batch_sequence=transposed, window_size=self.window_size, softmax_type=self.softmax_type,
        )(q, k, v, mask, bias, deterministic=deterministic)  # fmt: skip
        x = x.reshape(*x.shape[:2], x.shape[2] * x.shape[3])
        out = self._dense(inputs_q.shape[-1], self._kernel_init(), "out", out=True)(x)
        return out.astype(dtype), ln_out

    def _dropout(self) -> float:
        return self.attention_dropout if self.dropout_rate is None else self.dropout_rate

    def _decode_step(self, q, k, v, mask, bias, mask_type, transposed):
        """The KV cache: at init, zeros of the full length; afterwards one token per call."""
        initialized = self.has_variable("cache", "cached_key")
        cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not initialized:
            return k, v, mask, bias, None, mask_type
        seq_axis = 0 if transposed else 1
        length = cached_k.value.shape[seq_axis]
        if q.shape[seq_axis] != 1:
            raise ValueError(f"decode takes one query token per call after init, got {q.shape[seq_axis]}")
        i = index.value
        if self.enable_rotary_pos_emb:  # keys are cached rotated, at their own position
            k = rotary_pos_emb(k, self.rotary_pos_emb_windows, transposed, self.rotary_pos_emb_group_method, i[None])
        start = (i, 0, 0, 0) if transposed else (0, i, 0, 0)
        cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, start)
        cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, start)
        index.value = i + 1
        batch = q.shape[1 - seq_axis]
        future = jnp.broadcast_to(jnp.arange(length) > i, (batch, 1, 1, length))
        if mask is not None and "padding" in mask_type:
            future = future | jax.lax.dynamic_slice_in_dim(mask, i, 1, axis=-2).astype(bool)
        if bias is not None:
            bias = jax.lax.dynamic_slice_in_dim(bias, i, 1, axis=-2)
        # the keys 0..i as a padding mask (the query is the newest token: no causal rule left)
        return cached_k.value, cached_v.value, future, bias, i[None], "padding"
