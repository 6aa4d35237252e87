r"""LayerNorm and RMSNorm operations over te-core's norm kernels (the ones
te.LayerNorm / te.RMSNorm run, module/normalization.py):

    LayerNorm: y = (x - E[x]) / sqrt(Var[x] + eps) * g + b
    RMSNorm:   y = x / sqrt(mean(x^2) + eps) * g

over the trailing normalized_shape dims, g = weight (1 + weight with
zero_centered_gamma). The op computes in torch.autocast's dtype, else its
parameters' dtype (the input is cast to it); statistics in FP32.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable

import torch

from ...module._args import check_eps
from ...module.normalization import norm_kernel_bwd, norm_kernel_fwd
from .._common import canonicalize_device, canonicalize_dtype, compute_dtype, maybe_dequantize
from ..op import BasicOperation

__all__ = ["LayerNorm", "RMSNorm"]

_STAGES = (("forward", "NVTE_FWD_LAYERNORM_SM_MARGIN"), ("backward", "NVTE_BWD_LAYERNORM_SM_MARGIN"))
_STAGES += (("inference", "NVTE_INF_LAYERNORM_SM_MARGIN"),)


def _sm_margins(sm_margin) -> dict[str, int]:
    """The reference's SM margins per stage (a CUDA occupancy hint; kept for
    compatibility, the kernels here reserve no SMs)."""
    if isinstance(sm_margin, dict):
        return {stage: int(sm_margin.get(stage, os.getenv(env, "0"))) for stage, env in _STAGES}
    return {stage: int(os.getenv(env, str(sm_margin))) for stage, env in _STAGES}


class _NormOperation(BasicOperation):
    """Shared body of LayerNorm (with `bias`) and RMSNorm (weight only)."""

    _has_bias = True

    def __init__(
        self,
        normalized_shape,
        *,
        eps: float = 1e-5,
        device=None,
        dtype=None,
        zero_centered_gamma: bool = False,
        sm_margin=0,
    ) -> None:
        super().__init__()
        owner = f"te.ops.{type(self).__name__}"
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        if not isinstance(normalized_shape, Iterable):
            raise TypeError(f"{owner}: normalized_shape must be an int or an iterable of ints")
        shape = tuple(int(d) for d in normalized_shape)
        self.eps = check_eps(owner, eps)
        self.zero_centered_gamma = zero_centered_gamma
        self._sm_margins = _sm_margins(sm_margin)
        device = canonicalize_device(device, owner)
        dtype = canonicalize_dtype(dtype, owner)
        self.weight = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        if self._has_bias:
            self.bias = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        if device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """weight = 1 (0 with zero_centered_gamma), bias = 0; meta parameters
        are first materialized on the default device."""
        for name, param in list(self.named_parameters(recurse=False)):
            if param.device.type == "meta":
                device = canonicalize_device(None, f"te.ops.{type(self).__name__}")
                setattr(self, name, torch.nn.Parameter(torch.empty_like(param, device=device)))
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self._has_bias:
                self.bias.zero_()

    def pre_first_fuser_forward(self) -> None:
        if any(p.device.type == "meta" for p in self.parameters()):
            self.reset_parameters()

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        weight = self.weight
        dims = tuple(weight.shape)
        if input_.dim() < len(dims) or tuple(input_.shape[-len(dims) :]) != dims:
            raise ValueError(
                f"Input tensor (shape={tuple(input_.shape)}) and weight tensor (shape={dims}) are not compatible"
            )
        hidden = math.prod(dims)
        dtype = compute_dtype(input_, weight.dtype)
        x = maybe_dequantize(input_, dtype).reshape(-1, hidden)
        gamma = weight.to(dtype).view(hidden)
        beta = self.bias.to(dtype).view(hidden) if self._has_bias else None
        y, mu, rsigma, _ = norm_kernel_fwd(x, gamma, beta, self.eps, self.zero_centered_gamma)
        if ctx.requires_grad:
            ctx.save_for_backward(x, mu, rsigma, gamma)
        return y.view(input_.shape)

    def op_backward(self, ctx, grad_output):
        x, mu, rsigma, gamma = ctx.saved_tensors
        dy = maybe_dequantize(grad_output, x.dtype).reshape(x.shape)
        dx, dgamma, dbeta = norm_kernel_bwd(dy, x, mu, rsigma, gamma, self.zero_centered_gamma)
        weight = self.weight
        grads = [dgamma.view(weight.shape).to(weight.dtype)]
        if self._has_bias:
            grads.append(dbeta.view(weight.shape).to(self.bias.dtype))
        return dx.view(grad_output.shape), grads


class LayerNorm(_NormOperation):
    r"""Layer normalization, :math:`y = \frac{x - E[x]}{\sqrt{Var[x] + \varepsilon}} \gamma + \beta`,
    over the trailing ``normalized_shape`` dims (parameters ``weight`` and ``bias``).

    Args:
        normalized_shape: int or iterable of int.
        eps: float, default = 1e-5.
        device: torch.device, default = default CUDA device (the CPU without CUDA).
        dtype: torch.dtype, default = torch's default dtype.
        zero_centered_gamma: bool, default = False. :math:`\gamma` = 1 + weight (weight initialized to 0)
        sm_margin: int or dict, default = 0. SMs to leave free per stage (accepted; the kernels here reserve none)
    """


class RMSNorm(_NormOperation):
    r"""RMS normalization, :math:`y = \frac{x}{\sqrt{mean(x^2) + \varepsilon}} \gamma`,
    over the trailing ``normalized_shape`` dims (parameter ``weight``).

    Args:
        normalized_shape, eps, device, dtype, zero_centered_gamma, sm_margin: As in LayerNorm.
    """

    _has_bias = False
