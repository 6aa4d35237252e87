"""Operations without parameters or quantized tensors: Identity, Reshape, ConstantScale."""

from __future__ import annotations

from collections.abc import Iterable

from ..op import BasicOperation


class Identity(BasicOperation):
    """Returns the input tensor."""

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        return input_

    def op_backward(self, ctx, grad_output):
        return grad_output, ()


class Reshape(BasicOperation):
    """Reshapes the tensor (see ``torch.reshape``); one dim of ``shape`` may be -1."""

    def __init__(self, shape: Iterable[int]) -> None:
        super().__init__()
        self._shape = tuple(shape)

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        ctx.input_shape = input_.shape
        return input_.reshape(*self._shape)

    def op_backward(self, ctx, grad_output):
        return grad_output.reshape(*ctx.input_shape), ()


class ConstantScale(BasicOperation):
    """Multiplies by a constant ``scale``."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        return input_ * self.scale

    def op_backward(self, ctx, grad_output):
        return grad_output * self.scale, ()
