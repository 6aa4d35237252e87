r"""L2Normalization: :math:`y = x / \sqrt{\sum_i x_i^2 + \varepsilon}` over the last dim
(parameter-free; e.g. query-key normalization in attention).

te-core has no kernel for it; like the reference (torch-scripted functions),
it is torch arithmetic, here computed in FP32 and rounded once to the input's
dtype. Backward: dx = r dy - r^3 x (x . dy), r = 1 / sqrt(sum x^2 + eps).
"""

from __future__ import annotations

import torch

from .._common import maybe_dequantize
from ..op import BasicOperation


class L2Normalization(BasicOperation):
    """L2-normalizes each vector along the last dimension.

    Args:
        eps: float, default = 1e-6. Added to the sum of squares for numerical stability
        seq_length, micro_batch_size: int, optional. The reference's JIT warm-up sizes (accepted; there is no JIT to
            warm up here)
    """

    def __init__(self, *, eps: float = 1e-6, seq_length=None, micro_batch_size=None) -> None:
        super().__init__()
        self.eps = eps

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        x = maybe_dequantize(input_)
        xf = x.float()
        rsqrt_norm = torch.rsqrt(xf.square().sum(-1, keepdim=True) + self.eps)
        if ctx.requires_grad:
            ctx.save_for_backward(x, rsqrt_norm)
        return (xf * rsqrt_norm).to(x.dtype)

    def op_backward(self, ctx, grad_output):
        x, r = ctx.saved_tensors
        xf = x.float()
        dy = maybe_dequantize(grad_output).float()
        dx = r * dy - r.pow(3) * xf * (xf * dy).sum(-1, keepdim=True)
        return dx.to(x.dtype), ()
