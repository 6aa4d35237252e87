"""te.MultiheadAttention: QKV projection (optionally normalized first),
optional q/k normalization and rotary embedding, DotProductAttention, and
the output projection `proj`.

Submodules and parameter names are the reference's, so checkpoints map one
to one: self-attention has `layernorm_qkv` (LayerNormLinear, with
input_layernorm) or `qkv` (Linear); cross-attention has `layernorm_query`
or `query_layer` and `key_value`; then `core_attention` and `proj`, and
`q_norm` / `k_norm` with qk_norm_type. With fuse_qkv_params=False the QKV
weight is split into query_weight, key_weight, value_weight (key_weight,
value_weight for key_value), and qkv_weight_interleaved is then False.

Fused QKV layout (output features of the QKV GEMM), with g = num_gqa_groups
and n = heads per group: qkv_weight_interleaved=True stores, per group,
n query heads, then its key head, then its value head; False stores all
query heads, then all key heads, then all value heads ([Q; K; V]). For
key_value: interleaved = per group [k; v], else [K; V].
"""

from __future__ import annotations

import collections

import torch

from ..module import LayerNorm, LayerNormLinear, Linear, RMSNorm
from ..module._args import check_module_args
from ..module.base import DEFAULT_DEVICE, not_yet_supported, reject_tp_group, resolve_device
from .dot_product_attention import DotProductAttention
from .rope import apply_rotary_pos_emb

_OWNER = "te.MultiheadAttention"
QK_NORM_TYPES = (None, "L2Normalization", "RMSNorm", "LayerNorm")


class L2Normalization(torch.nn.Module):
    """y = x / sqrt(sum(x^2) + eps) over the last dimension (no parameters)."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.square().sum(-1, keepdim=True) + self.eps)).to(x.dtype)


def _qk_norms(qk_norm_type, eps, head_dim, device, dtype):
    if qk_norm_type not in QK_NORM_TYPES:
        raise ValueError(f"{_OWNER}: qk_norm_type must be one of {QK_NORM_TYPES}, got {qk_norm_type!r}")
    if qk_norm_type is None:
        return None, None
    if qk_norm_type == "L2Normalization":
        norm = L2Normalization(eps)
        return norm, norm  # parameter-free: one instance serves both
    cls = RMSNorm if qk_norm_type == "RMSNorm" else LayerNorm
    return cls(head_dim, eps=eps, device=device, dtype=dtype), cls(head_dim, eps=eps, device=device, dtype=dtype)


class MultiheadAttention(torch.nn.Module):
    """Multi-head attention (the reference's constructor and forward).

    forward returns the attention output, then proj's bias when
    return_bias, then the normalized input when input_layernorm and
    return_layernorm_output. Tensor/sequence parallelism and the ub_*
    communication overlaps are not yet supported (NotImplementedError).
    """

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        kv_channels: int | None = None,
        attention_dropout: float = 0.1,
        layernorm_epsilon: float = 1e-5,
        init_method=None,
        output_layer_init_method=None,
        layer_number: int | None = None,
        attn_mask_type: str = "causal",
        window_size=None,
        bottom_right_diagonal=None,
        softcap: float = 0.0,
        tp_group=None,
        tp_size: int = 1,
        num_gqa_groups: int | None = None,
        fuse_wgrad_accumulation: bool = False,
        get_rng_state_tracker=None,
        sequence_parallel: bool = False,
        params_dtype=None,
        return_bias: bool = False,
        return_layernorm_output: bool = False,
        input_layernorm: bool = False,
        attention_type: str = "self",
        set_parallel_mode: bool = False,
        fuse_qkv_params: bool = False,
        zero_centered_gamma: bool = False,
        qkv_weight_interleaved: bool = True,
        rotary_pos_interleaved: bool = False,
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        bias: bool = True,
        normalization: str = "LayerNorm",
        device=DEFAULT_DEVICE,
        qkv_format: str = "sbhd",
        name: str | None = None,
        qk_norm_type: str | None = None,
        qk_norm_eps: float = 1e-6,
        qk_norm_before_rope: bool = False,
        seq_length=None,
        micro_batch_size=None,
        softmax_type: str = "vanilla",
    ) -> None:
        super().__init__()
        not_yet_supported(
            _OWNER,
            tp_size=(tp_size, 1),
            sequence_parallel=(sequence_parallel, False),
            set_parallel_mode=(set_parallel_mode, False),
            ub_overlap_ag=(ub_overlap_ag, False),
            ub_overlap_rs=(ub_overlap_rs, False),
            ub_overlap_rs_dgrad=(ub_overlap_rs_dgrad, False),
            ub_bulk_dgrad=(ub_bulk_dgrad, False),
            ub_bulk_wgrad=(ub_bulk_wgrad, False),
        )
        reject_tp_group(_OWNER, tp_group)
        sizes = {"hidden_size": hidden_size, "num_attention_heads": num_attention_heads}
        optional = {"kv_channels": kv_channels, "num_gqa_groups": num_gqa_groups}
        sizes.update({k: v for k, v in optional.items() if v is not None})
        params_dtype = check_module_args(
            _OWNER,
            sizes=sizes,
            flags={"bias": bias, "return_bias": return_bias, "input_layernorm": input_layernorm},
            eps=layernorm_epsilon,
            params_dtype=params_dtype,
        )
        # (The device is checked once here, so that an error names this module, not a part.)
        target = torch.device("meta") if device == "meta" else resolve_device(device, _OWNER)
        if attention_type not in ("self", "cross"):
            raise ValueError(f"{_OWNER}: attention_type must be 'self' or 'cross', got {attention_type!r}")
        if layer_number is not None and layer_number <= 0:
            raise ValueError(f"{_OWNER}: layer_number must be a positive integer, got {layer_number}")
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.bottom_right_diagonal = bottom_right_diagonal
        self.layer_number = 1 if layer_number is None else layer_number
        self.input_layernorm = input_layernorm
        self.attention_type = attention_type
        self.return_layernorm_output = return_layernorm_output
        self.return_bias = return_bias
        self.params_dtype = params_dtype
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if num_attention_heads % self.num_gqa_groups:
            raise ValueError(
                f"{_OWNER}: num_attention_heads={num_attention_heads} must be divisible by "
                f"num_gqa_groups={self.num_gqa_groups}"
            )
        kv_channels = kv_channels if kv_channels else hidden_size // num_attention_heads
        self.hidden_size_per_attention_head = kv_channels
        self.hidden_size_q = kv_channels * num_attention_heads
        self.hidden_size_kv = kv_channels * self.num_gqa_groups
        self.qkv_weight_interleaved = qkv_weight_interleaved and fuse_qkv_params
        self.rotary_pos_interleaved = rotary_pos_interleaved
        self.qk_norm_before_rope = qk_norm_before_rope
        self.softmax_type = softmax_type
        self.name = name
        self.cp_size, self.cp_rank = 1, 0
        gemm = dict(fuse_wgrad_accumulation=fuse_wgrad_accumulation, params_dtype=self.params_dtype, device=device)
        self.q_norm, self.k_norm = _qk_norms(qk_norm_type, qk_norm_eps, kv_channels, device, self.params_dtype)
        norm = dict(
            eps=layernorm_epsilon,
            normalization=normalization,
            zero_centered_gamma=zero_centered_gamma,
            return_layernorm_output=return_layernorm_output,
        )
        if attention_type == "self":
            split = None
            if not fuse_qkv_params:
                split = collections.OrderedDict(
                    [("query", self.hidden_size_q), ("key", self.hidden_size_kv), ("value", self.hidden_size_kv)]
                )
            width = self.hidden_size_q + 2 * self.hidden_size_kv
            if input_layernorm:
                self.layernorm_qkv = LayerNormLinear(
                    hidden_size, width, init_method=init_method, bias=bias, parameters_split=split, **norm, **gemm
                )
            else:
                self.qkv = Linear(
                    hidden_size, width, init_method=init_method, bias=bias, parameters_split=split, **gemm
                )
        else:
            if input_layernorm:
                self.layernorm_query = LayerNormLinear(
                    hidden_size,
                    self.hidden_size_q,
                    init_method=init_method,
                    bias=bias,
                    parameters_split=None if fuse_qkv_params else ("query",),
                    **norm,
                    **gemm,
                )
            else:
                self.query_layer = Linear(hidden_size, self.hidden_size_q, init_method=init_method, bias=bias, **gemm)
            self.key_value = Linear(
                hidden_size,
                2 * self.hidden_size_kv,
                init_method=init_method,
                bias=bias,
                parameters_split=None if fuse_qkv_params else ("key", "value"),
                **gemm,
            )
        self.core_attention = DotProductAttention(
            num_attention_heads,
            kv_channels,
            num_gqa_groups=self.num_gqa_groups,
            attention_dropout=attention_dropout,
            qkv_format=qkv_format,
            attn_mask_type=attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            softcap=softcap,
            layer_number=self.layer_number,
            attention_type=attention_type,
            softmax_type=softmax_type,
            get_rng_state_tracker=get_rng_state_tracker,
        )
        if self.core_attention.softmax_offset is not None:  # (learnable softmax: on this module's device)
            self.core_attention.to(target)
        self.proj = Linear(
            self.hidden_size_q,
            hidden_size,
            init_method=output_layer_init_method,
            bias=bias,
            return_bias=return_bias,
            **gemm,
        )

    def set_tensor_parallel_group(self, tp_group) -> None:
        reject_tp_group(_OWNER, tp_group)

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type="p2p") -> None:
        if cp_group is not None:
            raise NotImplementedError(
                f"{_OWNER}: context parallelism is not yet supported by transformer_engine.pytorch"
            )

    def _heads(self, x, heads):
        """[..., heads * d] -> [..., heads, d] (sbhd/bshd keep two leading dims, thd one)."""
        lead = x.shape[:1] if self.qkv_format == "thd" else x.shape[:2]
        return x.reshape(*lead, heads, self.hidden_size_per_attention_head)

    def _self_qkv(self, hidden_states, is_first_microbatch):
        layer = self.layernorm_qkv if self.input_layernorm else self.qkv
        out = layer(hidden_states, is_first_microbatch=is_first_microbatch)
        ln_out = None
        if self.input_layernorm and self.return_layernorm_output:
            out, ln_out = out
        g, d = self.num_gqa_groups, self.hidden_size_per_attention_head
        n = self.num_attention_heads // g
        if self.qkv_weight_interleaved:
            mixed = out.view(*out.shape[:-1], g, n + 2, d)
            q, k, v = mixed.split((n, 1, 1), dim=-2)
        else:
            mixed = out.view(*out.shape[:-1], n + 2, g, d)
            q, k, v = mixed.split((n, 1, 1), dim=-3)
        return self._heads(q, self.num_attention_heads), self._heads(k, g), self._heads(v, g), ln_out

    def _cross_qkv(self, hidden_states, encoder_output, is_first_microbatch):
        if encoder_output is None:
            raise ValueError(f"{_OWNER}: attention_type='cross' needs encoder_output")
        kv = self.key_value(encoder_output, is_first_microbatch=is_first_microbatch)
        g, d = self.num_gqa_groups, self.hidden_size_per_attention_head
        if self.qkv_weight_interleaved:
            k, v = kv.view(*kv.shape[:-1], g, 2 * d).split(d, dim=-1)
        else:
            k, v = kv.view(*kv.shape[:-1], 2 * g, d).split(g, dim=-2)
        ln_out = None
        if self.input_layernorm:
            q = self.layernorm_query(hidden_states, is_first_microbatch=is_first_microbatch)
            if self.return_layernorm_output:
                q, ln_out = q
        else:
            q = self.query_layer(hidden_states, is_first_microbatch=is_first_microbatch)
        return self._heads(q, self.num_attention_heads), self._heads(k, g), self._heads(v, g), ln_out

    def _rope(self, q, k, rotary_pos_emb, inference_params, cu_q, cu_kv):
        q_emb, k_emb = rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb,) * 2
        start = inference_params.get_seqlens_pre_step() if inference_params is not None else None
        common = dict(
            tensor_format=self.qkv_format,
            fused=True,
            start_positions=start,
            interleaved=self.rotary_pos_interleaved,
            cp_size=self.cp_size,
            cp_rank=self.cp_rank,
        )
        q = apply_rotary_pos_emb(q, q_emb, cu_seqlens=cu_q, **common)
        k = apply_rotary_pos_emb(k, k_emb, cu_seqlens=cu_kv, **common)
        return q, k

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask=None,
        encoder_output=None,
        attn_mask_type=None,
        window_size=None,
        bottom_right_diagonal=None,
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
        attn_mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        window_size = self.window_size if window_size is None else window_size
        if inference_params is not None:
            inference_params.allocate_memory(self.layer_number)
        if self.attention_type == "self":
            q, k, v, ln_out = self._self_qkv(hidden_states, is_first_microbatch)
        else:
            q, k, v, ln_out = self._cross_qkv(hidden_states, encoder_output, is_first_microbatch)
        if self.q_norm is not None and self.qk_norm_before_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary_pos_emb is not None:
            cu_q = cu_seqlens_q_padded if pad_between_seqs else cu_seqlens_q
            cu_kv = cu_seqlens_kv_padded if pad_between_seqs else cu_seqlens_kv
            q, k = self._rope(q, k, rotary_pos_emb, inference_params, cu_q, cu_kv)
        if self.q_norm is not None and not self.qk_norm_before_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        context = self.core_attention(
            q,
            k,
            v,
            attention_mask=attention_mask,
            qkv_format=self.qkv_format,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            attn_mask_type=attn_mask_type,
            window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal,
            softcap=softcap,
            checkpoint_core_attention=checkpoint_core_attention,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            fast_zero_fill=fast_zero_fill,
            inference_params=inference_params,
            pad_between_seqs=pad_between_seqs,
            thd_attention_policies=thd_attention_policies,
            thd_attention_policy_dispatch=thd_attention_policy_dispatch,
        )
        out = self.proj(context, is_first_microbatch=is_first_microbatch)
        outputs = out if isinstance(out, tuple) else (out,)
        if self.input_layernorm and self.return_layernorm_output:
            outputs += (ln_out,)
        return outputs if len(outputs) > 1 else outputs[0]
