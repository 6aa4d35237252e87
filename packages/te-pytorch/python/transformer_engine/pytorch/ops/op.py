"""Base classes of the fusible operations (te.ops).

A BasicOperation is one tensor operation that owns its parameters and its
quantization state; it implements op_forward / op_backward (or, with extra
tensor inputs or outputs, fuser_forward / fuser_backward). A FusedOperation
stands for a run of basic ops and computes them together, reading the
parameters and state of its basic ops. OperationFuser (fuser.py) runs a
pipeline of them in one autograd function, so that the forward and the
backward pass may be fused differently.

Quantization state: under te.autocast each basic op with quantized tensors
gets one RecipeState per direction (recipe_state.py, the same machinery as the
modules), with num_quantizers(mode) slots, and its quantizers from it. Slot
roles follow recipe_state's layout: forward slot 1 is a weight, the other
forward slots inputs, backward slots gradients (BasicLinear: forward input 0,
weight 1; backward grad_output 0). The delayed-scaling state is saved in the
op's `_extra_state` in the modules' format (module/_extra_state.py).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from ..module._extra_state import copy_loaded_state, load_extra_state, save_extra_state
from ..module.base import _with_index
from ..recipe_state import RecipeState

_NO_CHANNELS = (
    "extra tensor channels (set_extra_input_channel / set_extra_output_channel) are not yet supported by "
    "transformer_engine.pytorch.ops; pass extra inputs and take extra outputs through the Sequential's call"
)


@dataclasses.dataclass
class OperationContext:
    """What an operation's forward keeps for its backward (like an autograd ctx).

    save_for_backward(*tensors) in forward; saved_tensors in backward (the
    fuser saves the tensors of all its ops through one autograd ctx).
    Other attributes may be set freely.
    """

    saved_tensors: tuple | None = None
    to_save: tuple | None = None
    _saved_tensors_range: tuple[int, int] | None = None
    requires_grad: bool = True

    def save_for_backward(self, *tensors) -> None:
        self.to_save = tensors


class FusibleOperation(torch.nn.Module, metaclass=abc.ABCMeta):
    """A tensor operation that the operation fuser can run (basic or fused)."""

    @property
    @abc.abstractmethod
    def is_fused_op(self) -> bool:
        """Whether this op is the fusion of one or more basic ops."""

    def pre_first_fuser_forward(self) -> None:
        """Called once, before the first fuser forward (e.g. materializes meta parameters)."""

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        """Called before each fuser forward."""

    def get_input_quantizer(self):
        """The quantizer of this op's input (None: the op takes high precision)."""
        return None

    def get_grad_output_quantizer(self):
        """The quantizer of the gradient of this op's output (None: high precision)."""
        return None

    def fuser_forward(
        self,
        basic_op_ctxs,
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs,
        prev_op_grad_output_quantizer,
        next_op_input_quantizer,
        basic_op_kwargs: list[dict[str, Any]],
    ):
        """Forward pass: (output, extra outputs of each basic op)."""
        raise NotImplementedError(f"Forward pass is not implemented for operation ({type(self).__name__})")

    def fuser_backward(self, basic_op_ctxs, grad_output: torch.Tensor, *, basic_op_grad_extra_outputs):
        """Backward pass: (grad input, grads of each basic op's parameters, grads of its extra inputs)."""
        raise NotImplementedError(f"Backward pass is not implemented for operation ({type(self).__name__})")


class BasicOperation(FusibleOperation, metaclass=abc.ABCMeta):
    """A single tensor operation: holds the parameters and state, even when a
    fused operation computes it."""

    num_extra_inputs: int = 0
    num_extra_outputs: int = 0

    def __init__(self) -> None:
        super().__init__()
        # {"recipe", "scaling_fwd", "scaling_bwd"} (the modules' fp8_meta layout), or None.
        self.fp8_meta: dict | None = None
        self._quantizers: dict[str, list] | None = None
        self._fp8_device = None

    @property
    def is_fused_op(self) -> bool:
        return False

    def set_extra_input_channel(self, index: int, channel):
        raise NotImplementedError(_NO_CHANNELS)

    def set_extra_output_channel(self, index: int, channel, *, output_to_caller: bool = True):
        raise NotImplementedError(_NO_CHANNELS)

    # ------------------------------------------------------------------ quantization state

    def num_quantizers(self, mode: str) -> int:
        """How many quantized tensors the op has in `mode` ("forward" or "backward")."""
        return 0

    def get_quantizer_roles(self, mode: str):
        """The reference's per-slot roles; None here (recipe_state assigns roles by slot)."""
        return None

    def get_input_quantizer(self):
        return self.get_quantizer("forward", 0) if self.num_quantizers("forward") > 0 else None

    def get_grad_output_quantizer(self):
        return self.get_quantizer("backward", 0) if self.num_quantizers("backward") > 0 else None

    def get_quantizer(self, mode: str, index: int):
        """The quantizer of slot `index` in `mode`, or None outside te.autocast."""
        if self._quantizers is None:
            return None
        return self._quantizers[mode][index]

    def _state_device(self) -> torch.device:
        for param in self.parameters():
            if param.device.type != "meta":
                return param.device
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

    def reset_recipe_state(self, *, recipe, device=None) -> None:
        """Makes the quantization state match `recipe` (None: no state); cheap
        when it already does. device: where delayed-scaling state lives
        (default: the parameters' device)."""
        if recipe is None or (self.num_quantizers("forward") == 0 and self.num_quantizers("backward") == 0):
            self.fp8_meta = self._quantizers = None
            return
        device = _with_index(self._state_device() if device is None else device)
        old = self.fp8_meta
        if old is not None and (old["recipe"] is recipe or old["recipe"] == recipe) and self._fp8_device == device:
            return
        self._build_recipe_state(recipe, device, old)

    def _build_recipe_state(self, recipe, device, old) -> None:
        meta = {"recipe": recipe}
        quantizers = {}
        for key, mode in (("scaling_fwd", "forward"), ("scaling_bwd", "backward")):
            state = RecipeState.create(recipe, mode=mode, num_quantizers=self.num_quantizers(mode), device=device)
            if old is not None:
                state.adopt(old[key])  # (delayed scaling keeps its scales across recipe changes)
            meta[key] = state
            quantizers[mode] = state.make_quantizers()
        self.fp8_meta, self._quantizers, self._fp8_device = meta, quantizers, device

    def recipe_state(self, mode: str):
        """The RecipeState of `mode`, or None outside te.autocast."""
        if self.fp8_meta is None:
            return None
        return self.fp8_meta["scaling_fwd" if mode == "forward" else "scaling_bwd"]

    # ------------------------------------------------------------------ forward / backward

    @abc.abstractmethod
    def op_forward(
        self,
        ctx,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer,
        next_op_input_quantizer,
        **kwargs,
    ):
        """Forward pass: the output; saves in ctx what op_backward needs."""

    @abc.abstractmethod
    def op_backward(self, ctx, grad_output: torch.Tensor):
        """Backward pass: (grad input, iterable of the parameters' grads)."""

    def _require_plain(self, what: str) -> None:
        if self.num_extra_inputs > 0 or self.num_extra_outputs > 0:
            raise RuntimeError(
                f"{type(self).__name__} operation has {self.num_extra_inputs} extra tensor inputs and "
                f"{self.num_extra_outputs} extra tensor outputs. It should override `fuser_{what}` "
                f"instead of `op_{what}`."
            )

    def fuser_forward(
        self,
        basic_op_ctxs,
        input_,
        *,
        basic_op_extra_inputs,
        prev_op_grad_output_quantizer,
        next_op_input_quantizer,
        basic_op_kwargs,
    ):
        self._require_plain("forward")
        output = self.op_forward(
            basic_op_ctxs[0],
            input_,
            prev_op_grad_output_quantizer=prev_op_grad_output_quantizer,
            next_op_input_quantizer=next_op_input_quantizer,
            **basic_op_kwargs[0],
        )
        return output, [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        self._require_plain("backward")
        grad_input, grad_params = self.op_backward(basic_op_ctxs[0], grad_output)
        return grad_input, [grad_params], [()]

    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor, **kwargs):  # noqa: A002 (the reference's name)
        """Applies the operation on its own (a one-op fuser)."""
        from .fuser import OperationFuser

        return OperationFuser([self])(input, *extra_inputs, basic_op_kwargs=[kwargs])

    # ------------------------------------------------------------------ checkpoints

    def get_extra_state(self):
        """The delayed-scaling state (module/_extra_state.py's format); an empty
        uint8 tensor when there is none."""
        if self.fp8_meta is None:
            return torch.empty(0, dtype=torch.uint8)
        return save_extra_state(self.fp8_meta)

    def set_extra_state(self, state) -> None:
        loaded = load_extra_state(state)
        if loaded is None:
            return
        recipe, tensors = loaded
        self._build_recipe_state(recipe, _with_index(self._state_device()), None)
        copy_loaded_state(self.fp8_meta, tensors, type(self).__name__)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        # A checkpoint without FP8 state (e.g. of torch.nn modules) loads.
        key = prefix + "_extra_state"
        if key in missing_keys:
            missing_keys.remove(key)


class FusedOperation(FusibleOperation):
    """A compound operation standing for a run of basic ops (basic_ops).

    It holds no parameters or state of its own: it reads those of its basic
    ops. A forward-only (backward-only) fusion must be interchangeable with
    its basic ops' forward (backward): it saves in each basic op's context
    what that op's unfused backward reads.
    """

    def __init__(self, basic_ops: Iterable[FusibleOperation]) -> None:
        super().__init__()
        self.basic_ops = torch.nn.ModuleList(basic_ops)
        if len(self.basic_ops) == 0:
            raise ValueError(
                "Attempted to construct a fused operation without specifying its corresponding basic operations"
            )

    @property
    def is_fused_op(self) -> bool:
        return True

    def get_input_quantizer(self):
        return self.basic_ops[0].get_input_quantizer()

    def get_grad_output_quantizer(self):
        return self.basic_ops[-1].get_grad_output_quantizer()

    def pre_first_fuser_forward(self) -> None:
        for op in self.basic_ops:
            op.pre_first_fuser_forward()

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        for op in self.basic_ops:
            op.pre_fuser_forward(requires_grad=requires_grad)

    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor, basic_op_kwargs=None):  # noqa: A002
        """Applies the operation on its own (a fuser of this op)."""
        from .fuser import OperationFuser

        if basic_op_kwargs is None:
            basic_op_kwargs = [{} for _ in self.basic_ops]
        return OperationFuser([self])(input, *extra_inputs, basic_op_kwargs=basic_op_kwargs)
