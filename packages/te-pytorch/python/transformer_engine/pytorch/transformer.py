"""te.TransformerLayer: self-attention (+ cross-attention for a decoder) and
an MLP, each with a residual connection, built from MultiheadAttention and
LayerNormMLP (the reference's submodule names: self_attention,
inter_attention, layernorm_mlp, layernorm with output_layernorm).

With x the input and r(y, b, res) = res + drop_path(dropout(y + b)):
  pre-LN (default):  h = r(attn(LN(x)), x);  [h = r(cross(LN(h), enc), h)];  out = r(mlp(LN(h)), h)
  apply_residual_connection_post_layernorm: the residual is LN(.) instead of the input
  output_layernorm:  attention without its own LN, out = LN(...) at the end (BERT)
  parallel_attention_mlp:  out = r(mlp(LN2(x)), r(attn(LN1(x)), x))  (Falcon)
"""

from __future__ import annotations

import torch

from .attention.multi_head_attention import MultiheadAttention
from .module import LayerNorm, LayerNormMLP, RMSNorm
from .module.base import DEFAULT_DEVICE, not_yet_supported, reject_tp_group, resolve_device

_OWNER = "te.TransformerLayer"


class DropPath(torch.nn.Module):
    """Stochastic depth: zeroes a whole slice along dim 0 with probability
    drop_prob during training, scaling the kept ones by 1 / (1 - drop_prob)."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = torch.empty((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype, device=x.device).bernoulli_(keep)
        return x / keep * mask


class TransformerLayer(torch.nn.Module):
    """One transformer block (the reference's constructor and forward; see the
    module docstring for the layouts). forward returns the output in the
    input's layout (attn_input_format "sbhd": [s, b, h]; "bshd": [b, s, h]).
    Tensor/sequence/context parallelism and userbuffer overlap
    (ub_tp_comm_overlap) are not yet supported (NotImplementedError).
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        num_gqa_groups: int | None = None,
        layernorm_epsilon: float = 1e-5,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        init_method=None,
        output_layer_init_method=None,
        layer_number: int | None = None,
        kv_channels: int | None = None,
        self_attn_mask_type: str = "causal",
        window_size=None,
        bottom_right_diagonal=None,
        softcap: float = 0.0,
        enc_dec_attn_mask_type: str = "no_mask",
        enc_dec_bottom_right_diagonal=None,
        enc_dec_window_size=None,
        tp_group=None,
        tp_size: int = 1,
        params_dtype=None,
        get_rng_state_tracker=None,
        fuse_wgrad_accumulation: bool = False,
        seq_length=None,
        micro_batch_size=None,
        sequence_parallel: bool = False,
        apply_residual_connection_post_layernorm: bool = False,
        output_layernorm: bool = False,
        parallel_attention_mlp: bool = False,
        layer_type: str = "encoder",
        drop_path_rate: float = 0.0,
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        rotary_pos_interleaved: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        ub_tp_comm_overlap: bool = False,
        ub_overlap_ag: bool = True,
        ub_overlap_rs: bool = True,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = True,
        ub_bulk_wgrad: bool = True,
        bias: bool = True,
        activation: str = "gelu",
        activation_params=None,
        normalization: str = "LayerNorm",
        device=DEFAULT_DEVICE,
        attn_input_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        softmax_type: str = "vanilla",
    ) -> None:
        super().__init__()
        # (The ub_* flags only act with ub_tp_comm_overlap=True, as in the reference.)
        not_yet_supported(
            _OWNER,
            tp_size=(tp_size, 1),
            sequence_parallel=(sequence_parallel, False),
            set_parallel_mode=(set_parallel_mode, False),
            ub_tp_comm_overlap=(ub_tp_comm_overlap, False),
        )
        reject_tp_group(_OWNER, tp_group)
        if device != "meta":  # (checked here, so that an error names this module, not a part)
            resolve_device(device, _OWNER)
        if layer_type not in ("encoder", "decoder"):
            raise ValueError(f"{_OWNER}: layer_type must be 'encoder' or 'decoder', got {layer_type!r}")
        if attn_input_format not in ("sbhd", "bshd"):
            raise ValueError(f"{_OWNER}: attn_input_format must be 'sbhd' or 'bshd', got {attn_input_format!r}")
        if parallel_attention_mlp and (layer_type != "encoder" or apply_residual_connection_post_layernorm):
            raise ValueError(
                f"{_OWNER}: parallel_attention_mlp=True needs layer_type='encoder' and "
                "apply_residual_connection_post_layernorm=False"
            )
        if normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"{_OWNER}: normalization must be 'LayerNorm' or 'RMSNorm', got {normalization!r}")
        self.self_attn_mask_type = self_attn_mask_type
        self.window_size = window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.enc_dec_attn_mask_type = enc_dec_attn_mask_type
        self.enc_dec_window_size = enc_dec_window_size
        self.enc_dec_bottom_right_diagonal = enc_dec_bottom_right_diagonal
        self.layer_type = layer_type
        self.output_layernorm = output_layernorm
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.parallel_attention_mlp = parallel_attention_mlp
        self.hidden_dropout = hidden_dropout
        self.attn_input_format = attn_input_format
        self.layer_number = layer_number
        self.name = name
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        attention = dict(
            hidden_size=hidden_size,
            num_attention_heads=num_attention_heads,
            kv_channels=kv_channels,
            attention_dropout=attention_dropout,
            layernorm_epsilon=layernorm_epsilon,
            init_method=init_method,
            output_layer_init_method=output_layer_init_method,
            layer_number=layer_number,
            num_gqa_groups=num_gqa_groups,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            get_rng_state_tracker=get_rng_state_tracker,
            params_dtype=params_dtype,
            return_bias=True,
            return_layernorm_output=apply_residual_connection_post_layernorm,
            fuse_qkv_params=fuse_qkv_params,
            zero_centered_gamma=zero_centered_gamma,
            qkv_weight_interleaved=qkv_weight_interleaved,
            rotary_pos_interleaved=rotary_pos_interleaved,
            bias=bias,
            normalization=normalization,
            device=device,
            qkv_format=attn_input_format,
            qk_norm_type=qk_norm_type,
            qk_norm_eps=qk_norm_eps,
            qk_norm_before_rope=qk_norm_before_rope,
            softmax_type=softmax_type,
        )
        self.self_attention = MultiheadAttention(
            **attention,
            attn_mask_type=self_attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            softcap=softcap,
            input_layernorm=not output_layernorm,
            attention_type="self",
        )
        if layer_type == "decoder":
            self.inter_attention = MultiheadAttention(
                **attention,
                attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size,
                bottom_right_diagonal=enc_dec_bottom_right_diagonal,
                input_layernorm=True,
                attention_type="cross",
            )
        self.layernorm_mlp = LayerNormMLP(
            hidden_size,
            ffn_hidden_size,
            eps=layernorm_epsilon,
            init_method=init_method,
            output_layer_init_method=output_layer_init_method,
            bias=bias,
            normalization=normalization,
            activation=activation,
            activation_params=activation_params,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            params_dtype=params_dtype,
            return_bias=True,
            return_layernorm_output=apply_residual_connection_post_layernorm,
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            zero_centered_gamma=zero_centered_gamma,
            device=device,
        )
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0.0 else None
        if output_layernorm:
            cls = LayerNorm if normalization == "LayerNorm" else RMSNorm
            self.layernorm = cls(
                hidden_size,
                eps=layernorm_epsilon,
                zero_centered_gamma=zero_centered_gamma,
                device=device,
                dtype=params_dtype,
            )

    def set_tensor_parallel_group(self, tp_group) -> None:
        reject_tp_group(_OWNER, tp_group)

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type="p2p") -> None:
        if cp_group is not None:
            raise NotImplementedError(
                f"{_OWNER}: context parallelism is not yet supported by transformer_engine.pytorch"
            )

    def _residual(self, out, bias, residual):
        """residual + drop_path(dropout(out + bias))."""
        if bias is not None and bias.numel():
            out = out + bias
        out = torch.nn.functional.dropout(out, p=self.hidden_dropout, training=self.training)
        if self.drop_path is not None:
            out = self.drop_path(out)
        return residual + out

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask=None,
        self_attn_mask_type=None,
        window_size=None,
        bottom_right_diagonal=None,
        encoder_output=None,
        enc_dec_attn_mask=None,
        enc_dec_attn_mask_type=None,
        enc_dec_window_size=None,
        enc_dec_bottom_right_diagonal=None,
        is_first_microbatch=None,
        checkpoint_core_attention: bool = False,
        inference_params=None,
        rotary_pos_emb=None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias=None,
        alibi_slopes=None,
        cu_seqlens_q=None,
        cu_seqlens_kv=None,
        cu_seqlens_q_padded=None,
        cu_seqlens_kv_padded=None,
        max_seqlen_q=None,
        max_seqlen_kv=None,
        fast_zero_fill: bool = True,
        pad_between_seqs=None,
        thd_attention_policies=None,
        thd_attention_policy_dispatch: str = "auto",
        softcap=None,
    ):
        x = hidden_states
        outs = self.self_attention(
            x,
            attention_mask=attention_mask,
            attn_mask_type=self.self_attn_mask_type if self_attn_mask_type is None else self_attn_mask_type,
            window_size=self.window_size if window_size is None else window_size,
            bottom_right_diagonal=self.bottom_right_diagonal
            if bottom_right_diagonal is None
            else bottom_right_diagonal,
            is_first_microbatch=is_first_microbatch,
            checkpoint_core_attention=checkpoint_core_attention,
            inference_params=inference_params,
            rotary_pos_emb=rotary_pos_emb,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            fast_zero_fill=fast_zero_fill,
            pad_between_seqs=pad_between_seqs,
            thd_attention_policies=thd_attention_policies,
            thd_attention_policy_dispatch=thd_attention_policy_dispatch,
            softcap=softcap,
        )
        post_ln = self.apply_residual_connection_post_layernorm and not self.output_layernorm
        attn_out, attn_bias = outs[0], outs[1]
        if not self.parallel_attention_mlp:
            x = self._residual(attn_out, attn_bias, outs[2] if post_ln else x)
        if self.layer_type == "decoder":
            cross = self.inter_attention(
                x,
                attention_mask=enc_dec_attn_mask,
                encoder_output=encoder_output,
                attn_mask_type=self.enc_dec_attn_mask_type
                if enc_dec_attn_mask_type is None
                else enc_dec_attn_mask_type,
                window_size=self.enc_dec_window_size if enc_dec_window_size is None else enc_dec_window_size,
                bottom_right_diagonal=(
                    self.enc_dec_bottom_right_diagonal
                    if enc_dec_bottom_right_diagonal is None
                    else enc_dec_bottom_right_diagonal
                ),
                is_first_microbatch=is_first_microbatch,
                checkpoint_core_attention=checkpoint_core_attention,
                fast_zero_fill=fast_zero_fill,
            )
            x = self._residual(cross[0], cross[1], cross[2] if self.apply_residual_connection_post_layernorm else x)
        mlp = self.layernorm_mlp(x, is_first_microbatch=is_first_microbatch)
        if self.apply_residual_connection_post_layernorm:
            out = self._residual(mlp[0], mlp[1], mlp[2])
        elif self.parallel_attention_mlp:
            out = self._residual(mlp[0], mlp[1], self._residual(attn_out, attn_bias, x))
        else:
            out = self._residual(mlp[0], mlp[1], x)
        if self.output_layernorm:
            out = self.layernorm(out)
        return out
