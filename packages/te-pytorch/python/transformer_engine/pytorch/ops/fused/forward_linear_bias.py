"""ForwardLinearBiasActivation: BasicLinear + Bias in one GEMM (the bias
added in the GEMM's epilogue), a forward-only fusion.

(The reference's name: it may also take an activation; te-core's GEMMs have
no activation epilogue, so here the pair is fused and a following activation
runs as its own op.) Each basic op's context gets what its unfused backward
reads: the linear's saved operands; the bias needs none.
"""

from __future__ import annotations

from ..basic import BasicLinear, Bias
from ..op import FusedOperation


class ForwardLinearBiasActivation(FusedOperation):
    """y = x W^T + b in one GEMM (activation: None)."""

    def __init__(self, *, linear: BasicLinear, bias: Bias, activation=None) -> None:
        if activation is not None:
            raise NotImplementedError(
                "ForwardLinearBiasActivation with an activation is not yet supported (no GEMM activation epilogue)"
            )
        super().__init__((linear, bias))

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
        linear, bias_op = self.basic_ops
        linear_ctx, bias_ctx = basic_op_ctxs
        bias = bias_op.bias
        # The fused result must equal the unfused one: x W^T + b promotes to the
        # wider dtype when b's differs from the GEMM's output, so only a bias of
        # the compute dtype goes into the epilogue.
        out_dtype = linear.compute_dtype(input_)
        if bias.dtype == out_dtype:
            out = linear.linear_forward(linear_ctx, input_, bias=bias.detach())
        else:
            out = linear.linear_forward(linear_ctx, input_) + bias
        return out, [(), ()]

    @staticmethod
    def fuse_forward_ops(ops: list, *, recipe=None, **unused) -> list:
        """Replaces each BasicLinear directly followed by a Bias with the fused op."""
        out, i = [], 0
        while i < len(ops):
            op = ops[i]
            nxt = ops[i + 1] if i + 1 < len(ops) else None
            if isinstance(op, BasicLinear) and isinstance(nxt, Bias) and not op.is_fused_op:
                out.append(ForwardLinearBiasActivation(linear=op, bias=nxt))
                i += 2
            else:
                out.append(op)
                i += 1
        return out
