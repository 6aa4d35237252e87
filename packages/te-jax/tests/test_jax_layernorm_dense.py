"""transformer_engine.jax.layernorm_dense.layernorm_dense (norm -> GEMM in one
custom VJP).

- Against float64 NumPy: the high-precision layer's forward, kernel and bias
  gradients within the norm oracle's bound carried through the GEMM bound, and
  dx / dgamma / dbeta through the norm's float64 backward.
- Against an FP8 emulation: the norm's float64 output quantized with the
  recipe's scale (te-core's NumPy oracle), times the quantized kernel in float64,
  within the GEMM bound plus the FP8 rounding-boundary allowance of a value known
  to the norm oracle's bound (jax_helpers.fp8_dq_within).
- Against dense(layernorm(x)) (two separately tested ops): bit-equal outputs,
  gradients and quantizer states for float32 x, where the fused quantization of
  the FP32 norm output is the quantization of the stored output.
- Delayed-scaling state over jitted steps: kernel and dgrad exactly as the
  oracle's recipe update; the x quantizer's amax is the norm output's (within
  the oracle's bound) and its scale the recipe update of that amax, exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import EPS, DelayedOracle, fp8_dq_within, gemm_tolerance, put

from transformer_engine.common import recipe
from transformer_engine.core import norm_reference as nref
from transformer_engine.core import reference as ref
from transformer_engine.jax.dense import dense
from transformer_engine.jax.layernorm import layernorm
from transformer_engine.jax.layernorm_dense import layernorm_dense
from transformer_engine.jax.quantize import QuantizerFactory, noop_quantizer_set

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures
NORM_TYPES = pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
RECIPES = {
    "noop": None,
    "delayed": recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling(),
}


def inputs(rng, x_shape, kernel_shape, dtype, norm_type, zcg=False):
    x = (rng.standard_normal(x_shape) * 3.0 + 1.0).astype(dtype)
    gamma = (rng.standard_normal(x_shape[-1]) * 0.5 + (0.0 if zcg else 1.0)).astype(np.float32)
    beta = (rng.standard_normal(x_shape[-1]) * 0.5).astype(np.float32) if norm_type == "layernorm" else None
    kernel = rng.standard_normal(kernel_shape).astype(np.float32)
    bias = rng.standard_normal(kernel_shape[1:]).astype(np.float32)
    dy = rng.standard_normal((*x_shape[:-1], *kernel_shape[1:])).astype(dtype)
    return x, gamma, beta, kernel, bias, dy


def oracle_norm(x, gamma, beta, eps, zcg=False, out_dtype=np.float32):
    """(y64 [M, H], bound, mu64, rsigma64) of the norm of x viewed as [M, H]."""
    x2 = x.reshape(-1, x.shape[-1])
    if beta is not None:
        y, mu, rs = nref.layernorm_fwd(x2, gamma, beta, eps, zcg)
    else:
        (y, rs), mu = nref.rmsnorm_fwd(x2, gamma, eps, zcg), None
    bound = nref.forward_bounds(beta is not None, x2, gamma, beta, eps, zcg, y, mu, rs, out_dtype)[0]
    return y, bound, mu, rs


def run_layer(device, fn, args, dy, quantizer_set, jit):
    """(y, grads of the args, quantizer set cotangent) of fn(*args, quantizer_set) with dL/dy = dy."""

    def step(args, quantizer_set, dy):
        y, vjp = jax.vjp(fn, *args, quantizer_set)
        return y, vjp(dy)

    args = [None if a is None else put(a, device) for a in args]
    y, grads = (jax.jit(step) if jit else step)(args, jax.device_put(quantizer_set, device), put(dy, device))
    return y, grads[:-1], grads[-1]


def assert_close_to(got, want, tol, what):
    err = np.abs(np.asarray(got).astype(np.float64).reshape(want.shape) - want)
    assert (err <= tol).all(), f"{what}: max error {err.max()} (tolerance there {tol.flat[err.argmax()]})"


@NORM_TYPES
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("shapes", [((2, 24, 32), (32, 48)), ((7, 33), (33, 2, 5)), ((32,), (32, 16))], ids=str)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_high_precision_matches_float64(jax_device, jax_rng, norm_type, zcg, shapes, jit):
    eps = 1e-6
    x, gamma, beta, kernel, bias, dy = inputs(jax_rng, *shapes, np.float32, norm_type, zcg)

    def fn(x, k, g, b, bias, qs):
        return layernorm_dense(x, k, g, b, bias, norm_type, zcg, eps, quantizer_set=qs)

    y, (dx, dk, dg, db, dbias), _ = run_layer(
        jax_device, fn, (x, kernel, gamma, beta, bias), dy, noop_quantizer_set, jit
    )
    assert y.shape == dy.shape and y.dtype == np.float32 and dx.shape == x.shape and dk.shape == kernel.shape
    ln, band, mu, rs = oracle_norm(x, gamma, beta, eps, zcg)
    k64, dy64 = kernel.reshape(shapes[1][0], -1).astype(np.float64), dy.reshape(ln.shape[0], -1).astype(np.float64)
    want = ln @ k64 + bias.reshape(-1)
    tol = (
        gemm_tolerance(jax_device, ln, k64, np.float32, False)
        + band @ np.abs(k64)
        + EPS[np.dtype(np.float32)] * np.abs(want)
    )
    assert_close_to(y, want, tol, "y")
    tol_dk = gemm_tolerance(jax_device, ln.T, dy64, np.float32, False) + band.T @ np.abs(dy64)
    assert_close_to(dk, ln.T @ dy64, tol_dk, "dkernel")
    assert_close_to(dbias, dy64.sum(0), dy64.shape[0] * 2.0**-24 * np.abs(dy64).sum(0) + 1e-30, "dbias")
    # dx, dgamma, dbeta: the norm's float64 backward of dY K^T (FP32 GEMM and norm arithmetic: 1e-5 relative)
    x2 = x.reshape(ln.shape).astype(np.float64)
    dln = dy64 @ k64.T
    if beta is not None:
        expected = nref.layernorm_bwd(dln, x2, mu, rs, gamma, zcg)
    else:
        expected = nref.rmsnorm_bwd(dln, x2, rs, gamma, zcg)
    for got, want, what in zip((dx, dg, db), expected, ("dx", "dgamma", "dbeta")):
        np.testing.assert_allclose(
            np.asarray(got).reshape(want.shape), want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=what
        )
    assert (db is None) == (beta is None)


@NORM_TYPES
@pytest.mark.parametrize("name", ["noop", "delayed", "current"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_equals_dense_of_layernorm(jax_device, jax_rng, norm_type, name, dtype):
    """The fused layer against the composition of two separately tested ops: bit-equal
    in float32 (also the quantizer states); for bfloat16 the fusion quantizes the FP32
    norm output where the composition quantizes its bfloat16 rounding (FP8 cases
    compared within one FP8 rounding of the output), high precision is bit-equal."""
    x, gamma, beta, kernel, bias, dy = inputs(jax_rng, (2, 16, 64), (64, 32), dtype, norm_type, zcg=True)
    qs = QuantizerFactory.create_set(RECIPES[name])

    def fused(x, k, g, b, bias, qs):
        return layernorm_dense(x, k, g, b, bias, norm_type, True, 1e-5, quantizer_set=qs)

    def composed(x, k, g, b, bias, qs):
        return dense(layernorm(x, g, b, norm_type, True, 1e-5), k, bias, quantizer_set=qs)

    args = (x, kernel, gamma, beta, bias)
    got = run_layer(jax_device, fused, args, dy, qs, jit=True)
    want = run_layer(jax_device, composed, args, dy, qs, jit=True)
    if dtype == np.float32 or name == "noop":
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    else:
        y, y_want = np.asarray(got[0]).astype(np.float64), np.asarray(want[0]).astype(np.float64)
        assert np.abs(y - y_want).max() <= 2.0**-3 * np.abs(y_want).max()


@NORM_TYPES
@pytest.mark.parametrize("name", ["delayed", "current"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fp8_format", [recipe.Format.HYBRID, recipe.Format.E4M3], ids=lambda f: f.name)
def test_fp8_forward_matches_emulation(jax_device, jax_rng, norm_type, name, dtype, fp8_format):
    r = (
        recipe.DelayedScaling(fp8_format=fp8_format)
        if name == "delayed"
        else recipe.Float8CurrentScaling(fp8_format=fp8_format)
    )
    x, gamma, beta, kernel, bias, _ = inputs(jax_rng, (3, 16, 64), (64, 48), dtype, norm_type)
    y = jax.jit(lambda *a: layernorm_dense(*a, norm_type=norm_type, quantizer_set=QuantizerFactory.create_set(r)))(
        *(None if a is None else put(a, jax_device) for a in (x, kernel, gamma, beta, bias))
    )
    ln, band, _, _ = oracle_norm(x, gamma, beta, 1e-6)
    k = kernel.astype(dtype)
    if name == "delayed":  # the initial scale 1 for both
        ln_dq, allowance = fp8_dq_within(ln, band, 1.0, "e4m3")
        k_dq = ref.dequantize_fp8(ref.quantize_fp8(k, np.float32(1.0), "e4m3"), np.float32(1.0), "e4m3")
    else:  # scales from the amaxes; the core's amax is the oracle's within the band
        fmax = np.float32(448.0)
        amax = np.abs(ln).max()
        scale = ref.scale_from_amax(np.float32(amax), "e4m3")
        rel = band.max() / amax * 1.01  # the scale's relative uncertainty
        ln_dq, allowance = fp8_dq_within(ln, band + np.abs(ln) * rel, scale, "e4m3")
        allowance = allowance + 2 * rel * np.abs(ln_dq)  # and the scale_inv that dequantizes
        k_scale = ref.scale_from_amax(ref.amax(k), "e4m3", value_for_inf=fmax)
        k_dq = ref.dequantize_fp8(ref.quantize_fp8(k, k_scale, "e4m3"), np.float32(1.0) / k_scale, "e4m3")
    k_dq = k_dq.astype(np.float64)
    b = bias.astype(dtype).astype(np.float64)
    want = ln_dq @ k_dq + b
    tol = (
        gemm_tolerance(jax_device, ln_dq, k_dq, dtype, True)
        + allowance @ np.abs(k_dq)
        + EPS[np.dtype(dtype)] * np.abs(want)
    )
    assert_close_to(y.reshape(want.shape), want, tol, "y")


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_delayed_scaling_state_evolves_over_jitted_steps(jax_device, jax_rng, norm_type):
    history_len, margin = 4, 1
    r = recipe.DelayedScaling(margin=margin, amax_history_len=history_len)
    qs = jax.device_put(QuantizerFactory.create_set(r), jax_device)
    kernel_oracle = DelayedOracle("e4m3", history_len, margin, "max")
    dgrad_oracle = DelayedOracle("e5m2", history_len, margin, "max")
    x_scale, x_history = np.ones(1, np.float32), np.zeros(history_len, np.float32)

    @jax.jit
    def train_step(params, quantizer_set, x, dy):
        def loss(params, quantizer_set):
            y = layernorm_dense(x, params[0], params[1], params[2], norm_type=norm_type, quantizer_set=quantizer_set)
            return jnp.sum(y * dy)

        return jax.grad(loss, argnums=(0, 1))(params, quantizer_set)

    for gamma_range, k_range, dy_range in ((1000.0, 1e-3, 1e-3), (1.0, 2.0, 1.0), (50.0, 50.0, 1e5)):
        x, gamma, beta, kernel, _, dy = inputs(jax_rng, (2, 16, 32), (32, 48), np.float32, norm_type)
        gamma, kernel, dy = gamma * np.float32(gamma_range), kernel * np.float32(k_range), dy * np.float32(dy_range)
        beta = None if beta is None else beta * np.float32(gamma_range)
        params = [put(kernel, jax_device), put(gamma, jax_device), None if beta is None else put(beta, jax_device)]
        _, new_qs = train_step(params, qs, put(x, jax_device), put(dy, jax_device))
        kernel_oracle.quantize_and_update(kernel)
        dgrad_oracle.quantize_and_update(dy)
        kernel_oracle.assert_matches(new_qs.kernel.scale, new_qs.kernel.amax_history)
        dgrad_oracle.assert_matches(new_qs.dgrad.scale, new_qs.dgrad.amax_history)
        # x: the recorded amax (the newest slot after the roll) is the norm output's
        ln, band, _, _ = oracle_norm(x, gamma, beta, 1e-6)
        got_amax = np.asarray(new_qs.x.amax_history)[-1]
        assert abs(got_amax - np.abs(ln).max()) <= band.max()
        x_history[0] = max(x_history[0], got_amax)
        x_history, x_scale = ref.delayed_scaling_update(x_history.reshape(-1, 1), x_scale, "e4m3", margin=margin)
        x_history = x_history.reshape(-1)
        np.testing.assert_array_equal(np.asarray(new_qs.x.scale), x_scale)
        np.testing.assert_array_equal(np.asarray(new_qs.x.amax_history), x_history)
        qs = new_qs


def test_bad_arguments_name_the_argument_and_rule():
    x, k, g = jnp.ones((16, 32), jnp.float32), jnp.ones((32, 16), jnp.float32), jnp.ones((32,), jnp.float32)
    with pytest.raises(ValueError, match="argument 'beta' must be None for norm_type 'rmsnorm'"):
        layernorm_dense(x, k, g, g, norm_type="rmsnorm")
    with pytest.raises(ValueError, match="arguments 'x' and 'kernel' must share the contracted dimension"):
        layernorm_dense(x, jnp.ones((16, 16), jnp.float32), g, g)
    with pytest.raises(ValueError, match=r"argument 'bias' must have shape \(16,\)"):
        layernorm_dense(x, k, g, g, jnp.ones((32,), jnp.float32))
    with pytest.raises(ValueError, match=r"argument 'gamma' must have shape \(32,\)"):
        layernorm_dense(x, k, jnp.ones((16,), jnp.float32), None, norm_type="rmsnorm")
    with pytest.raises(TypeError, match="argument 'quantizer_set' must be a QuantizerSet"):
        layernorm_dense(x, k, g, g, quantizer_set="fp8")
    fp8 = QuantizerFactory.create_set(recipe.DelayedScaling())
    with pytest.raises(ValueError, match="FP8 dense needs multiples of 16 .* 'x' has 8 rows"):
        layernorm_dense(jnp.ones((8, 32), jnp.float32), k, g, g, quantizer_set=fp8)
