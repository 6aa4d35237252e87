"""te.DotProductAttention: softmax(scale * Q K^T + bias + mask) V.

The reference's constructor and forward signatures. The call's settings are
resolved once (AttnConfig) and handed to the backend select_backend picks:
te-core's fused attention op when it supports the combination, else the
unfused torch backend (backends.py). FP8 attention (a DelayedScaling or
Float8CurrentScaling recipe with fp8_dpa / fp8_mha) runs the FP8 numerics on
the unfused backend (fp8.py); without it, under te.autocast the attention runs
in the inputs' precision while the surrounding Linear layers run in FP8.

Not yet supported (NotImplementedError naming the argument): tensor
parallelism (a tp_group of more than one rank, tp_size > 1),
sequence_parallel=True, context parallelism (cp_group), score_mod*,
thd_attention_policies, fp8_output, bf16_backward, num_splits != 1.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.checkpoint import checkpoint

from ...module._args import check_module_args
from ...module.base import TransformerEngineBaseModule, not_yet_supported, reject_tp_group
from . import flash, fp8, fused, utils
from .backends import select_backend
from .unfused import AttnConfig, UnfusedDotProductAttention

_OWNER = "te.DotProductAttention"


class DotProductAttention(TransformerEngineBaseModule):
    """Scaled dot-product attention over q/k/v heads (see the module docstring).

    kv_channels: head size, or (head size of q/k, head size of v).
    num_gqa_groups: number of key/value heads (GQA; 1 = MQA). softmax_type:
    "vanilla", "off-by-one" (a zero logit in the denominator) or "learnable"
    (a per-head parameter softmax_offset [h], initialized to 0).
    forward returns [s, b, h * dv] / [b, s, h * dv] / [t, h * dv] in the
    queries' format (and the max logit [h] with return_max_logit).
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels,
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size=None,
        bottom_right_diagonal=None,
        softcap: float = 0.0,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        tp_group=None,
        layer_number: int | None = None,
        attention_type: str = "self",
        cp_group=None,
        cp_global_ranks=None,
        cp_stream=None,
        cp_comm_type: str = "p2p",
        softmax_scale: float | None = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__(num_gemms=fp8.NUM_GEMMS)  # (FP8 attention: the reference's 9 + 6 slots)
        not_yet_supported(_OWNER, sequence_parallel=(sequence_parallel, False), tp_size=(tp_size, 1))
        reject_tp_group(_OWNER, tp_group)
        sizes = {"num_attention_heads": num_attention_heads}
        if num_gqa_groups is not None:
            sizes["num_gqa_groups"] = num_gqa_groups
        # kv_channels: one head size, or (k, v) head sizes.
        kv = kv_channels if isinstance(kv_channels, (tuple, list)) else (kv_channels,)
        sizes.update({f"kv_channels[{i}]" if len(kv) > 1 else "kv_channels": d for i, d in enumerate(kv)})
        check_module_args(_OWNER, sizes=sizes)
        if cp_group is not None:
            raise NotImplementedError(
                f"{_OWNER}: context parallelism (cp_group) is not yet supported by transformer_engine.pytorch"
            )
        if qkv_format not in utils.QKV_FORMATS:
            raise ValueError(f"{_OWNER}: qkv_format must be one of {utils.QKV_FORMATS}, got {qkv_format!r}")
        if attention_type not in ("self", "cross"):
            raise ValueError(f"{_OWNER}: attention_type must be 'self' or 'cross', got {attention_type!r}")
        if softmax_type not in utils.SOFTMAX_TYPES:
            raise ValueError(f"{_OWNER}: softmax_type must be one of {utils.SOFTMAX_TYPES}, got {softmax_type!r}")
        self.qkv_format = qkv_format
        self.attn_mask_type = utils.normalize_mask_type(attn_mask_type)
        self.window_size = utils.check_set_window_size(self.attn_mask_type, window_size)
        self.bottom_right_diagonal = bottom_right_diagonal
        self.softcap = float(softcap)
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_attention_heads if num_gqa_groups is None else num_gqa_groups
        if num_attention_heads % self.num_gqa_groups:
            raise ValueError(
                f"{_OWNER}: num_attention_heads={num_attention_heads} must be divisible by "
                f"num_gqa_groups={self.num_gqa_groups}"
            )
        self.hidden_size_per_attention_head_k = kv_channels if isinstance(kv_channels, int) else kv_channels[0]
        self.hidden_size_per_attention_head_v = kv_channels if isinstance(kv_channels, int) else kv_channels[1]
        if softmax_scale is None:
            softmax_scale = self.hidden_size_per_attention_head_k**-0.5
        self.softmax_scale = float(softmax_scale)
        self.attention_dropout = float(attention_dropout)
        self.attention_type = attention_type
        self.layer_number = 1 if layer_number is None else layer_number
        self.get_rng_state_tracker = get_rng_state_tracker
        self.tp_size, self.tp_group = tp_size, tp_group
        self.cp_group, self.cp_global_ranks, self.cp_stream, self.cp_comm_type = (
            cp_group,
            cp_global_ranks,
            cp_stream,
            cp_comm_type,
        )
        self.softmax_type = softmax_type
        self.return_max_logit = return_max_logit
        self.name = name
        if softmax_type == "learnable":
            device = "cuda" if torch.cuda.is_available() else "cpu"
            self.softmax_offset = torch.nn.Parameter(torch.zeros(num_attention_heads, device=device))
        else:
            self.softmax_offset = None
        self.unfused_attention = UnfusedDotProductAttention(
            self.softmax_scale,
            attention_type=attention_type,
            attention_dropout=self.attention_dropout,
            layer_number=layer_number,
            softmax_type=softmax_type,
            return_max_logit=return_max_logit,
        )
        self.last_backend = None  # which backend ran the last call ("fused" or "unfused")

    def _config(
        self,
        qkv_format,
        attn_mask_type,
        window_size,
        bottom_right_diagonal,
        softcap,
        core_attention_bias_type,
        inference_params,
    ):
        mask_type = utils.normalize_mask_type(self.attn_mask_type if attn_mask_type is None else attn_mask_type)
        if qkv_format.startswith("thd") and "padding" not in mask_type and mask_type != "arbitrary":
            # Packed sequences are padded by construction (the reference does the same).
            mask_type = "padding" if mask_type == "no_mask" else "padding_" + mask_type
        if inference_params is not None:
            if mask_type == "padding_causal":
                mask_type = "padding_causal_bottom_right"  # new queries sit at the end of each sequence
        window = self.window_size if window_size is None else window_size
        window = utils.check_set_window_size(mask_type, window)
        bottom_right = self.bottom_right_diagonal if bottom_right_diagonal is None else bottom_right_diagonal
        if core_attention_bias_type not in utils.BIAS_TYPES:
            raise ValueError(
                f"{_OWNER}: core_attention_bias_type must be one of {utils.BIAS_TYPES}, "
                f"got {core_attention_bias_type!r}"
            )
        return AttnConfig(
            qkv_format=qkv_format,
            mask_type=mask_type,
            window=window,
            bottom_right=utils.default_bottom_right(mask_type, bottom_right),
            scale=self.softmax_scale,
            softmax_type=self.softmax_type,
            bias_type=core_attention_bias_type,
            dropout=self.attention_dropout if self.training else 0.0,
            softcap=self.softcap if softcap is None else float(softcap),
            return_max_logit=self.return_max_logit,
        )

    def forward(
        self,
        query_layer=None,
        key_layer=None,
        value_layer=None,
        attention_mask=None,
        qkv_format=None,
        cu_seqlens_q=None,
        cu_seqlens_kv=None,
        cu_seqlens_q_padded=None,
        cu_seqlens_kv_padded=None,
        max_seqlen_q=None,
        max_seqlen_kv=None,
        attn_mask_type=None,
        window_size=None,
        bottom_right_diagonal=None,
        softcap=None,
        checkpoint_core_attention: bool = False,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias=None,
        alibi_slopes=None,
        fast_zero_fill: bool = True,
        inference_params=None,
        pad_between_seqs=None,
        fp8_output: bool = False,
        bf16_backward: bool = False,
        num_splits: int = 1,
        score_mod=None,
        score_mod_bprop=None,
        score_mod_tensors=None,
        score_mod_bprop_tensors=None,
        qkv_layer=None,
        kv_layer=None,
        qkv_interleave_dim: int = -3,
        thd_attention_policies=None,
        thd_attention_policy_dispatch: str = "auto",
    ):
        if (
            fp8_output
            or bf16_backward
            or num_splits != 1
            or score_mod is not None
            or score_mod_bprop is not None
            or score_mod_tensors is not None
            or score_mod_bprop_tensors is not None
            or thd_attention_policies is not None
            or thd_attention_policy_dispatch != "auto"
        ):  # (checked inline first: this runs on every call, and most calls pass none)
            self._not_yet_supported(locals())
        # (fast_zero_fill, pad_between_seqs: padded rows are always zero; cu_seqlens_*_padded say where)
        q, k, v = _unpack(query_layer, key_layer, value_layer, qkv_layer, kv_layer, qkv_interleave_dim)
        qkv_format = self.qkv_format if qkv_format is None else qkv_format
        if qkv_format not in utils.QKV_FORMATS:
            raise ValueError(f"{_OWNER}: qkv_format must be one of {utils.QKV_FORMATS}, got {qkv_format!r}")
        _check_qkv(q, k, v, qkv_format, self.num_attention_heads, self.num_gqa_groups)
        if inference_params is not None:
            mask = utils.normalize_mask_type(self.attn_mask_type if attn_mask_type is None else attn_mask_type)
            if "padding" not in mask:  # (checked before the cache changes)
                raise ValueError(
                    f"{_OWNER}: KV caching (inference_params) needs a padding mask type "
                    f"('padding' or 'padding_causal'), got attn_mask_type={mask!r}"
                )
            if qkv_format == "thd":
                raise NotImplementedError(f"{_OWNER}: KV caching with qkv_format='thd' is not yet supported")
            k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_kv, qkv_format = inference_params.step(
                self.layer_number, k, v, qkv_format
            )
            cu_seqlens_q_padded = cu_seqlens_kv_padded = None
        cfg = self._config(
            qkv_format,
            attn_mask_type,
            window_size,
            bottom_right_diagonal,
            softcap,
            core_attention_bias_type,
            inference_params,
        )
        _check_bias(cfg, core_attention_bias, alibi_slopes, self.num_attention_heads)
        for name, cu in (
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_kv", cu_seqlens_kv),
            ("cu_seqlens_q_padded", cu_seqlens_q_padded),
            ("cu_seqlens_kv_padded", cu_seqlens_kv_padded),
        ):
            utils.check_cu_seqlens(name, cu)
        call = dict(
            attention_mask=attention_mask,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv,
            bias=core_attention_bias,
            alibi_slopes=alibi_slopes,
            softmax_offset=self._softmax_offset(q),
        )
        if fp8.requested():
            backend, plan = "unfused", None
            call["fp8"] = self._fp8_hooks(q, k, v)
        else:
            backend, plan = select_backend(cfg, dict(call, q=q, k=k, v=v))
        self.__dict__["last_backend"] = backend  # (not nn.Module.__setattr__: a plain attribute, set per call)
        if backend == "flash":
            if cfg.qkv_format == "thd":
                run = lambda: flash.run_thd(cfg, call, q, k, v)  # noqa: E731
            else:
                run = lambda: flash.run(cfg, q, k, v, self.training)  # noqa: E731
        elif backend == "fused":
            run = lambda: fused.run(plan)  # noqa: E731
        else:
            run = lambda: self.unfused_attention(cfg, q, k, v, **call)  # noqa: E731
        if checkpoint_core_attention and torch.is_grad_enabled():
            return checkpoint(run, use_reentrant=False)
        return run()

    def _fp8_hooks(self, q, k, v) -> fp8.Hooks:
        """The quantizers of an FP8 attention call (fp8_dpa / fp8_mha), from this
        module's FP8 state (synced to the autocast's recipe)."""
        fp8.check_recipe(_OWNER)
        fp8.warn_once(_OWNER)
        self.fp8_state_for_forward(q.device)
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        queue = self.backward_update_queue(needs_grad)
        return fp8.Hooks(self.quantizers["scaling_fwd"], self.quantizers["scaling_bwd"], queue)

    @staticmethod
    def _not_yet_supported(a: dict) -> None:
        fp8_output, bf16_backward, num_splits = a["fp8_output"], a["bf16_backward"], a["num_splits"]
        score_mod, score_mod_bprop = a["score_mod"], a["score_mod_bprop"]
        score_mod_tensors, score_mod_bprop_tensors = a["score_mod_tensors"], a["score_mod_bprop_tensors"]
        thd_attention_policies, thd_attention_policy_dispatch = (
            a["thd_attention_policies"],
            a["thd_attention_policy_dispatch"],
        )
        not_yet_supported(
            _OWNER,
            fp8_output=(fp8_output, False),
            bf16_backward=(bf16_backward, False),
            num_splits=(num_splits, 1),
            score_mod=(score_mod, None),
            score_mod_bprop=(score_mod_bprop, None),
            score_mod_tensors=(score_mod_tensors, None),
            score_mod_bprop_tensors=(score_mod_bprop_tensors, None),
            thd_attention_policies=(thd_attention_policies, None),
            thd_attention_policy_dispatch=(thd_attention_policy_dispatch, "auto"),
        )

    def _softmax_offset(self, q):
        if self.softmax_type == "learnable":
            return self.softmax_offset
        if self.softmax_type == "off-by-one":
            return torch.zeros(self.num_attention_heads, dtype=torch.float32, device=q.device)
        return None


def _unpack(q, k, v, qkv_layer, kv_layer, dim):
    """q, k, v from separate tensors or packed ones (qkv_layer / kv_layer, the
    three or two sharing dimension qkv_interleave_dim)."""
    if qkv_layer is None and kv_layer is None:
        if q is None or k is None or v is None:
            raise ValueError(f"{_OWNER}: query_layer, key_layer and value_layer are required (or qkv_layer / kv_layer)")
        return q, k, v
    if dim not in (-3, -2):
        raise ValueError(f"{_OWNER}: qkv_interleave_dim must be -3 or -2, got {dim}")
    if qkv_layer is not None:
        if kv_layer is not None or q is not None or k is not None or v is not None:
            raise ValueError(f"{_OWNER}: qkv_layer packs q, k and v: pass no other q/k/v tensor with it")
        if qkv_layer.shape[dim] != 3:
            raise ValueError(f"{_OWNER}: qkv_layer must have size 3 at dim {dim}, got {tuple(qkv_layer.shape)}")
        return tuple(qkv_layer.select(dim, i) for i in range(3))
    if q is None or k is not None or v is not None:
        raise ValueError(f"{_OWNER}: kv_layer packs k and v: pass query_layer and no key_layer/value_layer")
    if kv_layer.shape[dim] != 2:
        raise ValueError(f"{_OWNER}: kv_layer must have size 2 at dim {dim}, got {tuple(kv_layer.shape)}")
    return q, kv_layer.select(dim, 0), kv_layer.select(dim, 1)


def _check_qkv(q, k, v, fmt, heads, groups):
    rank = 3 if fmt == "thd" else 4
    for name, t in (("query_layer", q), ("key_layer", k), ("value_layer", v)):
        if t.dim() != rank:
            raise ValueError(f"{_OWNER}: {name} must be {rank}-D for qkv_format={fmt!r}, got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise TypeError(f"{_OWNER}: {name} must be float32, float16 or bfloat16, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{_OWNER}: query/key/value must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-2] != heads or k.shape[-2] != groups or v.shape[-2] != groups:
        raise ValueError(
            f"{_OWNER}: expected {heads} query heads and {groups} key/value heads (num_gqa_groups), got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{_OWNER}: query and key head sizes differ: {q.shape[-1]} vs {k.shape[-1]}")


def _check_bias(cfg, bias, alibi_slopes, heads):
    if cfg.bias_type in ("pre_scale_bias", "post_scale_bias"):
        if bias is None:
            raise ValueError(f"{_OWNER}: core_attention_bias_type={cfg.bias_type!r} needs core_attention_bias")
        if bias.dim() != 4 or bias.shape[1] not in (1, heads):
            raise ValueError(
                f"{_OWNER}: core_attention_bias must be [1 or b, 1 or {heads}, sq, skv], got {tuple(bias.shape)}"
            )
    elif bias is not None:
        raise ValueError(
            f"{_OWNER}: core_attention_bias is given but core_attention_bias_type={cfg.bias_type!r}; "
            "use 'pre_scale_bias' or 'post_scale_bias'"
        )
    if alibi_slopes is not None:
        if cfg.bias_type != "alibi":
            warnings.warn(
                f"{_OWNER}: alibi_slopes ignored: core_attention_bias_type is {cfg.bias_type!r}", stacklevel=3
            )
        elif alibi_slopes.dtype != torch.float32 or alibi_slopes.shape[-1] != heads or alibi_slopes.dim() > 2:
            raise ValueError(
                f"{_OWNER}: alibi_slopes must be float32 [{heads}] or [b, {heads}], got "
                f"{alibi_slopes.dtype} {tuple(alibi_slopes.shape)}"
            )
