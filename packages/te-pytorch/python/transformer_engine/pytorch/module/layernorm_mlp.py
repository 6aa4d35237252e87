"""te.LayerNormMLP: out = fc2(act(fc1(norm(x)))), see _layernorm_mlp_fn for the math."""

from __future__ import annotations

import torch

from transformer_engine.core.activation import ACTIVATIONS, DEFAULT_PARAMS, is_gated

from ..distributed import checkpoint
from ..quantization import FP8GlobalStateManager
from ._args import check_module_args
from ._layernorm_mlp_fn import LayerNormMLPFunction, MLPArgs
from ._norm_parts import allocate_norm_params, check_normalization, reset_norm_params
from .base import DEFAULT_DEVICE, TransformerEngineBaseModule, not_yet_supported, reject_tp_group, resolve_device
from .linear import _check_input, init_method_normal

_OWNER = "te.LayerNormMLP"


class LayerNormMLP(TransformerEngineBaseModule):
    """norm -> fc1 -> activation -> fc2 (parameters layer_norm_weight,
    layer_norm_bias (LayerNorm only), fc1_weight [F1, hidden], fc1_bias,
    fc2_weight [hidden, ffn_hidden_size], fc2_bias; F1 = 2 * ffn_hidden_size
    for the gated activations (geglu, reglu, swiglu, qgeglu, sreglu, glu,
    clamped_swiglu), else ffn_hidden_size).

    Constructor arguments and defaults are the reference's (§2.2); the
    tensor/sequence-parallel and overlap arguments must keep their defaults
    for now. checkpoint=True is selective activation recompute: the forward
    keeps only its input for backward (te.checkpoint, non-reentrant, with the
    FP8 state handled as there), and backward recomputes the norm, fc1 and the
    activation before running; fc2's GEMM is skipped in the recompute (its
    output is not needed there), as in the reference. forward returns out, then
    fc2's bias when return_bias, then the normalized input when
    return_layernorm_output (or _gathered).
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        return_bias: bool = False,
        get_rng_state_tracker=None,
        tp_group=None,
        tp_size: int = 1,
        init_method=None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        activation: str = "gelu",
        activation_params=None,
        output_layer_init_method=None,
        fuse_wgrad_accumulation: bool = False,
        params_dtype=None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        seq_length=None,
        micro_batch_size=None,
        set_parallel_mode: bool = False,
        zero_centered_gamma: bool = False,
        device=DEFAULT_DEVICE,
        ub_overlap_ag: bool = False,
        name=None,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type=None,
        checkpoint: bool = False,
    ) -> None:
        super().__init__(num_gemms=2)
        not_yet_supported(
            _OWNER,
            sequence_parallel=(sequence_parallel, False),
            tp_size=(tp_size, 1),
            set_parallel_mode=(set_parallel_mode, False),
            ub_overlap_ag=(ub_overlap_ag, False),
            ub_overlap_rs=(ub_overlap_rs, False),
            ub_overlap_rs_dgrad=(ub_overlap_rs_dgrad, False),
            ub_bulk_dgrad=(ub_bulk_dgrad, False),
            ub_bulk_wgrad=(ub_bulk_wgrad, False),
            delay_wgrad_compute=(delay_wgrad_compute, False),
            symmetric_ar_type=(symmetric_ar_type, None),
        )
        reject_tp_group(_OWNER, tp_group)
        params_dtype = check_module_args(
            _OWNER,
            sizes={"hidden_size": hidden_size, "ffn_hidden_size": ffn_hidden_size},
            flags={
                "bias": bias,
                "return_bias": return_bias,
                "fuse_wgrad_accumulation": fuse_wgrad_accumulation,
                "zero_centered_gamma": zero_centered_gamma,
                "return_layernorm_output": return_layernorm_output,
                "return_layernorm_output_gathered": return_layernorm_output_gathered,
                "checkpoint": checkpoint,
            },
            eps=eps,
            params_dtype=params_dtype,
        )
        self._norm_has_bias = check_normalization(_OWNER, normalization)
        if not isinstance(activation, str) or activation.lower() not in ACTIVATIONS:
            raise ValueError(f"{_OWNER}: activation must be one of {', '.join(ACTIVATIONS)}; got {activation!r}")
        self.activation = activation.lower()
        params = dict(DEFAULT_PARAMS)
        if activation_params:
            if self.activation != "clamped_swiglu":
                raise ValueError(f"{_OWNER}: activation_params apply to clamped_swiglu only, got {self.activation!r}")
            unknown = set(activation_params) - set(DEFAULT_PARAMS)
            if unknown:
                raise ValueError(
                    f"{_OWNER}: unknown activation_params {sorted(unknown)}; expected {sorted(DEFAULT_PARAMS)}"
                )
            params.update({k: float(v) for k, v in activation_params.items()})
        self.activation_params = activation_params
        self._act_params = {
            "limit": params["limit"],
            "alpha": params["alpha"],
            "glu_linear_offset": params["glu_linear_offset"],
        }
        self.hidden_size = hidden_size
        self.ffn_hidden_size = ffn_hidden_size
        self._fc1_out = 2 * ffn_hidden_size if is_gated(self.activation) else ffn_hidden_size
        self.eps = float(eps)
        self.normalization = normalization
        self.zero_centered_gamma = zero_centered_gamma
        self.use_bias = bias
        self.return_bias = return_bias
        self.return_layernorm_output = return_layernorm_output or return_layernorm_output_gathered
        self.checkpoint = checkpoint
        self.return_layernorm_output_gathered = return_layernorm_output_gathered
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.name = name
        self.init_method = init_method_normal() if init_method is None else init_method
        self.output_layer_init_method = (
            init_method_normal() if output_layer_init_method is None else output_layer_init_method
        )
        self.params_dtype = params_dtype
        self._allocate(resolve_device(device, _OWNER) if device != "meta" else torch.device("meta"))
        if device != "meta":
            self.reset_parameters()

    def _allocate(self, device: torch.device) -> None:
        allocate_norm_params(self, self.hidden_size, self._norm_has_bias, device, self.params_dtype)
        shapes = (
            ("fc1_weight", (self._fc1_out, self.hidden_size)),
            ("fc1_bias", (self._fc1_out,)),
            ("fc2_weight", (self.hidden_size, self.ffn_hidden_size)),
            ("fc2_bias", (self.hidden_size,)),
        )
        for name, shape in shapes:
            if name.endswith("bias") and not self.use_bias:
                self.register_parameter(name, None)
                continue
            self.register_parameter(
                name, torch.nn.Parameter(torch.empty(shape, device=device, dtype=self.params_dtype))
            )

    def reset_parameters(self, defer_init: bool = False) -> None:
        """fc1 weight: init_method, fc2 weight: output_layer_init_method, biases 0,
        norm weight 1 (0 when zero-centered). Meta parameters are materialized
        on the default device first. Under quantized_model_init (at
        construction) both weights then become quantized parameters."""
        if defer_init:
            return
        device = self._parameter_device()
        if device.type == "meta":
            self._allocate(resolve_device(DEFAULT_DEVICE, _OWNER))
        elif self.primary_weights_in_fp8:  # fresh high-precision weights to initialize, then quantize
            self._allocate(device)
        with torch.no_grad():
            self.init_method(self.fc1_weight)
            self.quantize_weight_param("fc1_weight", gemm=0)
            self.output_layer_init_method(self.fc2_weight)
            self.quantize_weight_param("fc2_weight", gemm=1)
            if self.use_bias:
                self.fc1_bias.zero_()
                self.fc2_bias.zero_()
        reset_norm_params(self, self.zero_centered_gamma)

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None):
        if self.checkpoint and torch.is_grad_enabled():
            calls = []

            def run(x):
                # The second call is the recompute: non-reentrant checkpointing
                # keeps only the tensors it saves, so fc2's output is not needed.
                skip_fc2 = bool(calls)
                calls.append(True)
                return self._forward(x, is_first_microbatch, skip_fc2)

            return checkpoint(run, inp, use_reentrant=False)
        return self._forward(inp, is_first_microbatch, False)

    def _forward(self, inp: torch.Tensor, is_first_microbatch, skip_fc2: bool):
        _check_input(inp, self.fc1_weight, self.hidden_size, _OWNER)
        a = MLPArgs()
        a.skip_fc2 = skip_fc2
        device_type = inp.device.type
        a.act_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else inp.dtype
        a.kind = self.activation
        a.act_params = self._act_params
        a.eps = self.eps
        a.zero_centered_gamma = self.zero_centered_gamma
        a.return_ln = self.return_layernorm_output
        a.fuse_wgrad = self.fuse_wgrad_accumulation
        w1, w2 = self.fc1_weight, self.fc2_weight
        a.fc1_param, a.fc2_param = w1, w2
        if torch.is_grad_enabled():
            params = (inp, self.layer_norm_weight, self.layer_norm_bias, w1, self.fc1_bias)
            a.grads = tuple(t is not None and t.requires_grad for t in params)
        state = self.fp8_state_for_forward(inp.device)
        if state is not None:
            self._setup_fp8(a, state, inp, is_first_microbatch)
        if not a.fp8:  # (quantized_model_init weights run dequantized; their gradient reaches them)
            w1, w2 = self.high_precision_weight(w1), self.high_precision_weight(w2)
        fc2_bias = None if self.return_bias else self.fc2_bias
        result = LayerNormMLPFunction.apply(
            inp, self.layer_norm_weight, self.layer_norm_bias, w1, self.fc1_bias, w2, fc2_bias, a
        )
        if a.cache_weight:  # (the weight Operands the function made or reused, for later microbatches)
            self._weight_cache = a.weight_cache
        if not (self.return_bias or self.return_layernorm_output):
            return result
        out, ln_out = result if self.return_layernorm_output else (result, None)
        parts = (out,)
        if self.return_bias:
            parts += (self.fc2_bias,)
        if self.return_layernorm_output:
            parts += (ln_out,)
        return parts

    def _setup_fp8(self, a: MLPArgs, state, inp, is_first_microbatch) -> None:
        """Fills `a` for a forward under the recipe of `state` (the forward RecipeState)."""
        a.fwd_q, a.bwd_q = self.quantizers["scaling_fwd"], self.quantizers["scaling_bwd"]
        a.delayed = state.delayed
        if not FP8GlobalStateManager.fp8_enabled:
            a.calibrate = a.delayed  # high-precision forward that records amaxes
            return
        tokens = inp.numel() // self.hidden_size
        state.check_dims(tokens, self.hidden_size, self._fc1_out, _OWNER)
        state.check_dims(tokens, self.ffn_hidden_size, self.hidden_size, _OWNER)
        a.fp8 = True
        a.per_tensor = state.per_tensor
        a.split_acc = state.split_accumulator
        if a.delayed:  # the scales this forward uses (the autocast exit updates them before backward)
            a.scales = state.scale.clone()
        a.cache_weight = is_first_microbatch is not None
        a.reuse_weight = is_first_microbatch is False
        if a.cache_weight:  # (a copy: the function fills it, the module stores it afterwards)
            a.weight_cache = dict(self._weight_cache or {})
        params = (inp, self.layer_norm_weight, self.fc1_weight, self.fc2_weight)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in params)
        a.bwd_queue = self.backward_update_queue(needs_grad)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
            f"normalization={self.normalization}, activation={self.activation}, eps={self.eps}"
        )
