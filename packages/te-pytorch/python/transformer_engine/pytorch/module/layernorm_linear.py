"""te.LayerNormLinear: y = norm(x) A^T + b, the norm LayerNorm or RMSNorm.

It is te.Linear (same weight/bias handling, FP8 GEMMs, weight caching,
main_grad accumulation) behind the norm of _norm_parts. Under DelayedScaling
the norm kernel writes the GEMM's FP8 input directly (no high-precision
normalized tensor exists); under Float8CurrentScaling the whole output's amax
is needed first, so the norm writes high precision, computing that amax as it
writes (no separate pass), and the GEMM's input quantizer casts it with the
scale derived from it. Backward keeps the input x with the per-row statistics
(for the norm) and the FP8 operands Linear keeps.
"""

from __future__ import annotations

import torch

from ..quantization import FP8GlobalStateManager
from ._args import check_module_args
from ._linear_fn import LinearArgs, LinearFunction
from ._norm_parts import NormAmaxFunction, NormFP8Function, allocate_norm_params, check_normalization, reset_norm_params
from ._operand import fused_amax
from .base import DEFAULT_DEVICE
from .linear import Linear, _check_input
from .normalization import _NormFunction

_OWNER = "te.LayerNormLinear"


class LayerNormLinear(Linear):
    """Applies y = norm(x) A^T + b (parameters layer_norm_weight,
    layer_norm_bias (LayerNorm only), weight [out_features, in_features], bias).

    Constructor arguments and defaults are the reference's (§2.2). The
    tensor/sequence-parallel and communication-overlap arguments are accepted
    and must keep their defaults for now (NotImplementedError otherwise).
    forward returns out, then bias when return_bias, then the normalized
    input when return_layernorm_output (or _gathered: without sequence
    parallelism they are the same tensor).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        eps: float = 1e-5,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group=None,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        init_method=None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        return_bias: bool = False,
        params_dtype=None,
        parallel_mode=None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        parameters_split=None,
        zero_centered_gamma: bool = False,
        device=DEFAULT_DEVICE,
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_name=None,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type=None,
        name=None,
    ) -> None:
        # Read by _allocate, which Linear.__init__ calls (plain attributes may
        # be set before nn.Module.__init__).
        self._norm_has_bias = check_normalization(_OWNER, normalization)
        flags = {"zero_centered_gamma": zero_centered_gamma, "return_layernorm_output": return_layernorm_output}
        flags["return_layernorm_output_gathered"] = return_layernorm_output_gathered
        check_module_args(_OWNER, flags=flags, eps=eps, params_dtype=params_dtype)
        super().__init__(
            in_features,
            out_features,
            sequence_parallel=sequence_parallel,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            tp_group=tp_group,
            tp_size=tp_size,
            get_rng_state_tracker=get_rng_state_tracker,
            init_method=init_method,
            bias=bias,
            return_bias=return_bias,
            params_dtype=params_dtype,
            parallel_mode=parallel_mode,
            parameters_split=parameters_split,
            device=device,
            ub_overlap_ag=ub_overlap_ag,
            ub_overlap_rs=ub_overlap_rs,
            ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
            ub_bulk_dgrad=ub_bulk_dgrad,
            ub_bulk_wgrad=ub_bulk_wgrad,
            ub_name=ub_name,
            delay_wgrad_compute=delay_wgrad_compute,
            symmetric_ar_type=symmetric_ar_type,
            name=name,
        )
        self.eps = float(eps)
        self.normalization = normalization
        self.zero_centered_gamma = zero_centered_gamma
        self.return_layernorm_output = return_layernorm_output or return_layernorm_output_gathered
        self.return_layernorm_output_gathered = return_layernorm_output_gathered
        if device != "meta":
            reset_norm_params(self, zero_centered_gamma)

    def _allocate(self, device: torch.device) -> None:
        allocate_norm_params(self, self.in_features, self._norm_has_bias, device, self.params_dtype)
        super()._allocate(device)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Linear's init for weight/bias; norm weight 1 (0 when zero-centered), norm bias 0."""
        super().reset_parameters(defer_init)
        if not defer_init and hasattr(self, "zero_centered_gamma"):
            reset_norm_params(self, self.zero_centered_gamma)

    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ):
        if fp8_output or fp8_grad:
            raise NotImplementedError(
                f"{_OWNER}: fp8_output and fp8_grad are not yet supported by transformer_engine.pytorch"
            )
        weight = self._weight_tensor()
        _check_input(inp, weight, self.in_features, _OWNER)
        bias = self._bias_tensor() if self.use_bias else None
        a = LinearArgs()
        device_type = inp.device.type
        a.act_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else inp.dtype
        state = self.fp8_state_for_forward(inp.device)
        fp8 = state is not None and FP8GlobalStateManager.fp8_enabled
        if fp8:  # (before the norm runs)
            state.check_dims(inp.numel() // self.in_features, self.in_features, self.out_features, _OWNER)
        norm_args = (inp, self.layer_norm_weight, self.layer_norm_bias, self.eps, self.zero_centered_gamma)
        amax = None
        if fp8 and state.delayed and not self.return_layernorm_output:
            quantizer = self.quantizers["scaling_fwd"][0]
            ln_out = NormFP8Function.apply(*norm_args, self.in_features, quantizer, weight.requires_grad)
        else:
            amax = fused_amax(self.quantizers["scaling_fwd"][0], inp) if fp8 else None
            if amax is None:
                ln_out = _NormFunction.apply(*norm_args, self.in_features)
            else:
                ln_out = NormAmaxFunction.apply(*norm_args, self.in_features, amax)
        if state is not None:
            self._setup_fp8(a, state, ln_out, weight, is_first_microbatch, check_dims=False)
        a.input_amax = amax
        a.fuse_wgrad = self.fuse_wgrad_accumulation
        a.weight_param = weight
        if not a.fp8:  # (a quantized_model_init weight runs dequantized; its gradient reaches it)
            weight = self.high_precision_weight(weight)
        out = LinearFunction.apply(ln_out, weight, None if self.return_bias else bias, a)
        if a.cache_weight:  # (the weight Operand the function made or reused, for later microbatches)
            self._weight_cache = a.weight_cache
        result = (out,)
        if self.return_bias:
            result += (bias,)
        if self.return_layernorm_output:
            result += (ln_out,)
        return result[0] if len(result) == 1 else result

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"normalization={self.normalization}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"
        )
