"""Normalization ops: layernorm_fwd / rmsnorm_fwd / layernorm_bwd / rmsnorm_bwd (torch.ops.te.*).

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
scale_inv of a high-precision y) are None (placeholders inside the ops, see
_common.te_op).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_engine.core import lib

from ._common import FLOAT32, contiguous, desc, hp_desc, signature_without, stream_of, te_op, workspace
from .cast import _check_fp8

_Forward = tuple[Tensor, Tensor | None, Tensor, Tensor | None]


def _fwd_shapes(a):
    rows = a.x.shape[:-1]
    fp8 = a.fp8_dtype >= 0
    y = (a.x.shape, torch.uint8 if fp8 else (a.x.dtype if a.out_dtype is None else a.out_dtype))
    mu = (rows, torch.float32) if getattr(a, "beta", None) is not None else None
    return y, mu, (rows, torch.float32), ((1,), torch.float32) if fp8 else None


@te_op("layernorm_fwd", mutates_args=("amax",), shapes=_fwd_shapes)
def layernorm_fwd(
    x: Tensor,
    gamma: Tensor,
    beta: Tensor,
    eps: float,
    zero_centered_gamma: bool = False,
    *,
    out_dtype: torch.dtype | None = None,
    fp8_dtype: int = -1,
    scale: Tensor | None = None,
    amax: Tensor | None = None,
) -> _Forward:
    """LayerNorm over the last dim of x: (y, mu, rsigma, scale_inv | None).

    y has out_dtype (default x's), or is uint8 FP8 bytes when fp8_dtype >= 0
    (then `scale` is required and scale_inv is returned). `amax`, if given
    (FP32, one element), is max-accumulated in place: with max|y_fp32| for an
    FP8 y, with max|y| of the stored y for a high-precision one.
    """
    x, gamma = contiguous(x), contiguous(gamma)
    out_dtype = x.dtype if out_dtype is None else out_dtype
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


@te_op(
    "rmsnorm_fwd",
    mutates_args=("amax",),
    shapes=_fwd_shapes,
    signature=signature_without(layernorm_fwd, "beta"),
)
def rmsnorm_fwd(x, gamma, eps, zero_centered_gamma=False, **kwargs):
    """RMSNorm over the last dim of x: (y, None, rsigma, scale_inv | None); the
    arguments are layernorm_fwd's but beta (RMSNorm has no beta and no mu)."""
    return layernorm_fwd.__wrapped__(x, gamma, None, eps, zero_centered_gamma, **kwargs)


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
        return dx, dgamma
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


def _bwd_shapes(a):
    weight = (a.gamma.shape, a.gamma.dtype)
    return ((a.x.shape, a.x.dtype), weight, weight)[: 3 if hasattr(a, "mu") else 2]


@te_op("layernorm_bwd", shapes=_bwd_shapes)
def layernorm_bwd(
    dz: Tensor, x: Tensor, mu: Tensor, rsigma: Tensor, gamma: Tensor, zero_centered_gamma: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dgamma, dbeta) of LayerNorm from the forward's mu and rsigma."""
    return _norm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)


@te_op("rmsnorm_bwd", shapes=_bwd_shapes)
def rmsnorm_bwd(
    dz: Tensor, x: Tensor, rsigma: Tensor, gamma: Tensor, zero_centered_gamma: bool = False
) -> tuple[Tensor, Tensor]:
    """(dx, dgamma) of RMSNorm from the forward's rsigma."""
    return _norm_bwd(dz, x, None, rsigma, gamma, zero_centered_gamma)
