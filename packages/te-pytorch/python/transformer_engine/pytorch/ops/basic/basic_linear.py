"""BasicLinear: y = x A^T over te.Linear's GEMMs (module/_linear_fn.py).

The forward and backward are linear_forward / linear_backward, the bodies of
te.Linear's autograd function, so every recipe runs the same quantized GEMMs
(per-tensor FP8 and the block formats through module/_operand.py). The op's
quantizer slots: forward 0 input, 1 weight; backward 0 grad_output.
"""

from __future__ import annotations

import contextlib
import math

import torch

from ...module._linear_fn import LinearArgs, linear_backward, linear_forward
from .._common import (
    canonicalize_device,
    canonicalize_dtype,
    compute_dtype,
    is_quantized_tensor,
    maybe_dequantize,
    reject_tensor_parallel,
)
from ..op import BasicOperation, OperationContext


class BasicLinear(BasicOperation):
    """Applies a linear transformation :math:`y = x A^T` (``torch.nn.Linear``
    with ``bias=False``); the parameter is ``weight`` [out_features, in_features].

    Args:
        in_features: int. Inner dimension of the input tensor
        out_features: int. Inner dimension of the output tensor
        device: torch.device, default = default CUDA device (the CPU without CUDA).
        dtype: torch.dtype, default = torch's default dtype.
        tensor_parallel_mode, tensor_parallel_group, sequence_parallel: Tensor parallelism: only over a group of one
            rank for now.
        rng_state_tracker_function: callable. Returns a CudaRNGStatesTracker whose fork() is entered for the
            weight's initialization
        accumulate_into_main_grad: bool, default = False. Accumulate the weight gradient into ``weight.main_grad``
            (overwritten when ``weight.overwrite_main_grad`` is True) instead of returning
            it.
        userbuffers_options: dict, optional. Communication overlap: not yet supported.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        device=None,
        dtype=None,
        tensor_parallel_mode=None,
        tensor_parallel_group=None,
        sequence_parallel: bool = False,
        rng_state_tracker_function=None,
        accumulate_into_main_grad: bool = False,
        userbuffers_options=None,
    ) -> None:
        super().__init__()
        owner = "te.ops.BasicLinear"
        if userbuffers_options is not None:
            raise NotImplementedError(
                f"{owner}: userbuffers_options (communication overlap) is not yet supported by "
                "transformer_engine.pytorch.ops"
            )
        from ..._model_init import model_init_settings

        if model_init_settings() is not None:
            raise NotImplementedError(
                f"{owner} under quantized_model_init is not yet supported by transformer_engine.pytorch.ops; "
                "create it outside quantized_model_init (its GEMMs are quantized under te.autocast)"
            )
        self.in_features = in_features
        self.out_features = out_features
        (
            self.tensor_parallel_mode,
            self.tensor_parallel_group,
            self.tensor_parallel_size,
            self.sequence_parallel,
            self.local_in_features,
            self.local_out_features,
        ) = self._canonicalize_tensor_parallelism(
            mode=tensor_parallel_mode,
            process_group=tensor_parallel_group,
            sequence_parallel=sequence_parallel,
            in_features=in_features,
            out_features=out_features,
        )
        device = canonicalize_device(device, owner)
        dtype = canonicalize_dtype(dtype, owner)
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self._rng_state_tracker_function = rng_state_tracker_function
        self._accumulate_into_main_grad = accumulate_into_main_grad
        if device.type != "meta":
            self.reset_parameters()

    @classmethod
    def _canonicalize_tensor_parallelism(cls, *, mode, process_group, sequence_parallel, in_features, out_features):
        """(mode, group, group size, sequence_parallel, local in/out features):
        tensor parallelism over one rank is no parallelism; more ranks are not
        supported yet."""
        if mode not in (None, "column", "row"):
            raise ValueError(f'Supported modes for tensor parallelism are `None`, "row", and "column" (got {mode=})')
        if mode is not None:
            reject_tensor_parallel("te.ops.BasicLinear", process_group)
        return None, None, 1, False, in_features, out_features

    def num_quantizers(self, mode: str) -> int:
        return {"forward": 2, "backward": 1}.get(mode, 0)

    def reset_parameters(self) -> None:
        """Kaiming-uniform initialization (torch.nn.Linear's); a meta weight is
        first materialized on the default device."""
        weight = self.weight
        if weight.device.type == "meta":
            weight = torch.nn.Parameter(
                torch.empty_like(weight, device=canonicalize_device(None, "te.ops.BasicLinear"))
            )
        context = contextlib.nullcontext()
        if self._rng_state_tracker_function is not None:
            context = self._rng_state_tracker_function().fork()
        with context, torch.no_grad():
            torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        self.weight = weight

    def pre_first_fuser_forward(self) -> None:
        if self.weight.device.type == "meta":
            self.reset_parameters()

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() == 0 or x.shape[-1] != self.local_in_features:
            raise ValueError(
                f"te.ops.BasicLinear: input must have shape [..., in_features={self.local_in_features}], "
                f"got {tuple(x.shape)}"
            )
        if x.device != self.weight.device:
            raise ValueError(f"te.ops.BasicLinear: input is on {x.device} but the weight is on {self.weight.device}")

    def compute_dtype(self, input_: torch.Tensor) -> torch.dtype:
        """The GEMMs' output dtype: torch.autocast's, else the weight's."""
        return compute_dtype(input_, self.weight.dtype)

    def linear_forward(self, ctx, input_: torch.Tensor, bias=None) -> torch.Tensor:
        """y = x W^T (+ bias: a fused Bias op's), saving in ctx what op_backward reads."""
        self._check_input(input_)
        weight = self.weight
        dtype = self.compute_dtype(input_)
        a = LinearArgs()
        a.act_dtype = dtype
        need_dgrad = ctx.requires_grad
        need_wgrad = ctx.requires_grad and weight.requires_grad
        state = self.recipe_state("forward")
        x = maybe_dequantize(input_, dtype)
        if state is not None:
            tokens = x.numel() // self.local_in_features
            state.check_dims(tokens, self.local_in_features, self.local_out_features, "te.ops.BasicLinear")
            a.fp8 = True
            a.input_q, a.weight_q = self._quantizers["forward"]
            a.grad_q = self._quantizers["backward"][0]
            a.split_acc = state.split_accumulator
            a.reuse_weight = False  # (no weight caching across microbatches in te.ops)
        elif is_quantized_tensor(weight):
            weight = weight.dequantize()
        a.fuse_wgrad = self._accumulate_into_main_grad and need_wgrad
        a.weight_param = self.weight
        # (an op that needs no backward saves into a scratch context, dropped at once)
        target = ctx if ctx.requires_grad else OperationContext()
        out = linear_forward(target, x, weight, bias, a, need_dgrad, need_wgrad)
        ctx.need_wgrad = need_wgrad
        return out

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        return self.linear_forward(ctx, input_)

    def op_backward(self, ctx, grad_output):
        if self._accumulate_into_main_grad and ctx.need_wgrad and getattr(self.weight, "main_grad", None) is None:
            raise RuntimeError(
                "te.ops.BasicLinear: accumulate_into_main_grad=True needs weight.main_grad "
                "(a tensor of the weight's shape, set by the training framework)"
            )
        dy = maybe_dequantize(grad_output)
        dx, dw, _ = linear_backward(ctx, dy, True, ctx.need_wgrad, False)
        return dx, [dw]
