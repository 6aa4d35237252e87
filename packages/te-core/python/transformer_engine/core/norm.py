"""LayerNorm and RMSNorm on NumPy arrays (the core's CPU backend).

Formulas (see core/include/te/norm.h; x viewed as [N, H], FP32 arithmetic):
    LayerNorm:  mu = mean(x),  rsigma = 1 / sqrt(mean((x - mu)^2) + eps),
                y = (x - mu) * rsigma * g + beta
    RMSNorm:    rsigma = 1 / sqrt(mean(x^2) + eps),  y = x * rsigma * g
with g = gamma, or 1 + gamma when zero_centered_gamma.

FP8 outputs: with a `scale` the quantization is fused into the norm (delayed
scaling: amax accumulates, scale_inv = 1/scale). Without one it is current
scaling, which needs the amax of the whole output first, so it runs in two
steps: the norm to FP32, then `quantize_fp8_current_scaling` of that FP32 y.
Both quantize the unrounded FP32 y.

High-precision outputs: an `amax` given is max-accumulated with the amax of y
as stored (the rounded values), returned in NormForward.amax; current scaling
can derive its scale from it without another pass over y.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._arrays import as_high_precision, desc, empty, fp32_scalar
from ._checks import contiguous, flag, real
from ._compat import renamed_keyword
from ._native import lib
from .cast import quantize_fp8_current_scaling
from .dtypes import FP8_DTYPES, DType, te_dtype


class NormForward(NamedTuple):
    """Result of a forward norm. mu and rsigma have x's shape without its last dim."""

    y: np.ndarray  # x's shape; FP8 outputs as ml_dtypes float8 arrays
    mu: np.ndarray | None  # FP32 (LayerNorm only)
    rsigma: np.ndarray  # FP32
    scale: np.ndarray | None = None  # FP8 y only: FP32 scalars
    scale_inv: np.ndarray | None = None
    amax: np.ndarray | None = None


def _out_code(x: np.ndarray, out_dtype) -> DType:
    return te_dtype(x.dtype if out_dtype is None else out_dtype)


def _forward(
    layernorm, x, gamma, beta, eps, zero_centered_gamma, out_dtype, scale, amax, force_pow_2_scales, amax_epsilon
) -> NormForward:
    x = as_high_precision(x, "x")
    gamma = as_high_precision(gamma, "gamma")
    code = _out_code(x, out_dtype)
    if code in FP8_DTYPES and scale is None:
        # Current scaling: norm to FP32, then amax -> scale -> quantize of that FP32 y.
        hp = _forward(layernorm, x, gamma, beta, eps, zero_centered_gamma, np.float32, None, None, False, 0.0)
        q = quantize_fp8_current_scaling(hp.y, code, force_pow_2_scales=force_pow_2_scales, amax_epsilon=amax_epsilon)
        return NormForward(q.rowwise, hp.mu, hp.rsigma, q.scale, q.scale_inv, q.amax)

    y = empty(x.shape, code)
    row_shape = x.shape[:-1]
    rsigma = np.empty(row_shape, np.float32)
    mu = np.empty(row_shape, np.float32) if layernorm else None
    fp8 = code in FP8_DTYPES
    scale_arr = fp32_scalar(scale, "scale") if fp8 else None
    scale_inv = np.zeros((), np.float32) if fp8 else None
    amax_arr = fp32_scalar(0.0 if amax is None else amax, "amax").copy() if fp8 or amax is not None else None
    opt = lambda a: None if a is None else desc(a)  # noqa: E731
    if layernorm:
        beta = as_high_precision(beta, "beta")
        lib.layernorm_fwd(
            desc(x),
            desc(gamma),
            desc(beta),
            real(eps, "eps"),
            flag(zero_centered_gamma, "zero_centered_gamma"),
            desc(y),
            opt(scale_arr),
            opt(scale_inv),
            opt(amax_arr),
            desc(mu),
            desc(rsigma),
        )
    else:
        lib.rmsnorm_fwd(
            desc(x),
            desc(gamma),
            real(eps, "eps"),
            flag(zero_centered_gamma, "zero_centered_gamma"),
            desc(y),
            opt(scale_arr),
            opt(scale_inv),
            opt(amax_arr),
            desc(rsigma),
        )
    return NormForward(y, mu, rsigma, scale_arr, scale_inv, amax_arr)


@renamed_keyword("force_pow2_scales", "force_pow_2_scales")
def layernorm_fwd(
    x,
    gamma,
    beta,
    eps=1e-5,
    *,
    zero_centered_gamma=False,
    out_dtype=None,
    scale=None,
    amax=None,
    force_pow_2_scales=False,
    amax_epsilon=0.0,
) -> NormForward:
    """LayerNorm over the last dim of x.

    out_dtype: None (x's type), float32/bfloat16/float16, or FP8 ("e4m3", "e5m2" or an
    ml_dtypes float8 type). For FP8, `scale` given means delayed scaling fused into the
    norm (`amax`, if given, is max-accumulated); no `scale` means current scaling
    (`force_pow_2_scales`, `amax_epsilon` as in quantize_fp8_current_scaling).
    A high-precision out_dtype with `amax` given returns amax = max(amax, max|y|) of
    the stored (rounded) y in `.amax`.
    """
    return _forward(
        True, x, gamma, beta, eps, zero_centered_gamma, out_dtype, scale, amax, force_pow_2_scales, amax_epsilon
    )


@renamed_keyword("force_pow2_scales", "force_pow_2_scales")
def rmsnorm_fwd(
    x,
    gamma,
    eps=1e-5,
    *,
    zero_centered_gamma=False,
    out_dtype=None,
    scale=None,
    amax=None,
    force_pow_2_scales=False,
    amax_epsilon=0.0,
) -> NormForward:
    """RMSNorm over the last dim of x (arguments as layernorm_fwd; mu is None)."""
    return _forward(
        False, x, gamma, None, eps, zero_centered_gamma, out_dtype, scale, amax, force_pow_2_scales, amax_epsilon
    )


def _row_stat(a, name: str) -> np.ndarray:
    """mu / rsigma as given (the core checks they are FP32 with one value per row)."""
    return contiguous(a, name)


def _workspace(size_query, x: np.ndarray):
    nbytes = size_query(desc(x))
    return desc(np.empty(nbytes, np.uint8)) if nbytes else None


def layernorm_bwd(dz, x, mu, rsigma, gamma, *, zero_centered_gamma=False):
    """(dx, dgamma, dbeta) of LayerNorm; dx has x's type, dgamma/dbeta gamma's type."""
    x = as_high_precision(x, "x")
    dz = as_high_precision(dz, "dz")
    gamma = as_high_precision(gamma, "gamma")
    mu, rsigma = _row_stat(mu, "mu"), _row_stat(rsigma, "rsigma")
    dx = np.empty(x.shape, x.dtype)
    dgamma = np.empty(gamma.shape, gamma.dtype)
    dbeta = np.empty(gamma.shape, gamma.dtype)
    lib.layernorm_bwd(
        desc(dz),
        desc(x),
        desc(mu),
        desc(rsigma),
        desc(gamma),
        flag(zero_centered_gamma, "zero_centered_gamma"),
        desc(dx),
        desc(dgamma),
        desc(dbeta),
        _workspace(lib.layernorm_bwd_workspace_size, x),
    )
    return dx, dgamma, dbeta


def rmsnorm_bwd(dz, x, rsigma, gamma, *, zero_centered_gamma=False):
    """(dx, dgamma) of RMSNorm; dx has x's type, dgamma gamma's type."""
    x = as_high_precision(x, "x")
    dz = as_high_precision(dz, "dz")
    gamma = as_high_precision(gamma, "gamma")
    rsigma = _row_stat(rsigma, "rsigma")
    dx = np.empty(x.shape, x.dtype)
    dgamma = np.empty(gamma.shape, gamma.dtype)
    lib.rmsnorm_bwd(
        desc(dz),
        desc(x),
        desc(rsigma),
        desc(gamma),
        flag(zero_centered_gamma, "zero_centered_gamma"),
        desc(dx),
        desc(dgamma),
        _workspace(lib.rmsnorm_bwd_workspace_size, x),
    )
    return dx, dgamma


__all__ = ["NormForward", "layernorm_bwd", "layernorm_fwd", "rmsnorm_bwd", "rmsnorm_fwd"]
