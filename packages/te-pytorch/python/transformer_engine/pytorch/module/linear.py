"""te.Linear: y = x A^T + b with FP8 GEMMs under te.autocast."""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..kernels._common import compiling
from ..quantization import FP8GlobalStateManager
from ._args import check_module_args, check_tensor
from ._linear_fn import LinearArgs, LinearFunction
from .base import DEFAULT_DEVICE, TransformerEngineBaseModule, not_yet_supported, reject_tp_group, resolve_device

_SUPPORTED_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


def init_method_normal(std: float = 0.023):
    """The reference's default weight init: normal(0, std)."""

    def init(tensor: torch.Tensor) -> None:
        torch.nn.init.normal_(tensor, mean=0.0, std=std)

    return init


def _split_sizes(parameters_split, out_features: int) -> OrderedDict[str, int]:
    """name -> rows of W for each parameter (names with a trailing '_' stripped)."""
    if parameters_split is None:
        return OrderedDict([("", out_features)])
    if isinstance(parameters_split, dict):
        sizes = OrderedDict((name.rstrip("_"), int(size)) for name, size in parameters_split.items())
    else:
        names = [name.rstrip("_") for name in parameters_split]
        if not names or out_features % len(names):
            raise ValueError(
                f"parameters_split: out_features={out_features} cannot be split equally into {len(names)} parameters"
            )
        sizes = OrderedDict((name, out_features // len(names)) for name in names)
    if sum(sizes.values()) != out_features:
        raise ValueError(f"parameters_split sizes {dict(sizes)} must add up to out_features={out_features}")
    return sizes


class _NoopCat(torch.autograd.Function):
    """The full weight from its split parameters: a view of their shared
    storage when they are still adjacent (no copy), else a concatenation;
    the gradient is split back."""

    @staticmethod
    def forward(ctx, *parts):
        ctx.sizes = [p.shape[0] for p in parts]
        if compiling():  # no storage pointers while tracing
            return torch.cat(parts)
        first = parts[0]
        rows = sum(ctx.sizes)
        offset = first.storage_offset()
        adjacent = all(p.is_contiguous() for p in parts) and all(
            p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            and p.storage_offset() == offset + sum(ctx.sizes[:i]) * first.shape[1]
            for i, p in enumerate(parts)
        )
        if adjacent:
            return first.as_strided((rows, first.shape[1]), (first.shape[1], 1), offset)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        return tuple(grad.split(ctx.sizes))


class Linear(TransformerEngineBaseModule):
    """Applies y = x A^T + b (A: `weight` [out_features, in_features]).

    Constructor arguments and defaults are the reference's (§2.2). The
    tensor/sequence-parallel and communication-overlap arguments are accepted
    and must keep their defaults for now (NotImplementedError otherwise).
    device defaults to "cuda"; without CUDA the module goes to the CPU with a
    one-time warning (te-core's CPU backend runs every op, FP8 included).
    Under te.autocast the GEMMs run in FP8 with the autocast's recipe.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group=None,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        rng_tracker_name=None,
        init_method=None,
        bias: bool = True,
        return_bias: bool = False,
        params_dtype=None,
        parallel_mode=None,
        parameters_split=None,
        device=DEFAULT_DEVICE,
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        ub_name=None,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type=None,
        save_original_input: bool = False,
        name=None,
    ) -> None:
        super().__init__(num_gemms=1)
        owner = self._owner = f"te.{type(self).__name__}"  # (LayerNormLinear passes its arguments through)
        not_yet_supported(
            owner,
            sequence_parallel=(sequence_parallel, False),
            tp_size=(tp_size, 1),
            ub_overlap_ag=(ub_overlap_ag, False),
            ub_overlap_rs=(ub_overlap_rs, False),
            ub_overlap_rs_dgrad=(ub_overlap_rs_dgrad, False),
            ub_bulk_dgrad=(ub_bulk_dgrad, False),
            ub_bulk_wgrad=(ub_bulk_wgrad, False),
            delay_wgrad_compute=(delay_wgrad_compute, False),
            symmetric_ar_type=(symmetric_ar_type, None),
            save_original_input=(save_original_input, False),
        )
        reject_tp_group(owner, tp_group)
        params_dtype = check_module_args(
            owner,
            sizes={"in_features": in_features, "out_features": out_features},
            flags={"bias": bias, "return_bias": return_bias, "fuse_wgrad_accumulation": fuse_wgrad_accumulation},
            params_dtype=params_dtype,
        )
        if parallel_mode not in (None, "column", "row"):
            raise ValueError(f"parallel_mode must be None, 'column' or 'row', got {parallel_mode!r}")
        self.parameter_split_sizes = _split_sizes(parameters_split, out_features)
        # Parameter names, computed once (forward reads them every call).
        self._weight_names = tuple(f"{n}_weight" if n else "weight" for n in self.parameter_split_sizes)
        self._bias_names = tuple(f"{n}_bias" if n else "bias" for n in self.parameter_split_sizes)
        if self.primary_weights_in_fp8 and len(self.parameter_split_sizes) > 1:
            raise NotImplementedError(
                "te.Linear: parameters_split under quantized_model_init is not yet supported by "
                "transformer_engine.pytorch (each split weight would need its own quantized GEMM operand)"
            )
        if fuse_wgrad_accumulation and len(self.parameter_split_sizes) > 1:
            raise NotImplementedError(
                "te.Linear: fuse_wgrad_accumulation with parameters_split "
                "is not yet supported by transformer_engine.pytorch"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bias
        self.return_bias = return_bias
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.parallel_mode = parallel_mode
        self.name = name
        self.init_method = init_method_normal() if init_method is None else init_method
        self.params_dtype = params_dtype
        self._allocate(resolve_device(device, owner) if device != "meta" else torch.device("meta"))
        if device != "meta":
            self.reset_parameters()

    def _allocate(self, device: torch.device) -> None:
        """One weight (and bias) buffer; split parameters are row slices of it."""
        weight = torch.empty(self.out_features, self.in_features, device=device, dtype=self.params_dtype)
        bias = torch.empty(self.out_features, device=device, dtype=self.params_dtype)
        offset = 0
        for size, w_name, b_name in zip(self.parameter_split_sizes.values(), self._weight_names, self._bias_names):
            self.register_parameter(w_name, torch.nn.Parameter(weight[offset : offset + size]))
            if self.use_bias:
                self.register_parameter(b_name, torch.nn.Parameter(bias[offset : offset + size]))
            else:
                self.register_parameter(b_name, None)
            offset += size

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Initializes the weights (init_method) and zeroes the biases. Parameters
        on the meta device are first materialized on the default device."""
        if defer_init:
            return
        device = self._parameter_device()
        if device.type == "meta":
            self._allocate(resolve_device(DEFAULT_DEVICE, self._owner))
        elif self.primary_weights_in_fp8:  # fresh high-precision weights to initialize, then quantize
            self._allocate(device)
        with torch.no_grad():
            for w_name in self._weight_names:
                self.init_method(getattr(self, w_name))
                self.quantize_weight_param(w_name)
            if self.use_bias:
                for b_name in self._bias_names:
                    getattr(self, b_name).zero_()

    def _weight_tensor(self) -> torch.Tensor:
        names = self._weight_names
        if len(names) == 1:
            return getattr(self, names[0])
        return _NoopCat.apply(*(getattr(self, n) for n in names))

    def _bias_tensor(self):
        names = self._bias_names
        if len(names) == 1:
            return getattr(self, names[0])
        return _NoopCat.apply(*(getattr(self, n).view(-1, 1) for n in names)).view(-1)

    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ):
        if fp8_output or fp8_grad:
            raise NotImplementedError(
                "te.Linear: fp8_output and fp8_grad are not yet supported by transformer_engine.pytorch"
            )
        weight = self._weight_tensor()
        _check_input(inp, weight, self.in_features)
        bias = self._bias_tensor() if self.use_bias else None
        a = LinearArgs()
        device_type = inp.device.type
        if torch.is_autocast_enabled(device_type):
            a.act_dtype = torch.get_autocast_dtype(device_type)
        else:
            a.act_dtype = inp.dtype
        state = self.fp8_state_for_forward(inp.device)
        if state is not None:
            self._setup_fp8(a, state, inp, weight, is_first_microbatch)
        a.fuse_wgrad = self.fuse_wgrad_accumulation
        a.weight_param = weight
        if not a.fp8:
            weight = self.high_precision_weight(weight)
        out = LinearFunction.apply(inp, weight, None if self.return_bias else bias, a)
        if a.cache_weight:  # (the weight Operand the function made or reused, for later microbatches)
            self._weight_cache = a.weight_cache
        if self.return_bias:
            return out, bias
        return out

    def _setup_fp8(self, a: LinearArgs, state, inp, weight, is_first_microbatch, check_dims: bool = True) -> None:
        """Fills `a` for a forward under the recipe of `state` (the forward
        RecipeState); check_dims=False where the caller checked them already."""
        fwd, bwd = self.quantizers["scaling_fwd"], self.quantizers["scaling_bwd"]
        if not FP8GlobalStateManager.fp8_enabled:
            # Calibration: high-precision forward, amaxes recorded for delayed scaling.
            if state.delayed:
                fwd[0].calibrate(inp)
                fwd[1].calibrate(weight)
            return
        if check_dims:
            state.check_dims(inp.numel() // self.in_features, self.in_features, self.out_features, self._owner)
        a.fp8 = True
        a.input_q, a.weight_q, a.grad_q = fwd[0], fwd[1], bwd[0]
        a.split_acc = state.split_accumulator
        a.cache_weight = is_first_microbatch is not None
        a.reuse_weight = is_first_microbatch is False
        if a.cache_weight:
            a.weight_cache = self._weight_cache
        needs_grad = torch.is_grad_enabled() and (inp.requires_grad or weight.requires_grad)
        a.bwd_queue = self.backward_update_queue(needs_grad)


def _check_input(inp: torch.Tensor, weight: torch.Tensor, in_features: int, owner: str = "te.Linear") -> None:
    """Names what is wrong before the core sees the tensors."""
    check_tensor(owner, "inp", inp)
    if inp.dtype not in _SUPPORTED_INPUTS:
        raise TypeError(f"{owner}: input dtype {inp.dtype} is not supported; use float32, bfloat16 or float16")
    if inp.device != weight.device:
        raise ValueError(
            f"{owner}: input is on {inp.device} but the weight is on "
            f"{weight.device}; move one of them (module.to(device) or inp.to(...))"
        )
    if inp.dim() == 0 or inp.shape[-1] != in_features:
        raise ValueError(f"{owner}: input must have shape [..., in_features={in_features}], got {tuple(inp.shape)}")
