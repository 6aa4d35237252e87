"""te.ops.Linear: y = x A^T + b as the fused pair BasicLinear + Bias.

The parameters belong to the basic ops (state_dict keys basic_ops.0.weight
and basic_ops.1.bias, as in the reference); `weight` and `bias` are also
registered here for convenience, and left out of the state_dict.
"""

from __future__ import annotations

import torch

from .basic import BasicLinear, Bias
from .op import FusedOperation


class Linear(FusedOperation):
    """Applies a linear transformation :math:`y = x A^T + b` (a drop-in for ``torch.nn.Linear``).

    Args:
        in_features: int.
        out_features: int.
        bias: bool, default = True.
        device: torch.device, default = default CUDA device (the CPU without CUDA).
        dtype: torch.dtype, default = torch's default dtype.
        tensor_parallel_mode, tensor_parallel_group, sequence_parallel: Tensor parallelism: only over a group of one
            rank for now.
        rng_state_tracker_function: callable, optional.
        accumulate_into_main_grad: bool, default = False. As in BasicLinear.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        device=None,
        dtype=None,
        tensor_parallel_mode=None,
        tensor_parallel_group=None,
        sequence_parallel: bool = False,
        rng_state_tracker_function=None,
        accumulate_into_main_grad: bool = False,
    ) -> None:
        ops = [
            BasicLinear(
                in_features,
                out_features,
                device=device,
                dtype=dtype,
                tensor_parallel_mode=tensor_parallel_mode,
                tensor_parallel_group=tensor_parallel_group,
                sequence_parallel=sequence_parallel,
                rng_state_tracker_function=rng_state_tracker_function,
                accumulate_into_main_grad=accumulate_into_main_grad,
            )
        ]
        if bias:
            ops.append(Bias(out_features, device=device, dtype=dtype))
        self._bias_idx = 1 if bias else None  # (set before the base class, which calls register_parameter)
        super().__init__(ops)
        self.register_parameter("weight", self.basic_ops[0].weight)
        self.register_parameter("bias", self.basic_ops[1].bias if bias else None)

    def register_parameter(self, name: str, param) -> None:
        """Registers the parameter, and gives it to the basic op that owns it."""
        if name == "bias" and self._bias_idx is None and param is not None:
            raise ValueError("Attempted to set bias parameter in Linear operation that does not have bias enabled")
        super().register_parameter(name, param)
        if "basic_ops" not in self._modules:
            return
        if name == "weight":
            self.basic_ops[0].weight = param
        elif name == "bias" and self._bias_idx is not None:
            self.basic_ops[self._bias_idx].bias = param

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        out = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        out.pop(f"{prefix}weight", None)
        out.pop(f"{prefix}bias", None)
        return out

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # (the convenience names are filled in from the basic ops' keys)
        if f"{prefix}weight" not in state_dict and f"{prefix}basic_ops.0.weight" in state_dict:
            state_dict[f"{prefix}weight"] = state_dict[f"{prefix}basic_ops.0.weight"]
        if self._bias_idx is not None and f"{prefix}bias" not in state_dict:
            key = f"{prefix}basic_ops.{self._bias_idx}.bias"
            if key in state_dict:
                state_dict[f"{prefix}bias"] = state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def pre_first_fuser_forward(self) -> None:
        super().pre_first_fuser_forward()
        # (meta parameters were materialized in the basic ops: keep the aliases in step)
        torch.nn.Module.register_parameter(self, "weight", self.basic_ops[0].weight)
        if self._bias_idx is not None:
            torch.nn.Module.register_parameter(self, "bias", self.basic_ops[self._bias_idx].bias)
