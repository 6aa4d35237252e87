"""LayerNorm / RMSNorm of transformer_engine.jax.cpp_extensions (XLA FFI) on CPU
(and GPU on the device machine), eager, under jit and under vmap.

The core computes in FP32 with backend-specific summation orders, so y, mu,
rsigma and the gradients are checked against te-core's float64 oracle
(reference_norm) within its derived per-element bounds, as te-core's own tests
do. The fused FP8 output is checked byte for byte against the NumPy
quantize of the same device's FP32 output. On the CPU, the JAX handlers must
also give exactly the bytes of te-core's NumPy API (the same backend).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import fp32_scalar, norm_rows, put, same_floats, same_fp8

import transformer_engine.core as tc
from transformer_engine.core import reference as ref
from transformer_engine.core import reference_norm as nref
from transformer_engine.jax import cpp_extensions as ext

pytestmark = pytest.mark.norm

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures
DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
SHAPES = [(1, 16), (5, 160), (217, 256), (2, 3, 5, 64), (33, 17), (48,)]
FP8 = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
NORMS = pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])


def name(d) -> str:
    return np.dtype(d).name


def weights(rng, h, dtype, zero_centered=False):
    """gamma (around 1, or around 0 when zero-centred; some exact zeros) and beta."""
    gamma = rng.standard_normal(h) * 0.5 + (0.0 if zero_centered else 1.0)
    gamma[rng.random(h) < 0.05] = 0.0
    return gamma.astype(dtype), (rng.standard_normal(h) * 0.5).astype(dtype)


def forward(layernorm, device, x, gamma, beta, eps=1e-5, zcg=False, **kw):
    if layernorm:
        return ext.layernorm_fwd(put(x, device), put(gamma, device), put(beta, device), eps, zcg, **kw)
    return ext.rmsnorm_fwd(put(x, device), put(gamma, device), eps, zcg, **kw)


def oracle_forward(layernorm, x, gamma, beta, eps, zcg):
    """(y, mu, rsigma) in float64; mu None for RMSNorm."""
    if layernorm:
        return nref.layernorm_fwd(x, gamma, beta, eps, zcg)
    y, rsigma = nref.rmsnorm_fwd(x, gamma, eps, zcg)
    return y, None, rsigma


@NORMS
@pytest.mark.parametrize("x_dtype,w_dtype", list(itertools.product(DTYPES, DTYPES)), ids=name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_within_oracle_bounds(jax_device, jax_rng, layernorm, x_dtype, w_dtype, shape):
    x = norm_rows(jax_rng, shape, x_dtype)
    gamma, beta = weights(jax_rng, shape[-1], w_dtype)
    out = forward(layernorm, jax_device, x, gamma, beta)
    assert out.y.dtype == x_dtype and out.y.shape == shape
    assert out.rsigma.dtype == jnp.float32 and out.rsigma.shape == shape[:-1]
    assert out.scale is out.scale_inv is out.amax is None
    y, mu, rsigma = oracle_forward(layernorm, x, gamma, beta, 1e-5, False)
    by, bmu, brs = nref.forward_bounds(layernorm, x, gamma, beta, 1e-5, False, y, mu, rsigma, x_dtype)
    nref.assert_within(np.asarray(out.y), y, by, "y")
    nref.assert_within(np.asarray(out.rsigma), rsigma, brs, "rsigma")
    if layernorm:
        assert out.mu.dtype == jnp.float32 and out.mu.shape == shape[:-1]
        nref.assert_within(np.asarray(out.mu), mu, bmu, "mu")
    else:
        assert out.mu is None
    if jax_device.platform == "cpu":  # the very backend of te-core's NumPy API
        core = (tc.layernorm_fwd(x, gamma, beta) if layernorm else tc.rmsnorm_fwd(x, gamma)).y
        same_floats(out.y, core)


@NORMS
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_zero_centered_gamma_is_weight_one_plus_gamma(jax_device, jax_rng, layernorm, dtype, eps):
    x = norm_rows(jax_rng, (37, 96), dtype)
    gamma, beta = weights(jax_rng, 96, dtype, zero_centered=True)
    out = forward(layernorm, jax_device, x, gamma, beta, eps, True)
    y, mu, rsigma = oracle_forward(layernorm, x, gamma, beta, eps, True)
    by = nref.forward_bounds(layernorm, x, gamma, beta, eps, True, y, mu, rsigma, dtype)[0]
    nref.assert_within(np.asarray(out.y), y, by, "y")
    # The plain norm with the weight 1 + gamma rounded to FP32 gives the same bytes.
    plain = forward(
        layernorm, jax_device, x, 1.0 + gamma.astype(np.float32), beta.astype(np.float32), eps, out_dtype=dtype
    )
    same_floats(out.y, plain.y)
    np.testing.assert_array_equal(np.asarray(out.rsigma), np.asarray(plain.rsigma))


@NORMS
@pytest.mark.parametrize("x_dtype", DTYPES, ids=name)
@pytest.mark.parametrize("fmt", FP8)
def test_fused_fp8_is_quantize_of_the_fp32_output(jax_device, jax_rng, layernorm, x_dtype, fmt):
    shape = (67, 192)
    x = norm_rows(jax_rng, shape, x_dtype)
    gamma, beta = weights(jax_rng, shape[-1], np.float32)
    scale = np.float32(jax_rng.choice([1.0, 37.5, 300.0, 2.0**-3]))
    old_amax = np.float32(jax_rng.choice([0.0, 1e4]))
    y32 = forward(layernorm, jax_device, x, gamma, beta, out_dtype=np.float32)
    fused = forward(
        layernorm,
        jax_device,
        x,
        gamma,
        beta,
        out_dtype=FP8[fmt],
        scale=fp32_scalar(scale, jax_device),
        amax=fp32_scalar(old_amax, jax_device),
    )
    assert fused.y.dtype == FP8[fmt] and fused.y.shape == shape
    same_fp8(fused.y, ref.quantize_fp8(np.asarray(y32.y), scale, fmt))
    assert np.asarray(fused.amax)[0] == max(old_amax, ref.amax(np.asarray(y32.y)))
    assert np.asarray(fused.scale_inv)[0] == np.float32(1.0) / scale
    assert np.asarray(fused.scale)[0] == scale
    np.testing.assert_array_equal(np.asarray(fused.rsigma), np.asarray(y32.rsigma))


@NORMS
@pytest.mark.parametrize("fmt", FP8)
def test_current_scaling_is_fp32_norm_then_quantize(jax_device, jax_rng, layernorm, fmt):
    x = norm_rows(jax_rng, (9, 200), ml_dtypes.bfloat16, specials=False)
    gamma, beta = weights(jax_rng, 200, ml_dtypes.bfloat16)
    out = forward(layernorm, jax_device, x, gamma, beta, out_dtype=FP8[fmt])
    y32 = np.asarray(forward(layernorm, jax_device, x, gamma, beta, out_dtype=np.float32).y)
    amax = ref.amax(y32)
    scale = ref.scale_from_amax(amax, fmt)
    assert np.asarray(out.amax)[0] == amax and np.asarray(out.scale)[0] == scale
    assert np.asarray(out.scale_inv)[0] == np.float32(1.0) / scale
    same_fp8(out.y, ref.quantize_fp8(y32, scale, fmt))


@NORMS
def test_high_precision_amax_is_of_the_stored_output(jax_device, jax_rng, layernorm):
    x = norm_rows(jax_rng, (40, 64), np.float32, specials=False)
    gamma, beta = weights(jax_rng, 64, np.float32)
    for old in (0.0, 1e3):
        out = forward(layernorm, jax_device, x, gamma, beta, out_dtype=jnp.bfloat16, amax=fp32_scalar(old, jax_device))
        assert out.scale is out.scale_inv is None
        assert np.asarray(out.amax)[0] == max(np.float32(old), ref.amax(np.asarray(out.y)))


@NORMS
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("x_dtype,w_dtype", list(itertools.product(DTYPES, DTYPES)), ids=name)
@pytest.mark.parametrize("shape", [(1, 16), (217, 256), (2, 3, 5, 64), (33, 17)], ids=str)
def test_backward_within_oracle_bounds(jax_device, jax_rng, layernorm, zcg, x_dtype, w_dtype, shape):
    x = norm_rows(jax_rng, shape, x_dtype, specials=False)
    gamma, beta = weights(jax_rng, shape[-1], w_dtype, zero_centered=zcg)
    dz = (jax_rng.standard_normal(shape) * jax_rng.choice([1e-2, 1.0, 10.0], shape)).astype(x_dtype)
    fwd = forward(layernorm, jax_device, x, gamma, beta, 1e-5, zcg)
    mu, rsigma = (np.asarray(fwd.mu) if layernorm else None), np.asarray(fwd.rsigma)
    if layernorm:
        grads = ext.layernorm_bwd(
            put(dz, jax_device), put(x, jax_device), fwd.mu, fwd.rsigma, put(gamma, jax_device), zcg
        )
        expected = nref.layernorm_bwd(dz, x, mu, rsigma, gamma, zcg)
    else:
        grads = ext.rmsnorm_bwd(put(dz, jax_device), put(x, jax_device), fwd.rsigma, put(gamma, jax_device), zcg)
        expected = nref.rmsnorm_bwd(dz, x, rsigma, gamma, zcg)
    bounds = nref.backward_bounds(layernorm, dz, x, mu, rsigma, gamma, zcg, expected[0], x_dtype, w_dtype)
    assert grads[0].dtype == x_dtype and grads[0].shape == shape
    assert all(g.dtype == w_dtype and g.shape == (shape[-1],) for g in grads[1:])
    assert len(grads) == (3 if layernorm else 2)
    for got, want, bound, what in zip(grads, expected, bounds, ("dx", "dgamma", "dbeta")):
        nref.assert_within(np.asarray(got), want, bound, what)
    if jax_device.platform == "cpu":
        if layernorm:
            core = tc.layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma=zcg)
        else:
            core = tc.rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma=zcg)
        for got, want in zip(grads, core):
            same_floats(got, want)


def test_forward_and_backward_under_jit_and_vmap(jax_device, jax_rng):
    x = norm_rows(jax_rng, (3, 24, 80), ml_dtypes.bfloat16, specials=False)
    gamma, beta = weights(jax_rng, 80, ml_dtypes.bfloat16)
    dz = jax_rng.standard_normal(x.shape).astype(ml_dtypes.bfloat16)
    g, b = put(gamma, jax_device), put(beta, jax_device)

    @jax.jit
    def step(x, dz):
        fwd = ext.layernorm_fwd(x, g, b, 1e-5, True)
        return fwd.y, ext.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, g, True)

    y, grads = step(put(x, jax_device), put(dz, jax_device))
    eager = ext.layernorm_fwd(put(x, jax_device), g, b, 1e-5, True)
    same_floats(y, eager.y)
    for got, want in zip(
        grads, ext.layernorm_bwd(put(dz, jax_device), put(x, jax_device), eager.mu, eager.rsigma, g, True)
    ):
        same_floats(got, want)
    # vmap: one norm per slice (gamma/dgamma per slice too)
    ys, (dxs, dgs, dbs) = jax.vmap(step)(put(x, jax_device), put(dz, jax_device))
    for i in range(x.shape[0]):
        yi, (dxi, dgi, dbi) = step(put(x[i], jax_device), put(dz[i], jax_device))
        for got, want in ((ys[i], yi), (dxs[i], dxi), (dgs[i], dgi), (dbs[i], dbi)):
            same_floats(got, want)
    rms = jax.vmap(lambda x: ext.rmsnorm_fwd(x, g).rsigma)(put(x, jax_device))
    assert rms.shape == (3, 24)


def test_one_dimensional_input_and_empty_batch(jax_device, jax_rng):
    x = norm_rows(jax_rng, (48,), np.float32)
    gamma, beta = weights(jax_rng, 48, np.float32)
    out = forward(True, jax_device, x, gamma, beta)
    assert out.mu.shape == () and out.rsigma.shape == ()
    same_floats(out.y, forward(True, jax_device, x[None], gamma, beta).y[0])
    empty = np.zeros((0, 16), np.float32)
    gamma, beta = weights(jax_rng, 16, np.float32)
    out = forward(True, jax_device, empty, gamma, beta, out_dtype=jnp.float8_e4m3fn, scale=fp32_scalar(4.0, jax_device))
    assert out.y.shape == (0, 16) and np.asarray(out.scale_inv)[0] == 0.25 and np.asarray(out.amax)[0] == 0
    dx, dgamma, dbeta = ext.layernorm_bwd(
        put(empty, jax_device), put(empty, jax_device), out.mu, out.rsigma, put(gamma, jax_device)
    )
    assert dx.shape == (0, 16) and not np.asarray(dgamma).any() and not np.asarray(dbeta).any()


def test_bad_arguments_name_the_argument_and_rule():
    x, g = jnp.ones((4, 16), jnp.float32), jnp.ones((16,), jnp.float32)
    with pytest.raises(TypeError, match="argument 'x' must be one of float32, bfloat16, float16, got int32"):
        ext.layernorm_fwd(jnp.ones((4, 16), jnp.int32), g, g)
    with pytest.raises(ValueError, match=r"argument 'gamma' must have shape \(16,\) \(the last dimension of 'x'\)"):
        ext.rmsnorm_fwd(x, jnp.ones((15,), jnp.float32))
    with pytest.raises(TypeError, match=r"argument 'beta' must have the type of 'gamma' \(float32\), got float16"):
        ext.layernorm_fwd(x, g, jnp.ones((16,), jnp.float16))
    with pytest.raises(ValueError, match="argument 'eps' must be finite and >= 0, got -1"):
        ext.layernorm_fwd(x, g, g, -1.0)
    with pytest.raises(ValueError, match="argument 'x' must have a non-empty last dimension"):
        ext.rmsnorm_fwd(jnp.ones((3, 0), jnp.float32), jnp.ones((0,), jnp.float32))
    with pytest.raises(TypeError, match="argument 'out_dtype' must be float32, bfloat16, float16, float8_e4m3fn"):
        ext.rmsnorm_fwd(x, g, out_dtype=jnp.int8)
    with pytest.raises(ValueError, match=r"argument 'scale' is only for an FP8 out_dtype, got float32"):
        ext.rmsnorm_fwd(x, g, scale=jnp.ones((1,), jnp.float32))
    with pytest.raises(ValueError, match=r"argument 'scale' must be a float32 array of shape \(1,\)"):
        ext.rmsnorm_fwd(x, g, out_dtype=jnp.float8_e4m3fn, scale=jnp.ones((2,), jnp.float32))
    with pytest.raises(ValueError, match="argument 'amax' is only for a given 'scale'"):
        ext.rmsnorm_fwd(x, g, out_dtype=jnp.float8_e4m3fn, amax=jnp.zeros((1,), jnp.float32))
    fwd = ext.layernorm_fwd(x, g, g)
    with pytest.raises(ValueError, match=r"argument 'dz' must have the shape and type of 'x' \(\(4, 16\) float32\)"):
        ext.layernorm_bwd(x.astype(jnp.bfloat16), x, fwd.mu, fwd.rsigma, g)
    with pytest.raises(ValueError, match=r"argument 'rsigma' must be float32 of shape \(4,\) \(one value per row"):
        ext.rmsnorm_bwd(x, x, fwd.rsigma[:3], g)
    with pytest.raises(ValueError, match=r"argument 'mu' must be float32 of shape \(4,\)"):
        ext.layernorm_bwd(x, x, fwd.mu.astype(jnp.float16), fwd.rsigma, g)
