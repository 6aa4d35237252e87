"""LayerNorm and RMSNorm on JAX arrays through te-core's kernels (XLA FFI).

Formulas (te/norm.h; x viewed as [N, H], H its last dim, FP32 arithmetic):

    LayerNorm:  mu = mean(x),  rsigma = 1 / sqrt(mean((x - mu)^2) + eps),
                y = (x - mu) * rsigma * g + beta
    RMSNorm:    rsigma = 1 / sqrt(mean(x^2) + eps),  y = x * rsigma * g
    g = gamma, or 1 + gamma with zero_centered_gamma

    backward, xhat = (x - mu) * rsigma (RMSNorm: x * rsigma), dy = dz * g:
    LayerNorm:  dx = rsigma * (dy - mean(dy) - xhat * mean(dy * xhat))
    RMSNorm:    dx = rsigma * (dy - xhat * mean(dy * xhat))
    dgamma = sum over rows of dz * xhat,  dbeta = sum over rows of dz

FP8 outputs: with a `scale` the quantization is fused into the norm (delayed
scaling: q = fp8(y_fp32 * scale) of the unrounded FP32 y, amax accumulated,
scale_inv = 1 / scale). Without one it is current scaling: the norm to FP32,
then quantize_fp8_current_scaling of that y (two calls: the scale needs the
amax of the whole output first). A high-precision output with `amax` given
returns max(amax, max|y|) over y as stored.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import jax
import jax.numpy as jnp

from . import _registry  # noqa: F401 - registers the FFI targets
from ._checks import HIGH_PRECISION, check_dtype, dtype_name
from ._outputs import is_fp8, out_dtype_of, rows, scaling
from .cast import quantize_fp8_current_scaling


class NormForward(NamedTuple):
    """Result of a forward norm. mu and rsigma have x's shape without its last dim."""

    y: jax.Array  # x's shape, out_dtype
    mu: jax.Array | None  # float32 (LayerNorm only)
    rsigma: jax.Array  # float32
    scale: jax.Array | None = None  # FP8 y only: float32 (1,)
    scale_inv: jax.Array | None = None  # FP8 y only: float32 (1,)
    amax: jax.Array | None = None  # FP8 y, or a high-precision y with amax given: float32 (1,)


def _check_eps(eps) -> np.float32:
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"argument 'eps' must be finite and >= 0, got {eps}")
    return np.float32(eps)


def _check_input(x, name: str = "x") -> int:
    """x high precision with a non-empty last dim; returns H."""
    check_dtype(x, name, HIGH_PRECISION)
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"argument '{name}' must have a non-empty last dimension, got shape {tuple(x.shape)}")
    return x.shape[-1]


def _check_weight(w, name: str, h: int, like=None) -> None:
    """gamma (or beta): H elements, high precision; beta of gamma's type."""
    if like is None:
        check_dtype(w, name, HIGH_PRECISION)
    elif jnp.dtype(w.dtype) != jnp.dtype(like.dtype):
        raise TypeError(
            f"argument '{name}' must have the type of 'gamma' ({dtype_name(like.dtype)}), got {dtype_name(w.dtype)}"
        )
    if tuple(w.shape) != (h,):
        raise ValueError(f"argument '{name}' must have shape ({h},) (the last dimension of 'x'), got {tuple(w.shape)}")


def _forward(layernorm, x, gamma, beta, eps, zero_centered_gamma, out_dtype, scale, amax, pow2, amax_epsilon):
    h = _check_input(x)
    _check_weight(gamma, "gamma", h)
    if layernorm:
        _check_weight(beta, "beta", h, like=gamma)
    eps = _check_eps(eps)
    out_dtype = out_dtype_of(out_dtype, x.dtype)
    if is_fp8(out_dtype) and scale is None:
        # Current scaling: the FP32 norm, then amax -> scale -> quantize of that y.
        if amax is not None:
            raise ValueError("argument 'amax' is only for a given 'scale' (current scaling computes its own)")
        hp = _forward(layernorm, x, gamma, beta, eps, zero_centered_gamma, jnp.float32, None, None, False, 0.0)
        q, _, scale, scale_inv, amax = quantize_fp8_current_scaling(
            hp.y, out_dtype, force_pow_2_scales=pow2, amax_epsilon=amax_epsilon
        )
        return NormForward(q, hp.mu, hp.rsigma, scale, scale_inv, amax)

    s = scaling(out_dtype, scale, amax)
    n = rows(x.shape)
    stat = jax.ShapeDtypeStruct((n,), jnp.float32)
    results = [jax.ShapeDtypeStruct((n, h), out_dtype), s.scale_inv_result, s.amax_result]
    operands = [x.reshape(n, h), gamma] + ([beta] if layernorm else []) + [s.scale, s.amax]
    results += [stat, stat] if layernorm else [stat]
    call = jax.ffi.ffi_call(
        "te_jax_layernorm_fwd" if layernorm else "te_jax_rmsnorm_fwd",
        tuple(results),
        input_output_aliases={len(operands) - 1: 2} if s.amax_asked else None,
        vmap_method="sequential",
    )
    out = call(*operands, eps=eps, zero_centered_gamma=np.bool_(zero_centered_gamma))
    y, scale_inv, new_amax = out[0].reshape(x.shape), out[1], out[2]
    mu = out[3].reshape(x.shape[:-1]) if layernorm else None
    rsigma = out[-1].reshape(x.shape[:-1])
    fp8 = is_fp8(out_dtype)
    return NormForward(
        y, mu, rsigma, scale if fp8 else None, scale_inv if fp8 else None, new_amax if s.amax_asked else None
    )


def layernorm_fwd(
    x,
    gamma,
    beta,
    eps=1e-5,
    zero_centered_gamma=False,
    *,
    out_dtype=None,
    scale=None,
    amax=None,
    force_pow_2_scales=False,
    amax_epsilon=0.0,
) -> NormForward:
    """LayerNorm over the last dim of x (float32, bfloat16 or float16).

    gamma and beta: H elements, one high-precision type. out_dtype: None (x's
    type), float32/bfloat16/float16, or float8_e4m3fn/float8_e5m2. An FP8 y with
    `scale` (float32 (1,)) is delayed scaling fused into the norm (`amax`, if
    given, max-accumulated); without `scale`, current scaling
    (force_pow_2_scales, amax_epsilon as in quantize_fp8_current_scaling).
    """
    return _forward(
        True, x, gamma, beta, eps, zero_centered_gamma, out_dtype, scale, amax, force_pow_2_scales, amax_epsilon
    )


def rmsnorm_fwd(
    x,
    gamma,
    eps=1e-5,
    zero_centered_gamma=False,
    *,
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


def _check_stat(a, name: str, x) -> None:
    if jnp.dtype(a.dtype) != jnp.float32 or tuple(a.shape) != tuple(x.shape[:-1]):
        raise ValueError(
            f"argument '{name}' must be float32 of shape {tuple(x.shape[:-1])} (one value per row of 'x'), "
            f"got {dtype_name(a.dtype)} {tuple(a.shape)}"
        )


def _backward(layernorm, dz, x, mu, rsigma, gamma, zero_centered_gamma):
    h = _check_input(x)
    if jnp.dtype(dz.dtype) != jnp.dtype(x.dtype) or dz.shape != x.shape:
        raise ValueError(
            f"argument 'dz' must have the shape and type of 'x' ({tuple(x.shape)} {dtype_name(x.dtype)}), "
            f"got {tuple(dz.shape)} {dtype_name(dz.dtype)}"
        )
    _check_weight(gamma, "gamma", h)
    if layernorm:
        _check_stat(mu, "mu", x)
    _check_stat(rsigma, "rsigma", x)
    n = rows(x.shape)
    weight = jax.ShapeDtypeStruct((h,), gamma.dtype)
    results = (jax.ShapeDtypeStruct((n, h), x.dtype), weight) + ((weight,) if layernorm else ())
    stats = [mu.reshape(n), rsigma.reshape(n)] if layernorm else [rsigma.reshape(n)]
    call = jax.ffi.ffi_call(
        "te_jax_layernorm_bwd" if layernorm else "te_jax_rmsnorm_bwd", results, vmap_method="sequential"
    )
    grads = call(dz.reshape(n, h), x.reshape(n, h), *stats, gamma, zero_centered_gamma=np.bool_(zero_centered_gamma))
    return (grads[0].reshape(x.shape), *grads[1:])


def layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma, dbeta) of LayerNorm from the forward's mu and rsigma; dx has
    x's type, dgamma and dbeta gamma's."""
    return _backward(True, dz, x, mu, rsigma, gamma, zero_centered_gamma)


def rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma) of RMSNorm from the forward's rsigma; dx has x's type,
    dgamma gamma's."""
    return _backward(False, dz, x, None, rsigma, gamma, zero_centered_gamma)
