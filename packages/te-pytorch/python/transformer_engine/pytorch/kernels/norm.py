"""Normalization ops: torch.ops.te.layernorm_fwd / rmsnorm_fwd / layernorm_bwd / rmsnorm_bwd.

te-core's formulas (core/include/te/norm.h; x viewed as [N, H], FP32 math):
    LayerNorm:  mu = mean(x),  rsigma = 1 / sqrt(var(x) + eps),  y = (x - mu) * rsigma * g + beta
    RMSNorm:    rsigma = 1 / sqrt(mean(x^2) + eps),            y = x * rsigma * g
g = gamma, or 1 + gamma with zero_centered_gamma. mu and rsigma (FP32, one per
row) are saved for the backward pass.

The forward can write FP8 directly (fp8_dtype >= 0): the quantization with
the delayed-scaling `scale` is fused into the norm, `amax` is max-accumulated
in place and the op returns scale_inv. (Current scaling needs the amax of the
whole output first, so it is the norm to high precision, with `amax` given,
followed by compute_scale_from_amax and quantize_fp8 with that scale: a
high-precision y max-accumulates into `amax` the amax of y as stored, what a
separate amax pass would compute.) Outputs not produced (mu of RMSNorm,
scale_inv of a high-precision y) are empty tensors inside the ops and None
from the public wrappers.
"""

from __future__ import annotations

import torch

from transformer_engine.core import lib

from ._common import FLOAT32, compiling, contiguous, desc, hp_desc, stream_of, workspace
from .cast import _check_fp8


def _norm_fwd(x, gamma, beta, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax):
    x, gamma = contiguous(x), contiguous(gamma)
    rows = x.shape[:-1]
    rsigma = torch.empty(rows, dtype=torch.float32, device=x.device)
    mu = None if beta is None else torch.empty(rows, dtype=torch.float32, device=x.device)
    if fp8_dtype >= 0:
        _check_fp8(fp8_dtype)
        if scale is None:
            raise ValueError("argument 'scale' is required for an FP8 output (delayed scaling)")
        y = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
        y_desc = desc(y, fp8_dtype)
        scale_inv = torch.empty((1,), dtype=torch.float32, device=x.device)
        fp8_descs = (desc(scale, FLOAT32), desc(scale_inv, FLOAT32), None if amax is None else desc(amax, FLOAT32))
    else:
        y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
        y_desc = hp_desc(y, "out_dtype")
        scale_inv = None
        fp8_descs = (None, None, None if amax is None else desc(amax, FLOAT32))
    stream = stream_of(x)
    if beta is None:
        lib.rmsnorm_fwd(
            hp_desc(x, "x"),
            hp_desc(gamma, "gamma"),
            eps,
            zero_centered_gamma,
            y_desc,
            *fp8_descs,
            desc(rsigma, FLOAT32),
            stream,
        )
    else:
        lib.layernorm_fwd(
            hp_desc(x, "x"),
            hp_desc(gamma, "gamma"),
            hp_desc(contiguous(beta), "beta"),
            eps,
            zero_centered_gamma,
            y_desc,
            *fp8_descs,
            desc(mu, FLOAT32),
            desc(rsigma, FLOAT32),
            stream,
        )
    return y, mu, rsigma, scale_inv


def _fake_fwd(x, out_dtype, fp8_dtype, layernorm: bool):
    rows = x.shape[:-1]
    y = x.new_empty(x.shape, dtype=torch.uint8 if fp8_dtype >= 0 else out_dtype)
    mu = x.new_empty(rows if layernorm else (0,), dtype=torch.float32)
    rsigma = x.new_empty(rows, dtype=torch.float32)
    scale_inv = x.new_empty((1,) if fp8_dtype >= 0 else (0,), dtype=torch.float32)
    return y, mu, rsigma, scale_inv


def _op_outputs(result, x):
    y, mu, rsigma, scale_inv = result
    # Ops cannot return None, nor one tensor twice: separate empty placeholders.
    if mu is None:
        mu = x.new_empty((0,), dtype=torch.float32)
    if scale_inv is None:
        scale_inv = x.new_empty((0,), dtype=torch.float32)
    return y, mu, rsigma, scale_inv


@torch.library.custom_op("te::layernorm_fwd", mutates_args=("amax",))
def _layernorm_fwd_op(
    x: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    zero_centered_gamma: bool,
    out_dtype: torch.dtype,
    fp8_dtype: int,
    scale: torch.Tensor | None,
    amax: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _op_outputs(_norm_fwd(x, gamma, beta, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax), x)


@_layernorm_fwd_op.register_fake
def _(x, gamma, beta, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax):
    return _fake_fwd(x, out_dtype, fp8_dtype, True)


@torch.library.custom_op("te::rmsnorm_fwd", mutates_args=("amax",))
def _rmsnorm_fwd_op(
    x: torch.Tensor,
    gamma: torch.Tensor,
    eps: float,
    zero_centered_gamma: bool,
    out_dtype: torch.dtype,
    fp8_dtype: int,
    scale: torch.Tensor | None,
    amax: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _op_outputs(_norm_fwd(x, gamma, None, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax), x)


@_rmsnorm_fwd_op.register_fake
def _(x, gamma, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax):
    return _fake_fwd(x, out_dtype, fp8_dtype, False)


def norm_fwd(
    x,
    gamma,
    beta,
    eps: float,
    zero_centered_gamma: bool = False,
    *,
    out_dtype=None,
    fp8_dtype: int = -1,
    scale=None,
    amax=None,
):
    """LayerNorm (beta given) or RMSNorm (beta None) over the last dim of x.

    Returns (y, mu | None, rsigma, scale_inv | None). y has out_dtype (default
    x's), or is uint8 FP8 bytes when fp8_dtype >= 0 (then `scale` is required).
    `amax`, if given (FP32, one element), is max-accumulated in place: with max|y_fp32|
    for an FP8 y, with max|y| of the stored y for a high-precision one.
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    eps = float(eps)
    if compiling():
        if beta is None:
            y, _, rsigma, scale_inv = torch.ops.te.rmsnorm_fwd(
                x, gamma, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax
            )
            mu = None
        else:
            y, mu, rsigma, scale_inv = torch.ops.te.layernorm_fwd(
                x, gamma, beta, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax
            )
        return y, mu, rsigma, (scale_inv if fp8_dtype >= 0 else None)
    return _norm_fwd(x, gamma, beta, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax)


def _norm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma):
    dz, x, gamma = contiguous(dz), contiguous(x), contiguous(gamma)
    dx = torch.empty_like(x)
    dgamma = torch.empty_like(gamma)
    dbeta = None if mu is None else torch.empty_like(gamma)
    x_desc = hp_desc(x, "x")
    stream = stream_of(x)
    ws = None
    if x.is_cuda:
        size = lib.rmsnorm_bwd_workspace_size if mu is None else lib.layernorm_bwd_workspace_size
        ws = workspace(size(x_desc), x, stream)
    common = (hp_desc(dz, "dz"), x_desc)
    if mu is None:
        lib.rmsnorm_bwd(
            *common,
            desc(contiguous(rsigma), FLOAT32),
            hp_desc(gamma, "gamma"),
            zero_centered_gamma,
            hp_desc(dx, "dx"),
            hp_desc(dgamma, "dgamma"),
            ws,
            stream,
        )
    else:
        lib.layernorm_bwd(
            *common,
            desc(contiguous(mu), FLOAT32),
            desc(contiguous(rsigma), FLOAT32),
            hp_desc(gamma, "gamma"),
            zero_centered_gamma,
            hp_desc(dx, "dx"),
            hp_desc(dgamma, "dgamma"),
            hp_desc(dbeta, "dbeta"),
            ws,
            stream,
        )
    return dx, dgamma, dbeta


@torch.library.custom_op("te::layernorm_bwd", mutates_args=())
def _layernorm_bwd_op(
    dz: torch.Tensor,
    x: torch.Tensor,
    mu: torch.Tensor,
    rsigma: torch.Tensor,
    gamma: torch.Tensor,
    zero_centered_gamma: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _norm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)


@_layernorm_bwd_op.register_fake
def _(dz, x, mu, rsigma, gamma, zero_centered_gamma):
    return torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(gamma)


@torch.library.custom_op("te::rmsnorm_bwd", mutates_args=())
def _rmsnorm_bwd_op(
    dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor, zero_centered_gamma: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dgamma, _ = _norm_bwd(dz, x, None, rsigma, gamma, zero_centered_gamma)
    return dx, dgamma


@_rmsnorm_bwd_op.register_fake
def _(dz, x, rsigma, gamma, zero_centered_gamma):
    return torch.empty_like(x), torch.empty_like(gamma)


def norm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma: bool = False):
    """(dx, dgamma, dbeta | None): LayerNorm backward when mu is given, else RMSNorm."""
    if compiling():
        if mu is None:
            dx, dgamma = torch.ops.te.rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma)
            return dx, dgamma, None
        return torch.ops.te.layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)
    return _norm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)
