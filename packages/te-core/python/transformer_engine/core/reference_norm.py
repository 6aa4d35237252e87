"""Float64 oracle of LayerNorm / RMSNorm and the error bounds the core must meet.

The forward and the analytic backward are written from the formulas (docs/numerics.md,
"Normalization"), in float64, independent of the native code. The core computes in
FP32 with backend-specific summation orders, so it is compared against this oracle
within the bounds below: first-order rounding-error analyses of the FP32
algorithms of te/norm.h, doubled to cover the second-order terms.

Notation: u = 2^-24 (FP32 unit roundoff), gamma_k = k*u / (1 - k*u), H the normalized
(last) dimension, N the number of rows. A row sum of H terms passes each term through
at most C_ROW(H) = ceil(H/32) + 16 FP32 additions on either backend; a column sum over
N rows (dgamma, dbeta) through at most C_COL(N) = N + 16.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .testing.tolerances import half_subnormal, unit_roundoff

U32 = unit_roundoff(np.float32)
# Unit roundoff and half the smallest subnormal (the absolute error of rounding
# near zero) of the output types.
OUTPUT_ROUNDING = {
    np.dtype(t): (unit_roundoff(t), half_subnormal(t)) for t in (np.float32, ml_dtypes.bfloat16, np.float16)
}
SAFETY = 2.0  # covers the O(u^2) terms the first-order bounds leave out
# An FP32 product that lands in the subnormal range is off by up to half the smallest
# subnormal, an absolute error; the bounds add TINY32 for each such rounding.
TINY32 = half_subnormal(np.float32)


def gamma_k(k: float) -> float:
    return k * U32 / (1 - k * U32)


def c_row(h: int) -> int:
    return math.ceil(h / 32) + 16


def c_col(n: int) -> int:
    return n + 16


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _rows(a) -> np.ndarray:
    """a in float64 as a matrix [N, H]."""
    return _f64(a).reshape(-1, np.shape(a)[-1])


def weight(gamma, zero_centered_gamma: bool) -> np.ndarray:
    g = _f64(gamma)
    return 1.0 + g if zero_centered_gamma else g


# ---------------------------------------------------------------------------------------
# Forward and backward in float64


def layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma=False):
    """(y, mu, rsigma) in float64; mu and rsigma have x's shape without the last dim."""
    x = _f64(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mu = x.mean(axis=-1)
        var = ((x - mu[..., None]) ** 2).mean(axis=-1)
        rsigma = 1.0 / np.sqrt(var + eps)
        y = (x - mu[..., None]) * rsigma[..., None] * weight(gamma, zero_centered_gamma) + _f64(beta)
    return y, mu, rsigma


def rmsnorm_fwd(x, gamma, eps, zero_centered_gamma=False):
    """(y, rsigma) in float64."""
    x = _f64(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rsigma = 1.0 / np.sqrt((x * x).mean(axis=-1) + eps)
        y = x * rsigma[..., None] * weight(gamma, zero_centered_gamma)
    return y, rsigma


def layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma, dbeta) for y = xhat * g + beta, xhat = (x - mu) * rsigma.

    With mu and rsigma held as the saved statistics of x, the chain rule through
    mu = mean(x) and rsigma = (mean((x-mu)^2) + eps)^-1/2 gives, per row,
        dx = rsigma * (dy - mean(dy) - xhat * mean(dy * xhat)),   dy = dz * g
    (d mu/dx_j = 1/H; d rsigma/dx_j = -rsigma^3 (x_j - mu) / H, whose mu-term sums to 0).
    """
    x, dz, shape = _rows(x), _rows(dz), np.shape(x)
    mu, rsigma = _f64(mu).reshape(-1, 1), _f64(rsigma).reshape(-1, 1)
    xhat = (x - mu) * rsigma
    dy = dz * weight(gamma, zero_centered_gamma)
    dx = rsigma * (dy - dy.mean(axis=1, keepdims=True) - xhat * (dy * xhat).mean(axis=1, keepdims=True))
    return dx.reshape(shape), (dz * xhat).sum(axis=0), dz.sum(axis=0)


def rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma) for y = xhat * g, xhat = x * rsigma, rsigma = (mean(x^2) + eps)^-1/2:
    dx = rsigma * (dy - xhat * mean(dy * xhat)),   dy = dz * g."""
    x, dz, shape = _rows(x), _rows(dz), np.shape(x)
    rsigma = _f64(rsigma).reshape(-1, 1)
    xhat = x * rsigma
    dy = dz * weight(gamma, zero_centered_gamma)
    dx = rsigma * (dy - xhat * (dy * xhat).mean(axis=1, keepdims=True))
    return dx.reshape(shape), (dz * xhat).sum(axis=0)


# ---------------------------------------------------------------------------------------
# Error bounds: |core - oracle| <= bound, element by element


def rounded(bound_fp32: np.ndarray, exact: np.ndarray, out_dtype) -> np.ndarray:
    """Adds the final rounding of an FP32 result to out_dtype."""
    unit, tiny = OUTPUT_ROUNDING[np.dtype(out_dtype)]
    return bound_fp32 * (1 + unit) + unit * np.abs(exact) + tiny


def forward_bounds(layernorm: bool, x, gamma, beta, eps, zero_centered_gamma, y, mu, rsigma, out_dtype):
    """(bound_y, bound_mu, bound_rsigma) for the oracle's float64 y, mu, rsigma."""
    x = _f64(x)
    h = x.shape[-1]
    c = c_row(h)
    g = np.abs(weight(gamma, zero_centered_gamma))
    g_err = U32 if zero_centered_gamma else 0.0  # 1 + gamma is rounded to FP32
    with np.errstate(invalid="ignore", over="ignore"):
        if layernorm:
            e_mu = gamma_k(c + 1) * np.abs(x).mean(axis=-1)
            # mu's error enters the variance squared: var' - var = (mu' - mu)^2
            eps_v = gamma_k(c + 5) + e_mu**2 * rsigma**2
        else:
            e_mu = np.zeros(x.shape[:-1])
            eps_v = np.full(x.shape[:-1], gamma_k(c + 3))
        eps_r = 0.5 * eps_v + 2 * U32
        r = rsigma[..., None]
        a = np.abs(x - (mu[..., None] if layernorm else 0.0)) * r * g  # |(x - mu) rsigma g|
        b = e_mu[..., None] * r * g
        bound32 = SAFETY * ((a * (eps_r[..., None] + 4 * U32 + g_err) + b) + U32 * np.abs(y) + TINY32 * (2 + g))
    return (
        rounded(bound32, y, out_dtype),
        SAFETY * (e_mu + U32 * np.abs(mu)) if layernorm else None,
        SAFETY * eps_r * rsigma,
    )


def backward_bounds(layernorm: bool, dz, x, mu, rsigma, gamma, zero_centered_gamma, dx, x_dtype, w_dtype):
    """(bound_dx, bound_dgamma, bound_dbeta) for the oracle's float64 results."""
    shape, h = np.shape(x), np.shape(x)[-1]
    x, dz = _rows(x), _rows(dz)
    n = x.shape[0]
    c = c_row(h)
    r = _f64(rsigma).reshape(-1, 1)
    xhat = (x - (_f64(mu).reshape(-1, 1) if layernorm else 0.0)) * r
    dy = dz * weight(gamma, zero_centered_gamma)
    m1 = dy.mean(axis=1, keepdims=True) if layernorm else 0.0
    m2 = (dy * xhat).mean(axis=1, keepdims=True)
    e1 = gamma_k(c + 3) * np.abs(dy).mean(axis=1, keepdims=True) if layernorm else 0.0
    e2 = gamma_k(c + 6) * np.abs(dy * xhat).mean(axis=1, keepdims=True)
    terms = np.abs(dy) + np.abs(m1) + np.abs(xhat * m2)
    dx = _f64(dx).reshape(-1, h)
    # Underflow: xhat and each product can land among the subnormals (absolute TINY32
    # each, the xhat one scaled by what multiplies it).
    bound_dx = SAFETY * (
        r * (e1 + np.abs(xhat) * e2 + 5 * U32 * terms + (4 + np.abs(m2)) * TINY32) + U32 * np.abs(dx) + TINY32
    )
    dgamma = (dz * xhat).sum(axis=0)
    bound_dgamma = SAFETY * (
        gamma_k(c_col(n) + 3) * np.abs(dz * xhat).sum(axis=0) + TINY32 * (1 + np.abs(dz)).sum(axis=0)
    )
    bound_dx = rounded(bound_dx, dx, x_dtype).reshape(shape)
    bound_dgamma = rounded(bound_dgamma, dgamma, w_dtype)
    bound_dbeta = None
    if layernorm:
        dbeta = dz.sum(axis=0)
        bound_dbeta = rounded(SAFETY * gamma_k(c_col(n)) * np.abs(dz).sum(axis=0), dbeta, w_dtype)
    return bound_dx, bound_dgamma, bound_dbeta


def assert_within(actual, expected, bound, what: str) -> None:
    """|actual - expected| <= bound elementwise; NaN must match NaN, inf must match inf."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected, np.float64)
    bound = np.broadcast_to(np.asarray(bound, np.float64), e.shape)
    nan = np.isnan(e)
    assert np.array_equal(np.isnan(a), nan), f"{what}: NaN positions differ"
    inf = np.isinf(e)
    assert np.array_equal(a[inf], e[inf]), f"{what}: infinities differ"
    finite = ~nan & ~inf
    err = np.abs(a[finite] - e[finite])
    ok = err <= bound[finite]
    if not ok.all():
        i = np.argmax(err - bound[finite])
        raise AssertionError(
            f"{what}: {int((~ok).sum())} of {ok.size} elements exceed the bound; worst: got "
            f"{a[finite][i]!r}, expected {e[finite][i]!r}, |error| {err[i]:.3g} > bound "
            f"{bound[finite][i]:.3g}"
        )
