"""Flax TransformerLayer and TransformerLayerType (the reference's fields and names).

    encoder:  x = x + drop(MHA "attention"(LN(x)))                        [+ relpos_bias]
    decoder:  x = x + drop(MHA "self_attention"(LN(x)));
              x = x + drop(MHA "encoder_decoder_attention"(LN(x), encoded))  (padding mask)
    both:     z = x + drop(LayerNormMLP "mlp"(x))  [-> LayerNorm "output_layernorm"]

apply_residual_connection_post_layernorm: the residuals are the LayerNorm outputs.
output_layernorm: the attention takes the raw input (no input LayerNorm) and the layer
ends with a LayerNorm. enable_relative_embedding: a RelativePositionBiases "relpos_bias"
(32 buckets, max distance 128; bidirectional for the encoder) gives the self-attention's
bias (unless relative_embedding supplies the module). drop_path: stochastic depth per
example. Inputs [b, s, hidden] ([s, b, hidden] with transpose_batch_sequence).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import flax.linen as nn  # (ruff's isort files it apart: this package is named flax too)

import jax.numpy as jnp

from .attention import RelativePositionBiases
from .module import LayerNorm, LayerNormMLP
from .multi_head_attention import MultiHeadAttention


class TransformerLayerType(Enum):
    """ENCODER: self-attention and MLP; DECODER: self-attention, cross-attention over `encoded`, MLP."""

    ENCODER = "encoder"
    DECODER = "decoder"


class TransformerLayer(nn.Module):
    """One transformer block (see the module docstring). Not supported
    (NotImplementedError): low_rank_adaptation_scope other than 'none', score_mod."""

    hidden_size: int = 512
    mlp_hidden_size: int = 2048
    num_attention_heads: int = 8
    num_gqa_groups: int | None = None
    layernorm_type: str = "layernorm"
    layernorm_epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    hidden_dropout: float = 0.1
    hidden_dropout_dims: tuple = ()
    attention_dropout: float = 0.1
    intermediate_dropout: float = 0.0
    intermediate_dropout_dims: tuple = ()
    dropout_rng_name: str = "dropout"
    mha_kernel_init: Any = None
    mlp_kernel_init: Any = None
    mlp_activations: tuple = ("gelu",)
    mlp_activation_params: Any = None
    use_bias: bool = False
    bias_init: Any = nn.initializers.zeros
    apply_residual_connection_post_layernorm: bool = False
    output_layernorm: bool = False
    float32_attention_logits: bool = False
    layer_type: TransformerLayerType = TransformerLayerType.ENCODER
    self_attn_mask_type: str = "causal"
    self_attn_bias_type: str | None = None
    enable_relative_embedding: bool = True
    relative_embedding: nn.Module | None = None
    enable_rotary_pos_emb: bool = False
    rotary_pos_emb_windows: tuple = (1, 10000)
    rotary_pos_emb_group_method: str = "consecutive"
    low_rank_adaptation_scope: str = "none"
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    dtype: Any = jnp.float32
    drop_path: float = 0.0
    fuse_qkv_params: bool = True
    transpose_batch_sequence: bool = False
    enable_sequence_parallel: bool = False
    scale_attn_logits: bool = False
    scaled_query_init: bool = True
    window_size: tuple | None = None
    softmax_type: str = "vanilla"
    score_mod: Any = None
    score_mod_bprop: Any = None

    def _check(self, inputs, decode: bool) -> None:
        if not isinstance(self.layer_type, TransformerLayerType):
            raise ValueError(f"field 'layer_type' must be a TransformerLayerType, got {self.layer_type!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"field 'hidden_size' ({self.hidden_size}) must be a multiple of "
                             f"'num_attention_heads' ({self.num_attention_heads})")  # fmt: skip
        if decode and self.layer_type == TransformerLayerType.ENCODER:
            raise ValueError("decode=True is only for layer_type=TransformerLayerType.DECODER")
        if inputs.ndim != 3:
            raise ValueError(f"argument 'inputs' must be 3-D (batch, sequence, hidden), got {inputs.shape}")
        if self.score_mod is not None or self.score_mod_bprop is not None:
            raise NotImplementedError("TransformerLayer: 'score_mod' is not yet supported by te-jax")

    def _mha(self, name, mask_type, bias_type, input_layernorm, self_attn: bool):
        head_dim = self.hidden_size // self.num_attention_heads
        kernel_init = self.mha_kernel_init or nn.initializers.variance_scaling(
            1.0, "fan_in", "normal", dtype=self.dtype
        )
        return MultiHeadAttention(
            head_dim=head_dim, num_attention_heads=self.num_attention_heads, num_gqa_groups=self.num_gqa_groups,
            attention_dropout=self.attention_dropout, dropout_rng_name=self.dropout_rng_name,
            input_layernorm=input_layernorm, layernorm_type=self.layernorm_type,
            layernorm_epsilon=self.layernorm_epsilon, zero_centered_gamma=self.zero_centered_gamma,
            return_layernorm_output=self.apply_residual_connection_post_layernorm, kernel_init=kernel_init,
            use_bias=self.use_bias, bias_init=self.bias_init, attn_mask_type=mask_type, attn_bias_type=bias_type,
            enable_rotary_pos_emb=self.enable_rotary_pos_emb, rotary_pos_emb_windows=self.rotary_pos_emb_windows,
            rotary_pos_emb_group_method=self.rotary_pos_emb_group_method,
            low_rank_adaptation_scope=self.low_rank_adaptation_scope, dtype=self.dtype,
            fuse_qkv_params=self.fuse_qkv_params, transpose_batch_sequence=self.transpose_batch_sequence,
            enable_sequence_parallel=self.enable_sequence_parallel, scale_attn_logits=self.scale_attn_logits,
            scaled_query_init=self.scaled_query_init, float32_logits=self.float32_attention_logits,
            window_size=self.window_size, softmax_type=self.softmax_type, name=name,
        )  # fmt: skip

    def _dropout(self, x, deterministic: bool):
        return nn.Dropout(rate=self.hidden_dropout, broadcast_dims=tuple(self.hidden_dropout_dims),
                          rng_collection=self.dropout_rng_name)(x, deterministic=deterministic)  # fmt: skip

    def _drop_path(self, x, deterministic: bool):
        if self.drop_path <= 0.0:
            return x
        batch_dim = 1 if self.transpose_batch_sequence else 0
        dims = tuple(d for d in range(x.ndim) if d != batch_dim)  # one draw per example
        return nn.Dropout(rate=self.drop_path, broadcast_dims=dims, rng_collection=self.dropout_rng_name)(
            x, deterministic=deterministic
        )

    def _relative_bias(self, inputs, decode: bool, max_decode_length):
        if not self.enable_relative_embedding:
            return None
        rel = self.relative_embedding or RelativePositionBiases(
            num_buckets=32, max_distance=128, num_attention_heads=self.num_attention_heads, dtype=self.dtype,
            embedding_init=nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", dtype=self.dtype),
            name="relpos_bias",
        )  # fmt: skip
        s = inputs.shape[0 if self.transpose_batch_sequence else 1]
        if self.layer_type == TransformerLayerType.ENCODER:
            return rel(s, s, True)
        length = max_decode_length if (decode and max_decode_length) else s
        return rel(length, length, False)

    @nn.compact
    def __call__(self, inputs, encoded=None, attention_mask=None, encoder_decoder_mask=None,
                 deterministic=False, decode=False, max_decode_length=None, score_mod_tensors=None,
                 score_mod_bprop_tensors=None):  # fmt: skip
        self._check(inputs, decode)
        if score_mod_tensors is not None or score_mod_bprop_tensors is not None:
            raise NotImplementedError("TransformerLayer: score_mod tensors are not yet supported by te-jax")
        bias = self._relative_bias(inputs, decode, max_decode_length)
        encoder = self.layer_type == TransformerLayerType.ENCODER
        mha = self._mha("attention" if encoder else "self_attention", self.self_attn_mask_type,
                        self.self_attn_bias_type, not self.output_layernorm, True)  # fmt: skip
        x, ln_out = mha(inputs, inputs, attention_mask, bias, deterministic=deterministic, decode=decode)
        x = self._drop_path(self._dropout(x, deterministic), deterministic)
        x = x + (ln_out if self.apply_residual_connection_post_layernorm else inputs)
        if not encoder:
            if encoded is None:
                raise ValueError("argument 'encoded' is required with layer_type=TransformerLayerType.DECODER")
            cross = self._mha("encoder_decoder_attention", "padding", "no_bias", True, False)
            y, ln_out = cross(x, encoded, encoder_decoder_mask, deterministic=deterministic)
            y = self._dropout(y, deterministic)
            x = y + (ln_out if self.apply_residual_connection_post_layernorm else x)
        z, ln_out = LayerNormMLP(
            layernorm_type=self.layernorm_type, zero_centered_gamma=self.zero_centered_gamma,
            epsilon=self.layernorm_epsilon, return_layernorm_output=self.apply_residual_connection_post_layernorm,
            intermediate_dim=self.mlp_hidden_size, activations=self.mlp_activations,
            activation_params=self.mlp_activation_params, intermediate_dropout_rng_name=self.dropout_rng_name,
            intermediate_dropout_rate=self.intermediate_dropout,
            intermediate_hidden_dropout_dims=self.intermediate_dropout_dims, dtype=self.dtype,
            kernel_init=self.mlp_kernel_init or nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                                                                 dtype=self.dtype),
            use_bias=self.use_bias, bias_init=self.bias_init, name="mlp",
        )(x, deterministic=deterministic)  # fmt: skip
        z = self._drop_path(self._dropout(z, deterministic), deterministic)
        z = z + (ln_out if self.apply_residual_connection_post_layernorm else x)
        if self.output_layernorm:
            z = LayerNorm(layernorm_type=self.layernorm_type, zero_centered_gamma=self.zero_centered_gamma,
                          epsilon=self.layernorm_epsilon, dtype=self.dtype, name="output_layernorm")(z)  # fmt: skip
        return z.astype(inputs.dtype)
