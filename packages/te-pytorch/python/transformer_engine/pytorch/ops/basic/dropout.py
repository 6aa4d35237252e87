"""Dropout: in training, zero entries with probability p and scale the rest by 1/(1-p)."""

from __future__ import annotations

import torch

from .._common import compute_dtype, maybe_dequantize
from ..op import BasicOperation


class Dropout(BasicOperation):
    """Randomly zeroes entries with probability ``p`` during training (the
    others are scaled by 1/(1-p)); the identity in eval mode. The mask is
    drawn from torch's generator of the input's device."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"te.ops.Dropout: p must be in [0, 1], got {p!r}")
        self.dropout_probability = p

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        p = self.dropout_probability
        ctx.scaled_mask = None
        if not self.training or p == 0.0:
            return input_
        x = maybe_dequantize(input_, compute_dtype(input_, input_.dtype))
        if p == 1.0:
            mask = torch.zeros_like(x)
        else:
            mask = torch.empty_like(x).bernoulli_(1.0 - p).mul_(1.0 / (1.0 - p))
        if ctx.requires_grad:
            ctx.save_for_backward(mask)
            ctx.scaled_mask = True
        return x * mask

    def op_backward(self, ctx, grad_output):
        if ctx.scaled_mask is None:
            return grad_output, ()
        (mask,) = ctx.saved_tensors
        return maybe_dequantize(grad_output, mask.dtype) * mask, ()
