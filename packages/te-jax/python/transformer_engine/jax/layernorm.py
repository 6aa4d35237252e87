"""layernorm: LayerNorm or RMSNorm over the last dim, with a custom VJP over
te-core's norm kernels (cpp_extensions.norm; formulas there).

    layernorm:  y = (x - mean(x)) / sqrt(var(x) + epsilon) * g + beta
    rmsnorm:    y = x / sqrt(mean(x^2) + epsilon) * g
    g = gamma, or 1 + gamma with zero_centered_gamma

FP32 arithmetic, y in x's type; the gradients of gamma and beta come back in
gamma's type. The forward saves x, mu and rsigma, the backward calls the
norm's backward kernel (one pass for dx, dgamma and dbeta).
"""

from __future__ import annotations

from functools import partial

import jax

from ._partition import active_mesh
from .cpp_extensions import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd

NORM_TYPES = ("layernorm", "rmsnorm")


def canonicalize_norm_type(x: str) -> str:
    """'layernorm' or 'rmsnorm' from any spelling of them ('LayerNorm', 'rms_norm', ...)."""
    canonical = x.lower().strip().replace("-", "").replace("_", "") if isinstance(x, str) else None
    if canonical not in NORM_TYPES:
        raise ValueError(f"argument 'norm_type' must be 'layernorm' or 'rmsnorm' (any case, '_' or '-'), got {x!r}")
    return canonical


def check_norm_arguments(norm_type: str, beta, zero_centered_gamma) -> str:
    """The canonical norm type; beta must be None exactly for RMSNorm."""
    norm_type = canonicalize_norm_type(norm_type)
    if norm_type == "rmsnorm" and beta is not None:
        raise ValueError("argument 'beta' must be None for norm_type 'rmsnorm' (RMSNorm has no shift)")
    if norm_type == "layernorm" and beta is None:
        raise ValueError("argument 'beta' is required for norm_type 'layernorm'")
    if not isinstance(zero_centered_gamma, bool):
        raise TypeError(f"argument 'zero_centered_gamma' must be a bool, got {type(zero_centered_gamma).__name__}")
    return norm_type


def layernorm(x, gamma, beta, norm_type: str, zero_centered_gamma: bool = False, epsilon: float = 1e-6, quantizer=None):
    """LayerNorm (norm_type 'layernorm', beta [H]) or RMSNorm ('rmsnorm', beta None)
    over the last dim H of x (float32, bfloat16 or float16); y has x's shape and type.

    gamma [H] (and beta, of gamma's type) may have another high-precision type than x.
    quantizer: None only. An FP8 norm output is produced inside layernorm_dense and
    layernorm_mlp, where the GEMM consumes it; a standalone FP8 result (a ScaledTensor)
    is not yet supported.
    """
    norm_type = check_norm_arguments(norm_type, beta, zero_centered_gamma)
    if quantizer is not None:
        raise NotImplementedError(
            "layernorm: argument 'quantizer' is not yet supported (an FP8 norm output is fused into "
            "layernorm_dense / layernorm_mlp instead); pass quantizer=None"
        )
    mesh = active_mesh()
    if mesh is not None:  # rows over the batch (and the sequence over tpsp), docs/te_jax.md
        from ._sharded_ops import sharded_layernorm

        return sharded_layernorm(mesh, x, gamma, beta, norm_type, zero_centered_gamma, float(epsilon))
    return _layernorm(x, gamma, beta, norm_type, zero_centered_gamma, float(epsilon))


def norm_forward(x, gamma, beta, norm_type: str, zero_centered_gamma: bool, epsilon: float, **out):
    """cpp_extensions' forward of the norm type (out: out_dtype / scale / amax / ... as there)."""
    if norm_type == "layernorm":
        return layernorm_fwd(x, gamma, beta, epsilon, zero_centered_gamma, **out)
    return rmsnorm_fwd(x, gamma, epsilon, zero_centered_gamma, **out)


def norm_backward(dz, x, mu, rsigma, gamma, norm_type: str, zero_centered_gamma: bool):
    """(dx, dgamma, dbeta), dbeta None for RMSNorm."""
    if norm_type == "layernorm":
        return layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)
    dx, dgamma = rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma)
    return dx, dgamma, None


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _layernorm(x, gamma, beta, norm_type, zero_centered_gamma, epsilon):
    return _layernorm_fwd(x, gamma, beta, norm_type, zero_centered_gamma, epsilon)[0]


def _layernorm_fwd(x, gamma, beta, norm_type, zero_centered_gamma, epsilon):
    out = norm_forward(x, gamma, beta, norm_type, zero_centered_gamma, epsilon)
    return out.y, (x, out.mu, out.rsigma, gamma)


def _layernorm_bwd(norm_type, zero_centered_gamma, epsilon, residuals, dy):
    del epsilon  # the backward reads rsigma
    x, mu, rsigma, gamma = residuals
    return norm_backward(dy, x, mu, rsigma, gamma, norm_type, zero_centered_gamma)


_layernorm.defvjp(_layernorm_fwd, _layernorm_bwd)
