"""What every TE module shares: device defaults, unsupported-argument checks,
the FP8 state (fp8_meta / quantizers) and its checkpointing in _extra_state.

A new module (e.g. attention) subclasses TransformerEngineBaseModule with its
number of GEMMs and, in forward:
    state = self.fp8_state_for_forward(inp.device)   # None: high precision
    if state is not None and FP8GlobalStateManager.fp8_enabled:
        state.check_dims(tokens, in_features, out_features, owner)
        fwd = self.quantizers["scaling_fwd"]   # slot 3g+0 input, 3g+1 weight of GEMM g
        bwd = self.quantizers["scaling_bwd"]   # slot 2g+0 grad_output
        ... state.split_accumulator, state.per_tensor, state.delayed ...
        queue = self.backward_update_queue(needs_grad)  # run it at the end of backward
It asks the RecipeState (recipe_state.py), never the recipe's kind, what the
recipe means; its autograd function gets what it needs as arguments and
returns what the module keeps (e.g. a weight Operand to cache), writing no
module state itself.

Threads: a module's FP8 state belongs to the module, not to a thread. Every
subclass's forward runs under the module's lock (an RLock, taken in eager
mode only), so two threads calling one module never build, rebuild or
record into its FP8 state (quantizers, amax staging row, weight cache) at
the same time; the delayed-scaling update takes the same locks
(quantization.py). The autocast state itself is thread-local.
"""

from __future__ import annotations

import functools
import threading
import warnings

import torch

from .._model_init import check_weight_recipe, model_init_settings, quantized_parameter
from ..kernels._common import compiling
from ..quantization import FP8GlobalStateManager
from ..recipe_state import RecipeState
from ..tensor import QuantizedTensor
from ._extra_state import copy_loaded_state, load_extra_state, save_extra_state

_WARNED_CPU_FALLBACK = False


class _DefaultDevice(str):
    """The type of DEFAULT_DEVICE: equal to "cuda" (the reference's default,
    as signatures show it), but told apart from a "cuda" the caller passed."""

    __slots__ = ()


# The constructors' default device. Left at the default, a module goes to the
# current CUDA device, or to the CPU (with a one-time warning) on a machine
# without CUDA. A device the caller names -- "cuda", "cuda:0" or
# torch.device("cuda", 0) alike -- must exist: without CUDA it is an error.
DEFAULT_DEVICE = _DefaultDevice("cuda")


def resolve_device(device, owner: str = "a Transformer Engine module") -> torch.device:
    """The device a constructor allocates on (see DEFAULT_DEVICE)."""
    global _WARNED_CPU_FALLBACK
    if device is None or device is DEFAULT_DEVICE:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if not _WARNED_CPU_FALLBACK:
            _WARNED_CPU_FALLBACK = True
            warnings.warn(
                "CUDA is not available: Transformer Engine modules are created on the "
                "CPU (pass device='cpu' to silence this warning)",
                stacklevel=3,
            )
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{owner}: device must be a str or torch.device, got {type(device).__name__} {device!r}")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"{owner}: device {device!r} is not a valid torch device ({err})") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{owner}: device={device!r} asks for CUDA, but no CUDA device is available; pass "
                "device='cpu' (te-core's CPU backend runs every op) or leave device at its default"
            )
        index = torch.cuda.current_device() if resolved.index is None else resolved.index
        if index >= torch.cuda.device_count():
            raise RuntimeError(
                f"{owner}: device={device!r} names CUDA device {index}, but only "
                f"{torch.cuda.device_count()} are visible"
            )
        return torch.device("cuda", index)
    return resolved


def _serialized(forward):
    """forward under the module's lock (eager only: dynamo does not trace
    locks, and a compiled region runs no delayed-scaling state)."""

    @functools.wraps(forward)
    def locked_forward(self, *args, **kwargs):
        if compiling():
            return forward(self, *args, **kwargs)
        with self._fp8_lock:
            return forward(self, *args, **kwargs)

    locked_forward._te_serialized = True
    return locked_forward


def not_yet_supported(owner: str, **settings) -> None:
    """Rejects arguments that are accepted for compatibility but not implemented.

    settings: name -> (value, default); a value other than its default raises.
    """
    for name, (value, default) in settings.items():
        if value != default:
            raise NotImplementedError(
                f"{owner}: {name}={value!r} is not yet supported by transformer_engine.pytorch "
                f"(tensor/sequence parallelism, communication overlap and delayed wgrad come "
                f"with the distributed work); leave it at its default {default!r}"
            )


def reject_tp_group(owner: str, tp_group) -> None:
    """A tensor-parallel group of more than one rank is not implemented yet."""
    if tp_group is not None and torch.distributed.get_world_size(tp_group) > 1:
        raise NotImplementedError(
            f"{owner}: a tp_group of more than one rank is not yet supported by transformer_engine.pytorch"
        )


def _with_index(device) -> torch.device:
    """The device with its index: "cuda" is the current CUDA device, so that a
    state built for "cuda" is not rebuilt (new quantizers) when the first
    input arrives on "cuda:0"."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class TransformerEngineBaseModule(torch.nn.Module):
    """A module with `num_gemms` quantized GEMMs.

    fp8_meta["scaling_fwd"] / ["scaling_bwd"] hold the RecipeState of the 3 *
    num_gemms forward and 2 * num_gemms backward tensors; quantizers[...] the
    matching quantizer lists. Both are (re)built when a module first runs
    under a recipe, and when the recipe changes (with a warning).
    """

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if forward is not None and not getattr(forward, "_te_serialized", False):
            cls.forward = _serialized(forward)

    def __init__(self, num_gemms: int = 1) -> None:
        super().__init__()
        self._fp8_lock = threading.RLock()
        self._num_gemms = num_gemms
        self.fp8_meta = {"recipe": None, "scaling_fwd": None, "scaling_bwd": None}
        self.quantizers = {"scaling_fwd": [], "scaling_bwd": []}
        self._fp8_device = None
        self._weight_cache = None
        # quantized_model_init at construction: weights are created quantized
        # (also later, when reset_parameters materializes a meta module).
        settings = model_init_settings()
        self.primary_weights_in_fp8 = settings is not None
        self._model_init_recipe = settings[0] if settings else None
        self.preserve_high_precision_init_val = bool(settings and settings[1])
        self._model_init_columnwise = torch.is_grad_enabled()  # no_grad: inference, rowwise copy only
        self._quantized_weights: dict[str, int] = {}  # parameter name -> its GEMM's index

    def _apply(self, fn, recurse=True):
        """module.to(...) / .cuda() / .half() with quantized parameters.

        A quantized parameter keeps its bytes in Python attributes of a wrapper
        tensor, so nn.Module's default `param.data = fn(param)` would keep the
        old buffers (and device); swapping the converted tensor in
        (torch.utils.swap_tensors, what torch's own opt-in flag does) moves
        everything."""
        if not any(isinstance(p, QuantizedTensor) for p in self._parameters.values()):
            return super()._apply(fn, recurse)
        previous = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return super()._apply(fn, recurse)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(previous)

    # A lock cannot be pickled or deep-copied: a copy gets a lock of its own.
    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_fp8_lock", None)
        return state

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self._fp8_lock = threading.RLock()

    # ------------------------------------------------------------------ FP8 state

    def init_fp8_metadata(self, recipe, device) -> None:
        """Makes fp8_meta/quantizers match `recipe` and `device` (cheap when they already do)."""
        old = self.fp8_meta["recipe"]
        if old is recipe or (old is not None and old == recipe):
            # (Every forward comes here with its input's indexed device: the
            # index is filled in only when that differs, off the common path.)
            if device == self._fp8_device or _with_index(device) == self._fp8_device:
                return
            # The module moved (module.to(...)): the state follows, values kept.
            self._build_fp8_state(recipe, device, adopt=True)
            return
        # (torch.compile cannot trace warnings.warn: under it the state is
        # rebuilt silently; the changed recipe recompiles the graph anyway.)
        if old is not None and not compiling():
            if type(old) is not type(recipe):
                warnings.warn(
                    f"Recipe type changed from {type(old).__name__} to "
                    f"{type(recipe).__name__}: rebuilding the quantizers of "
                    f"{type(self).__name__}",
                    stacklevel=3,
                )
            else:
                warnings.warn(
                    "Quantizer is being updated, this may affect model behavior "
                    f"({type(self).__name__}: {old} -> {recipe})",
                    stacklevel=3,
                )
        self._build_fp8_state(recipe, device, adopt=True)

    def _build_fp8_state(self, recipe, device, adopt: bool) -> None:
        n = self._num_gemms
        for key, mode, count in (("scaling_fwd", "forward", 3 * n), ("scaling_bwd", "backward", 2 * n)):
            state = RecipeState.create(recipe, mode=mode, num_quantizers=count, device=device)
            old = self.fp8_meta[key]
            if adopt and old is not None:
                state.adopt(old)
            state.lock = self._fp8_lock  # (the delayed-scaling update takes it)
            self.fp8_meta[key] = state
            self.quantizers[key] = state.make_quantizers()
        self.fp8_meta["recipe"] = recipe
        self._fp8_device = _with_index(device)
        self._weight_cache = None
        self._rebind_quantized_weights()

    def fp8_state_for_forward(self, device):
        """The forward RecipeState to run with (None: high precision) after
        syncing the state to the autocast's recipe and `device`.

        The state does its per-forward bookkeeping (delayed scaling: registers
        for the update at the exit of the outermost autocast). Under
        calibration (fp8_enabled False) the state is returned too: the module
        runs in high precision and records amaxes where state.delayed.
        """
        s = FP8GlobalStateManager
        if not (s.fp8_enabled or s.fp8_calibration):
            return None
        recipe = s.fp8_recipe
        if self._quantized_weights:
            for name in self._quantized_weights:
                check_weight_recipe(type(self).__name__, name, getattr(self, name), recipe)
        self.init_fp8_metadata(recipe, device)
        state = self.fp8_meta["scaling_fwd"]
        state.on_forward(s)
        return state

    def backward_update_queue(self, needs_grad: bool):
        """Under FP8 (fp8_enabled) with grad: registers this module's backward
        state where its recipe updates it after backward; returns the region's
        queue if this module's backward must run it, else None."""
        if not needs_grad:
            return None
        return self.fp8_meta["scaling_bwd"].backward_queue(FP8GlobalStateManager)

    # ------------------------------------------------------------------ quantized weights

    def quantize_weight_param(self, name: str, gemm: int = 0) -> None:
        """Under quantized_model_init (at construction): replaces the freshly
        initialized high-precision parameter `name` by a Parameter holding only
        its quantized form, made by the weight quantizer of GEMM `gemm`
        (forward slot 3 * gemm + 1). A no-op otherwise. Modules call it from
        reset_parameters() after initializing each weight."""
        if not self.primary_weights_in_fp8:
            return
        value = getattr(self, name)
        self.init_fp8_metadata(self._model_init_recipe, value.device)
        quantizer = self.quantizers["scaling_fwd"][3 * gemm + 1]
        param = quantized_parameter(
            value,
            quantizer,
            columnwise=self._model_init_columnwise,
            preserve=self.preserve_high_precision_init_val,
            requires_grad=value.requires_grad,
        )
        self.register_parameter(name, param)
        self._quantized_weights[name] = gemm

    def _rebind_quantized_weights(self) -> None:
        """Points each quantized weight at the current weight quantizer (after
        the FP8 state was rebuilt: new recipe parameters, a device move, a
        loaded checkpoint), so that optimizer steps requantize with it."""
        quantizers = self.quantizers["scaling_fwd"]
        for name, gemm in self._quantized_weights.items():
            weight = getattr(self, name, None)
            if weight is not None and hasattr(weight, "_quantizer"):
                weight._quantizer = quantizers[3 * gemm + 1]

    def high_precision_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight for a high-precision GEMM (no autocast, or calibration):
        a quantized weight is dequantized (its gradient flows to the parameter)."""
        if isinstance(weight, QuantizedTensor):
            return weight.dequantize()
        return weight

    # ------------------------------------------------------------------ checkpoints

    def get_extra_state(self):
        return save_extra_state(self.fp8_meta)

    def set_extra_state(self, state) -> None:
        loaded = load_extra_state(state)
        if loaded is None:
            return
        recipe, tensors = loaded
        device = self._parameter_device()
        self._build_fp8_state(recipe, device, adopt=False)
        copy_loaded_state(self.fp8_meta, tensors, type(self).__name__)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        try:
            super()._load_from_state_dict(
                state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
            )
        except ValueError as err:  # (set_extra_state's: name the state_dict key)
            raise ValueError(f"{type(self).__name__}: state_dict key {prefix}_extra_state: {err}") from err
        # A checkpoint without FP8 state (e.g. from torch.nn modules) loads.
        key = prefix + "_extra_state"
        if key in missing_keys:
            missing_keys.remove(key)

    def _parameter_device(self) -> torch.device:
        for param in self.parameters():
            return param.device
        return torch.device("cpu")
