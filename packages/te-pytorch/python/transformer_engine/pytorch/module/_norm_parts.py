"""The normalization half of LayerNormLinear and LayerNormMLP.

Both modules own `layer_norm_weight` (and `layer_norm_bias` for LayerNorm) of
shape [hidden]; the formulas are te.LayerNorm's / te.RMSNorm's (normalization.py):
    LayerNorm: y = (x - E[x]) / sqrt(Var[x] + eps) * g + b
    RMSNorm:   y = x / sqrt(mean(x^2) + eps) * g
with g = 1 + layer_norm_weight under zero_centered_gamma.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..tensor import Float8Tensor
from .normalization import _NormFunction, norm_backward, norm_forward, norm_kernel_fwd

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_normalization(owner: str, normalization: str) -> bool:
    """True when the normalization has a bias (LayerNorm)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{owner}: normalization must be 'LayerNorm' or 'RMSNorm', got {normalization!r}")
    return normalization == "LayerNorm"


def allocate_norm_params(module: torch.nn.Module, hidden: int, has_bias: bool, device, dtype) -> None:
    """Registers layer_norm_weight (and layer_norm_bias) as uninitialized parameters."""
    for name in ("layer_norm_weight", "layer_norm_bias") if has_bias else ("layer_norm_weight",):
        param = torch.nn.Parameter(torch.empty(hidden, device=device, dtype=dtype))
        param.sequence_parallel = False  # (read by Megatron-style frameworks)
        module.register_parameter(name, param)
    if not has_bias:
        module.register_parameter("layer_norm_bias", None)


def reset_norm_params(module: torch.nn.Module, zero_centered_gamma: bool) -> None:
    """g = 1 (weight 0 under zero_centered_gamma), bias 0."""
    with torch.no_grad():
        module.layer_norm_weight.fill_(0.0 if zero_centered_gamma else 1.0)
        if module.layer_norm_bias is not None:
            module.layer_norm_bias.zero_()


class NormFP8Function(_NormFunction):
    """The norm writing FP8 directly (delayed scaling: the quantization is
    fused into the norm kernel with the quantizer's scale and amax).

    Returns a Float8Tensor whose rowwise bytes feed the fprop GEMM and whose
    transpose (made when `columnwise`) is what the wgrad GEMM reads. The
    backward is the norm's: the gradient arrives in high precision.
    """

    @staticmethod
    def forward(ctx, inp, weight, bias, eps, zero_centered_gamma, hidden, quantizer, columnwise):
        x = inp.reshape(-1, hidden)
        code = int(quantizer.dtype)
        y, mu, rsigma, scale_inv = norm_kernel_fwd(
            x, weight, bias, eps, zero_centered_gamma, fp8_dtype=code, scale=quantizer.scale, amax=quantizer.amax
        )
        ctx.save_for_backward(x, mu, rsigma, weight)
        ctx.zero_centered_gamma = zero_centered_gamma
        ctx.shapes = (inp.shape, weight.shape)
        transpose = kernels.transpose(y) if columnwise else None
        return Float8Tensor(inp.shape, inp.dtype, y.view(inp.shape), scale_inv, code, data_transpose=transpose)

    @staticmethod
    def backward(ctx, dy):
        return (*_NormFunction.backward(ctx, dy), None, None)


class NormAmaxFunction(torch.autograd.Function):
    """The norm in high precision, max-accumulating max|y| of the stored y into
    `amax` (current scaling: the input quantizer's fused amax, see
    _operand.fused_amax), so quantizing y needs no separate amax pass."""

    @staticmethod
    def forward(ctx, inp, weight, bias, eps, zero_centered_gamma, hidden, amax):
        return norm_forward(ctx, inp, weight, bias, eps, zero_centered_gamma, hidden, amax)

    @staticmethod
    def backward(ctx, dy):
        return (*norm_backward(ctx, dy), None, None, None, None)
