"""te.LayerNorm and te.RMSNorm over te-core's normalization kernels.

    LayerNorm: y = (x - E[x]) / sqrt(Var[x] + eps) * g + b
    RMSNorm:   y = x / sqrt(mean(x^2) + eps) * g
g = weight, or 1 + weight with zero_centered_gamma (then weight starts at 0).
Statistics are computed in FP32 over the trailing `normalized_shape` dims;
mu and 1/sigma are saved for the backward pass instead of the normalized
output.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch

from .. import kernels
from ._args import check_bool, check_module_args, check_tensor
from .base import resolve_device


def norm_kernel_fwd(x, gamma, beta, eps, zero_centered_gamma=False, **kw):
    """kernels.layernorm_fwd, or kernels.rmsnorm_fwd where beta is None (the
    modules' RMSNorm has no bias): (y, mu | None, rsigma, scale_inv | None)."""
    if beta is None:
        return kernels.rmsnorm_fwd(x, gamma, eps, zero_centered_gamma, **kw)
    return kernels.layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma, **kw)


def norm_kernel_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma, dbeta | None): kernels.layernorm_bwd, or kernels.rmsnorm_bwd where mu is None."""
    if mu is None:
        return (*kernels.rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma), None)
    return kernels.layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)


def norm_forward(ctx, inp, weight, bias, eps, zero_centered_gamma, hidden, amax=None):
    """The high-precision norm of an autograd forward, saving what backward needs.
    amax: FP32 [1] max-accumulating max|y| of the stored y (current scaling's fused amax), or None."""
    x = inp.reshape(-1, hidden)
    gamma = weight.reshape(hidden)
    beta = None if bias is None else bias.reshape(hidden)
    y, mu, rsigma, _ = norm_kernel_fwd(x, gamma, beta, eps, zero_centered_gamma, amax=amax)
    ctx.save_for_backward(x, mu, rsigma, gamma)
    ctx.zero_centered_gamma = zero_centered_gamma
    ctx.shapes = (inp.shape, weight.shape)
    return y.view(inp.shape)


def norm_backward(ctx, dy):
    """(dx, dgamma, dbeta | None) of a norm_forward."""
    x, mu, rsigma, gamma = ctx.saved_tensors
    inp_shape, weight_shape = ctx.shapes
    dz = dy.reshape(x.shape).to(x.dtype)
    dx, dgamma, dbeta = norm_kernel_bwd(dz, x, mu, rsigma, gamma, ctx.zero_centered_gamma)
    dbeta = None if dbeta is None else dbeta.view(weight_shape)
    return dx.view(inp_shape), dgamma.view(weight_shape), dbeta


class _NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, weight, bias, eps, zero_centered_gamma, hidden):
        return norm_forward(ctx, inp, weight, bias, eps, zero_centered_gamma, hidden)

    @staticmethod
    def backward(ctx, dy):
        return (*norm_backward(ctx, dy), None, None, None)


class _Normalization(torch.nn.Module):
    """Shared constructor of LayerNorm and RMSNorm (the reference's signature:
    (normalized_shape=None, eps=1e-5, sequence_parallel=None, params_dtype=None,
    zero_centered_gamma=False, hidden_size=None, **kwargs) with the te.ops
    keywords device=None, dtype=None, sm_margin=0)."""

    _has_bias = True

    def __init__(
        self,
        normalized_shape=None,
        eps: float = 1e-5,
        sequence_parallel=None,
        params_dtype=None,
        zero_centered_gamma: bool = False,
        hidden_size=None,
        *,
        device=None,
        dtype=None,
        sm_margin: int = 0,
    ) -> None:
        super().__init__()
        if hidden_size is not None:
            warnings.warn("hidden_size is deprecated; use normalized_shape", DeprecationWarning, stacklevel=3)
            normalized_shape = hidden_size if normalized_shape is None else normalized_shape
        if params_dtype is not None:
            warnings.warn("params_dtype is deprecated; use dtype", DeprecationWarning, stacklevel=3)
            dtype = params_dtype if dtype is None else dtype
        if normalized_shape is None:
            raise TypeError(f"{type(self).__name__}: normalized_shape is required")
        owner = f"te.{type(self).__name__}"
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        if not isinstance(normalized_shape, (tuple, list, torch.Size)) or not normalized_shape:
            raise TypeError(
                f"{owner}: normalized_shape must be an int > 0 or a non-empty tuple of them, got {normalized_shape!r}"
            )
        dims = {f"normalized_shape[{i}]": d for i, d in enumerate(normalized_shape)}
        dtype = check_module_args(
            owner,
            sizes=dims,
            flags={"zero_centered_gamma": zero_centered_gamma},
            eps=eps,
            params_dtype=dtype,
            dtype_name="dtype" if params_dtype is None else "params_dtype",
        )
        check_bool(owner, "sequence_parallel", sequence_parallel, allow_none=True)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        self.eps = float(eps)
        self.zero_centered_gamma = zero_centered_gamma
        self.sequence_parallel = sequence_parallel
        self.sm_margin = sm_margin  # a CUDA occupancy hint of the reference; nothing to reserve here
        target = torch.device("meta") if device == "meta" else resolve_device(device, owner)
        self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=target, dtype=dtype))
        if self._has_bias:
            self.bias = torch.nn.Parameter(torch.empty(self.normalized_shape, device=target, dtype=dtype))
        for param in self.parameters():
            # Megatron-style frameworks all-reduce these gradients under sequence parallelism.
            param.sequence_parallel = bool(sequence_parallel)
        if target.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """weight = 1 (0 with zero_centered_gamma), bias = 0; meta parameters
        are materialized on the default device first."""
        if self.weight.device.type == "meta":
            device = resolve_device(None)
            for name, param in list(self.named_parameters(recurse=False)):
                new = torch.nn.Parameter(torch.empty_like(param, device=device))
                new.sequence_parallel = getattr(param, "sequence_parallel", False)
                setattr(self, name, new)
        with torch.no_grad():
            if self.zero_centered_gamma:
                self.weight.zero_()
            else:
                self.weight.fill_(1.0)
            if self._has_bias:
                self.bias.zero_()

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        check_tensor(type(self).__name__, "inp", inp)
        n = len(self.normalized_shape)
        if tuple(inp.shape[-n:]) != self.normalized_shape:
            raise ValueError(
                f"{type(self).__name__}: input shape {tuple(inp.shape)} does not end "
                f"with normalized_shape {self.normalized_shape}"
            )
        if inp.device != self.weight.device:
            raise ValueError(
                f"{type(self).__name__}: input is on {inp.device} but the weight is on {self.weight.device}"
            )
        if inp.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(
                f"{type(self).__name__}: input dtype {inp.dtype} is not supported; use float32, bfloat16 or float16"
            )
        hidden = math.prod(self.normalized_shape)
        bias = self.bias if self._has_bias else None
        return _NormFunction.apply(inp, self.weight, bias, self.eps, self.zero_centered_gamma, hidden)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"


class LayerNorm(_Normalization):
    """Layer normalization over the trailing normalized_shape dims (parameters
    `weight` and `bias`)."""

    _has_bias = True


class RMSNorm(_Normalization):
    """RMS normalization over the trailing normalized_shape dims (parameter `weight`)."""

    _has_bias = False
