"""Bias: y = x + b over the last dimension (torch.nn.Linear's additive bias)."""

from __future__ import annotations

import torch

from .._common import canonicalize_device, canonicalize_dtype, maybe_dequantize, reject_tensor_parallel
from ..op import BasicOperation


class Bias(BasicOperation):
    """Adds the parameter ``bias`` [size] to the input's last dimension.

    Args:
        size: int. Inner dimension of the input tensor
        device: torch.device, default = default CUDA device (the CPU without CUDA).
        dtype: torch.dtype, default = torch's default dtype.
        tensor_parallel, tensor_parallel_group: Tensor parallelism: only over a group of one rank for now.
    """

    def __init__(
        self,
        size: int,
        *,
        device=None,
        dtype=None,
        tensor_parallel: bool = False,
        tensor_parallel_group=None,
    ) -> None:
        super().__init__()
        owner = "te.ops.Bias"
        if tensor_parallel:
            reject_tensor_parallel(owner, tensor_parallel_group)
        self.tensor_parallel = False
        self.tensor_parallel_group = None
        self.tensor_parallel_size = 1
        self._size = self.local_size = size
        device = canonicalize_device(device, owner)
        self.bias = torch.nn.Parameter(torch.empty(size, device=device, dtype=canonicalize_dtype(dtype, owner)))
        if device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zeroes the bias (a meta bias is first materialized on the default device)."""
        bias = self.bias
        if bias.device.type == "meta":
            bias = torch.nn.Parameter(torch.empty_like(bias, device=canonicalize_device(None, "te.ops.Bias")))
        with torch.no_grad():
            bias.zero_()
        self.bias = bias

    def pre_first_fuser_forward(self) -> None:
        if self.bias.device.type == "meta":
            self.reset_parameters()

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        x = maybe_dequantize(input_)
        if x.dim() == 0 or x.shape[-1] != self.local_size:
            raise ValueError(f"te.ops.Bias: input must have shape [..., {self.local_size}], got {tuple(x.shape)}")
        return x + self.bias

    def op_backward(self, ctx, grad_output):
        dy = maybe_dequantize(grad_output)
        return dy, (bias_grad(dy, self.bias.dtype),)


def bias_grad(dy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The sum of dy over its leading dims, accumulated in FP32 and rounded once to `dtype`."""
    return dy.reshape(-1, dy.shape[-1]).sum(dim=0, dtype=torch.float32).to(dtype)
