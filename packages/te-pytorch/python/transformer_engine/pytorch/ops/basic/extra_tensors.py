"""AddExtraInput and MakeExtraOutput: a residual's two ends in a fused pipeline.

AddExtraInput adds a tensor given to the fuser's call (its gradient flows back
to that tensor); MakeExtraOutput returns the intermediate tensor as an extra
output of the call (the gradient of that output is added in backward).
in_place=True does the addition into the given buffer (the extra input in
forward, the extra output's gradient in backward), as the reference does.
"""

from __future__ import annotations

from ..op import BasicOperation


class _ExtraTensorOperation(BasicOperation):
    """An op of extra tensors only: fuser_forward / fuser_backward, no op_forward."""

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self._in_place = in_place

    def op_forward(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__name__} operation has {self.num_extra_inputs} extra tensor inputs and "
            f"{self.num_extra_outputs} extra tensor outputs. It overrides `fuser_forward` instead of `op_forward`."
        )

    def op_backward(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__name__} operation has {self.num_extra_inputs} extra tensor inputs and "
            f"{self.num_extra_outputs} extra tensor outputs. It overrides `fuser_backward` instead of `op_backward`."
        )


class AddExtraInput(_ExtraTensorOperation):
    """Returns the main input plus an extra input of the fuser's call.

    in_place=True adds the main input into the extra input's buffer and
    returns it (an advanced feature: in-place updates bypass autograd's checks).
    Compare MakeExtraOutput, which does the addition in the backward pass.
    """

    num_extra_inputs = 1

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
        extra = basic_op_extra_inputs[0][0]
        if self._in_place:
            out = extra.detach()
            out += input_
        else:
            out = extra + input_
        return out, [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        return grad_output, [()], [(grad_output,)]


class MakeExtraOutput(_ExtraTensorOperation):
    """Returns the intermediate tensor as an extra output of the fuser's call.

    Backward adds that output's gradient to the main gradient (in_place=True:
    into the extra output's gradient buffer).
    """

    num_extra_outputs = 1

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
        return input_, [(input_,)]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        grad_extra = basic_op_grad_extra_outputs[0][0]
        if grad_extra is None:
            grad_input = grad_output
        elif self._in_place:
            grad_extra += grad_output
            grad_input = grad_extra
        else:
            grad_input = grad_extra + grad_output
        return grad_input, [()], [()]
