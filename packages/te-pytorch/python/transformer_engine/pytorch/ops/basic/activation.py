r"""Activation operations over te-core's activation kernels (kernels/activation.py,
the ones LayerNormMLP runs).

Plain kinds act elementwise; gated kinds split the last dimension into halves
:math:`a` (gated, the first half) and :math:`b` (linear, the second half) and
return :math:`f(a) * b` -- the opposite of torch.nn.functional.glu, which
gates the second half. Values are computed in FP32 and rounded once to the
compute dtype (torch.autocast's, else the input's).

cache_quantized_input=True keeps the input for backward as per-tensor FP8
(E4M3, current scaling) instead of in high precision: less memory, the
backward then differentiates at the dequantized values.
"""

from __future__ import annotations

import torch

from ... import kernels
from ...tensor import Float8CurrentScalingQuantizer
from .._common import compute_dtype, maybe_dequantize
from ..op import BasicOperation

__all__ = ["GEGLU", "GELU", "GLU", "QGEGLU", "QGELU", "ReGLU", "ReLU", "SReGLU", "SReLU", "SiLU"]


def _cache_quantized(x: torch.Tensor) -> torch.Tensor:
    """x as E4M3 per-tensor FP8 with its own scale (rowwise bytes only)."""
    from transformer_engine.core import DType

    quantizer = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, x.device, rowwise=True, columnwise=False)
    return quantizer(x)


class _ActivationOperation(BasicOperation):
    """One te-core activation kind (`_kind`, a name of transformer_engine.core.activation.ACTIVATIONS).

    Args:
        cache_quantized_input: bool, default = False. Keep the input for backward quantized to FP8 (see the module
            docstring).
    """

    _kind: str = ""

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__()
        self.cache_quantized_input = cache_quantized_input

    def _params(self) -> dict:
        """The kernel's parameters (clamped_swiglu's limit / alpha / glu_linear_offset)."""
        return {}

    # Layout hooks: gated ops with glu_interleave_size reorder the last dim (swiglu.py).
    def _to_kernel_layout(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _from_kernel_layout(self, dx: torch.Tensor) -> torch.Tensor:
        return dx

    def activation_forward(self, x: torch.Tensor) -> torch.Tensor:
        """f(x) of a tensor in the kernel's layout, in x's dtype."""
        return kernels.activation_fwd(x, self._kind, **self._params())[0]

    def activation_backward(self, dy: torch.Tensor, x: torch.Tensor, dbias: bool = False):
        """(dL/dx, the FP32 column sums of dL/dx or None) for x in the kernel's layout."""
        row, _, _, bias_grad = kernels.activation_bwd(dy, x, self._kind, dbias=dbias, **self._params())
        return row, bias_grad

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        dtype = compute_dtype(input_, input_.dtype)
        x = self._to_kernel_layout(maybe_dequantize(input_, dtype).contiguous())
        out = self.activation_forward(x)
        if ctx.requires_grad:
            ctx.save_for_backward(_cache_quantized(x) if self.cache_quantized_input else x)
            ctx.dtype = dtype
        return out

    def saved_input(self, ctx) -> torch.Tensor:
        """The forward's input (kernel layout, compute dtype), dequantized when it was cached in FP8."""
        (x,) = ctx.saved_tensors
        return maybe_dequantize(x, ctx.dtype).contiguous()

    def op_backward(self, ctx, grad_output):
        x = self.saved_input(ctx)
        dy = maybe_dequantize(grad_output, ctx.dtype).contiguous()
        dx, _ = self.activation_backward(dy, x)
        return self._from_kernel_layout(dx), ()


class GELU(_ActivationOperation):
    r"""Gaussian Error Linear Unit, tanh approximation:
    :math:`\frac{x}{2}(1 + \tanh(\sqrt{2/\pi}(x + 0.044715 x^3)))`."""

    _kind = "gelu"


class GEGLU(_ActivationOperation):
    r"""GELU-gated linear unit: :math:`\text{GELU}(a) * b` (halves of the last dim)."""

    _kind = "geglu"


class QGELU(_ActivationOperation):
    r"""Quick GELU: :math:`x \sigma(1.702 x)`."""

    _kind = "qgelu"


class QGEGLU(_ActivationOperation):
    r"""Quick-GELU-gated linear unit: :math:`\text{QGELU}(a) * b`."""

    _kind = "qgeglu"


class ReLU(_ActivationOperation):
    r"""Rectified linear unit: :math:`\max(x, 0)`."""

    _kind = "relu"


class ReGLU(_ActivationOperation):
    r"""ReLU-gated linear unit: :math:`\max(a, 0) * b`."""

    _kind = "reglu"


class SReLU(_ActivationOperation):
    r"""Squared ReLU: :math:`\max(x, 0)^2`."""

    _kind = "srelu"


class SReGLU(_ActivationOperation):
    r"""Squared-ReLU-gated linear unit: :math:`\max(a, 0)^2 * b`."""

    _kind = "sreglu"


class SiLU(_ActivationOperation):
    r"""Sigmoid linear unit (swish): :math:`x \sigma(x)`."""

    _kind = "silu"


class GLU(_ActivationOperation):
    r"""Gated linear unit: :math:`\sigma(a) * b`."""

    _kind = "glu"
