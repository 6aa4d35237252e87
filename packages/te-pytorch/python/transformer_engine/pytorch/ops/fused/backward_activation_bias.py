"""BackwardActivationBias: the backward of Bias + an activation in one kernel
pass (te-core's activation backward writes the input gradient and its column
sums, the bias gradient, together -- what LayerNormMLP does for fc1's bias).
A backward-only fusion: it reads what the unfused forwards saved.
"""

from __future__ import annotations

from .._common import maybe_dequantize
from ..basic import Bias
from ..basic.activation import _ActivationOperation
from ..op import FusedOperation


class BackwardActivationBias(FusedOperation):
    """dL/dx and dL/db of act(x + b) from one activation-backward pass."""

    def __init__(self, *, bias: Bias, activation: _ActivationOperation) -> None:
        super().__init__((bias, activation))

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        bias_op, act = self.basic_ops
        act_ctx = basic_op_ctxs[1]
        x = act.saved_input(act_ctx)
        dy = maybe_dequantize(grad_output, act_ctx.dtype).contiguous()
        dx, db = act.activation_backward(dy, x, dbias=True)
        dx = act._from_kernel_layout(dx)
        if getattr(act, "glu_interleave_size", None) is not None:
            db = dx.reshape(-1, dx.shape[-1]).sum(0, dtype=db.dtype)  # (interleaved: sum in the caller's layout)
        return dx, [(db.to(bias_op.bias.dtype),), ()], [(), ()]

    @staticmethod
    def fuse_backward_ops(ops: list, *, recipe=None, **unused) -> list:
        """Replaces each Bias directly followed by an activation op with the fused op."""
        out, i = [], 0
        while i < len(ops):
            op = ops[i]
            nxt = ops[i + 1] if i + 1 < len(ops) else None
            if isinstance(op, Bias) and isinstance(nxt, _ActivationOperation):
                out.append(BackwardActivationBias(bias=op, activation=nxt))
                i += 2
            else:
                out.append(op)
                i += 1
        return out
