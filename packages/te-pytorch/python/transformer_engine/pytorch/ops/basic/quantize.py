"""Quantize: the tensor in the autocast recipe's quantized format (identity outside te.autocast)."""

from __future__ import annotations

from ...quantization import FP8GlobalStateManager
from .._common import is_quantized_tensor
from ..op import BasicOperation


class Quantize(BasicOperation):
    """Quantizes the tensor with the te.autocast recipe's quantizer (a
    Float8Tensor, MXFP8Tensor, ...); the identity outside te.autocast.

    Args:
        forward: bool, default = True. Quantize the output in the forward pass
        backward: bool, default = False. Quantize the input's gradient in the backward pass
    """

    def __init__(self, forward: bool = True, backward: bool = False) -> None:
        super().__init__()
        self._quantize_forward = forward
        self._quantize_backward = backward

    def num_quantizers(self, mode: str) -> int:
        if mode == "forward":
            return int(self._quantize_forward)
        if mode == "backward":
            return int(self._quantize_backward)
        return 0

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        enabled = FP8GlobalStateManager.is_fp8_enabled()
        ctx.quantize_backward = enabled and self._quantize_backward
        if enabled and self._quantize_forward and not is_quantized_tensor(input_):
            return self.get_quantizer("forward", 0)(input_)
        return input_

    def op_backward(self, ctx, grad_output):
        if ctx.quantize_backward and not is_quantized_tensor(grad_output):
            return self.get_quantizer("backward", 0)(grad_output), ()
        return grad_output, ()
