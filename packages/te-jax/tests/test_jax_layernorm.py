"""transformer_engine.jax.layernorm.layernorm (custom VJP over the norm FFI
kernels): forward and jax.grad against te-core's float64 oracle
(norm_reference) within its derived bounds, both norms, zero-centred gamma,
eager and jit, odd shapes; argument errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import norm_rows, put

from transformer_engine.core import norm_reference as nref
from transformer_engine.jax import cpp_extensions as ext
from transformer_engine.jax.layernorm import canonicalize_norm_type, layernorm

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures
NORM_TYPES = pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])


def weights(rng, h, dtype, zero_centered=False):
    """gamma (around 1, or 0 when zero-centred) and beta."""
    gamma = rng.standard_normal(h) * 0.5 + (0.0 if zero_centered else 1.0)
    return gamma.astype(dtype), (rng.standard_normal(h) * 0.5).astype(dtype)


def stats(norm_type, device, x, gamma, beta, eps, zcg):
    """The core's FP32 mu and rsigma (the backward oracle is evaluated at the saved statistics)."""
    if norm_type == "layernorm":
        out = ext.layernorm_fwd(put(x, device), put(gamma, device), put(beta, device), eps, zcg)
        return np.asarray(out.mu), np.asarray(out.rsigma)
    return None, np.asarray(ext.rmsnorm_fwd(put(x, device), put(gamma, device), eps, zcg).rsigma)


@NORM_TYPES
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(5, 160), (2, 3, 64), (33, 17), (48,)], ids=str)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_forward_and_grads_within_oracle_bounds(jax_device, jax_rng, norm_type, zcg, dtype, shape, jit):
    eps = 1e-6
    layer = norm_type == "layernorm"
    x = norm_rows(jax_rng, shape, dtype, specials=False)
    gamma, beta = weights(jax_rng, shape[-1], dtype, zcg)
    dz = jax_rng.standard_normal(shape).astype(dtype)

    def run(x, gamma, beta, dz):
        y, vjp = jax.vjp(lambda x, g, b: layernorm(x, g, b, norm_type, zcg, eps), x, gamma, beta)
        return (y, *vjp(dz))

    args = [put(a, jax_device) if a is not None else None for a in (x, gamma, beta if layer else None, dz)]
    y, dx, dgamma, dbeta = (jax.jit(run) if jit else run)(*args)
    assert y.dtype == dtype and y.shape == shape and dx.dtype == dtype and dx.shape == shape
    assert dgamma.dtype == dtype and dgamma.shape == (shape[-1],)
    assert (dbeta is None) == (not layer)
    if layer:
        want, mu64, rs64 = nref.layernorm_fwd(x, gamma, beta, eps, zcg)
    else:
        (want, rs64), mu64 = nref.rmsnorm_fwd(x, gamma, eps, zcg), None
    by = nref.forward_bounds(layer, x, gamma, beta, eps, zcg, want, mu64, rs64, dtype)[0]
    nref.assert_within(np.asarray(y), want, by, "y")
    mu, rsigma = stats(norm_type, jax_device, x, gamma, beta, eps, zcg)
    if layer:
        expected = nref.layernorm_bwd(dz, x, mu, rsigma, gamma, zcg)
    else:
        expected = nref.rmsnorm_bwd(dz, x, rsigma, gamma, zcg)
    bounds = nref.backward_bounds(layer, dz, x, mu, rsigma, gamma, zcg, expected[0], dtype, dtype)
    for got, want, bound, what in zip((dx, dgamma, dbeta), expected, bounds, ("dx", "dgamma", "dbeta")):
        nref.assert_within(np.asarray(got), want, bound, what)


def test_grad_of_a_loss_and_mixed_weight_type(jax_device, jax_rng):
    """jax.grad through a scalar loss; float32 gamma with bfloat16 x gives gamma-typed grads."""
    x = norm_rows(jax_rng, (4, 8, 32), ml_dtypes.bfloat16, specials=False)
    gamma, beta = weights(jax_rng, 32, np.float32)

    def loss(x, g, b):
        return jnp.sum(layernorm(x, g, b, "LayerNorm").astype(jnp.float32) ** 2)

    dx, dg, db = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*(put(a, jax_device) for a in (x, gamma, beta)))
    assert dx.dtype == jnp.bfloat16 and dg.dtype == db.dtype == jnp.float32
    y, mu, rs = nref.layernorm_fwd(x, gamma, beta, 1e-6)
    # dL/dy = 2 y (y rounded to bfloat16 first, as the loss sees it)
    dz = (2.0 * np.asarray(layernorm(put(x, jax_device), gamma, beta, "layernorm")).astype(np.float64)).astype(
        ml_dtypes.bfloat16
    )
    mu32, rs32 = stats("layernorm", jax_device, x, gamma, beta, 1e-6, False)
    expected = nref.layernorm_bwd(dz, x, mu32, rs32, gamma)
    bounds = nref.backward_bounds(True, dz, x, mu32, rs32, gamma, False, expected[0], ml_dtypes.bfloat16, np.float32)
    for got, want, bound, what in zip((dx, dg, db), expected, bounds, ("dx", "dgamma", "dbeta")):
        nref.assert_within(np.asarray(got), want, bound, what)


def test_norm_type_spellings():
    assert canonicalize_norm_type("LayerNorm") == "layernorm"
    assert canonicalize_norm_type("rms_norm") == canonicalize_norm_type("RMSNorm") == "rmsnorm"
    with pytest.raises(ValueError, match="argument 'norm_type' must be 'layernorm' or 'rmsnorm'"):
        canonicalize_norm_type("batchnorm")


def test_bad_arguments_name_the_argument_and_rule():
    x, g = jnp.ones((4, 16), jnp.float32), jnp.ones((16,), jnp.float32)
    with pytest.raises(ValueError, match="argument 'beta' must be None for norm_type 'rmsnorm'"):
        layernorm(x, g, g, "rmsnorm")
    with pytest.raises(ValueError, match="argument 'beta' is required for norm_type 'layernorm'"):
        layernorm(x, g, None, "layernorm")
    with pytest.raises(ValueError, match="argument 'norm_type' must be"):
        layernorm(x, g, g, "groupnorm")
    with pytest.raises(NotImplementedError, match="argument 'quantizer' is not yet supported"):
        layernorm(x, g, g, "layernorm", quantizer=object())
    with pytest.raises(TypeError, match="argument 'zero_centered_gamma' must be a bool"):
        layernorm(x, g, g, "layernorm", zero_centered_gamma="yes")
    with pytest.raises(ValueError, match=r"argument 'gamma' must have shape \(16,\)"):
        layernorm(x, jnp.ones((8,), jnp.float32), None, "rmsnorm")
    with pytest.raises(ValueError, match="argument 'eps' must be finite and >= 0"):
        layernorm(x, g, g, "layernorm", epsilon=-1.0)
