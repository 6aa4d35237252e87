"""transformer_engine.jax.layernorm_mlp.layernorm_mlp and
transformer_engine.jax.activation.activation.

- activation: every activation_type tuple, forward and jax.grad against te-core's
  float64 oracle (reference_activation), eager and jit.
- layernorm_mlp, high precision: forward and every gradient against a float64
  NumPy MLP (norm oracle, activation oracle, float64 GEMMs), every activation,
  both norms, odd shapes.
- FP8: bit-equal (outputs, gradients, quantizer states over jitted steps) to the
  composition dense(activation(layernorm_dense(x))) of separately tested ops for
  float32 inputs, where the fused FP8 writes of the norm and activation equal
  quantizing their stored outputs (db1 within FP32 summation-order error: the
  fused one is the activation kernel's documented order); the kernel and dgrad
  quantizer states exactly as te-core's oracle recipe update; the forward against
  an FP8 emulation in float64 within the GEMM bounds and FP8 rounding-boundary
  allowances.
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
from transformer_engine.core import reference_activation as ra
from transformer_engine.jax.activation import ACTIVATION_KINDS, activation
from transformer_engine.jax.dense import dense
from transformer_engine.jax.layernorm_dense import layernorm_dense
from transformer_engine.jax.layernorm_mlp import layernorm_mlp
from transformer_engine.jax.quantize import QuantizerFactory, noop_quantizer_set

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures
ACTS = pytest.mark.parametrize("act", list(ACTIVATION_KINDS), ids="-".join)
NORM_TYPES = pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
RECIPES = {"delayed": recipe.DelayedScaling(amax_history_len=4), "current": recipe.Float8CurrentScaling()}


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


@ACTS
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_activation_forward_and_grad_match_oracle(jax_device, jax_rng, act, dtype, jit):
    kind = ACTIVATION_KINDS[act]
    x = (jax_rng.standard_normal((3, 5, len(act), 24)) * 3.0).astype(dtype)
    dy = jax_rng.standard_normal((3, 5, 24)).astype(dtype)

    def run(x, dy):
        y, vjp = jax.vjp(lambda x: activation(x, act), x)
        return y, vjp(dy)[0]

    y, dx = (jax.jit(run) if jit else run)(put(x, jax_device), put(dy, jax_device))
    assert y.shape == dy.shape and y.dtype == dtype and dx.shape == x.shape and dx.dtype == dtype
    flat = x.reshape(3, 5, -1)  # (..., ACT_DIM * K): the [activated | linear] halves
    want = ra.forward(flat, kind)
    want_dx = ra.backward(dy, flat, kind).reshape(x.shape)
    unit = EPS[np.dtype(dtype)]
    # FP32 arithmetic (a few ulps of the terms), then one rounding to the output type
    scale = np.abs(want) + np.abs(f64(flat[..., : want.shape[-1]]))
    assert (np.abs(f64(y) - want) <= unit * np.abs(want) + 2.0**-20 * scale + 1e-30).all()
    # each term of f'(a) lin(b) and f(a) lin'(b) is below (1 + |a|)^2 (1 + |b|) (srelu: 2|a|, a^2)
    xa, xb = np.abs(f64(x[..., 0, :])), np.abs(f64(x[..., -1, :]))
    scale_dx = (np.abs(f64(dy)) * (1.0 + xa) ** 2 * (1.0 + xb))[..., None, :]
    assert (np.abs(f64(dx) - want_dx) <= unit * np.abs(want_dx) + 2.0**-20 * scale_dx + 1e-30).all()


def test_activation_spellings_and_errors():
    x = jnp.ones((4, 2, 8), jnp.float32)
    np.testing.assert_array_equal(activation(x, ("linear", "gelu")), activation(x, ("GELU", "linear")))
    limited = activation(x * 10, ("clamped_silu", "clamped_linear"), act_params={"limit": 2.0, "alpha": 1.0})
    np.testing.assert_allclose(
        np.asarray(limited), ra.forward(np.full((4, 16), 10.0), "clamped_swiglu", limit=2.0, alpha=1.0)
    )
    with pytest.raises(ValueError, match=r"argument 'x' must have shape \(\.\.\., 1, K\)"):
        activation(x, ("gelu",))
    with pytest.raises(ValueError, match="argument 'activation_type' must be one of"):
        activation(x, ("tanh", "linear"))
    with pytest.raises(TypeError, match="argument 'activation_type' must be a tuple of names"):
        activation(x, "gelu")
    with pytest.raises(ValueError, match="argument 'activation_params' is only for clamped_swiglu"):
        activation(x, ("silu", "linear"), act_params={"limit": 1.0})
    with pytest.raises(NotImplementedError, match="argument 'quantizer' is not yet supported"):
        activation(x, ("gelu", "linear"), quantizer=object())


def mlp_inputs(rng, x_shape, inter, out, act, norm_type, dtype=np.float32, zcg=False):
    hidden, n = x_shape[-1], len(act)
    x = (rng.standard_normal(x_shape) * 2.0 + 0.5).astype(dtype)
    gamma = (rng.standard_normal(hidden) * 0.3 + (0.0 if zcg else 1.0)).astype(np.float32)
    beta = (rng.standard_normal(hidden) * 0.3).astype(np.float32) if norm_type == "layernorm" else None
    w1 = (rng.standard_normal((hidden, n, inter)) / np.sqrt(hidden)).astype(np.float32)
    w2 = (rng.standard_normal((inter, out)) / np.sqrt(inter)).astype(np.float32)
    b1 = rng.standard_normal((n, inter)).astype(np.float32) * 0.5
    b2 = rng.standard_normal(out).astype(np.float32)
    dy = rng.standard_normal((*x_shape[:-1], out)).astype(dtype)
    return x, gamma, beta, w1, w2, b1, b2, dy


def float64_mlp(x, gamma, beta, w1, w2, b1, b2, dy, kind, zcg, eps):
    """(y, dx, dgamma, dbeta, dw1, dw2, db1, db2) of the MLP in float64 NumPy."""
    x2 = f64(x).reshape(-1, x.shape[-1])
    if beta is not None:
        ln, mu, rs = nref.layernorm_fwd(x2, gamma, beta, eps, zcg)
    else:
        (ln, rs), mu = nref.rmsnorm_fwd(x2, gamma, eps, zcg), None
    w1f = f64(w1).reshape(w1.shape[0], -1)
    h = ln @ w1f + f64(b1).reshape(-1)
    a = ra.forward(h, kind)
    y = a @ f64(w2) + f64(b2)
    dy2 = f64(dy).reshape(y.shape)
    dh = ra.backward(dy2 @ f64(w2).T, h, kind)
    dln = dh @ w1f.T
    if beta is not None:
        dx, dg, db = nref.layernorm_bwd(dln, x2, mu, rs, gamma, zcg)
    else:
        (dx, dg), db = nref.rmsnorm_bwd(dln, x2, rs, gamma, zcg), None
    dw1 = (ln.T @ dh).reshape(w1.shape)
    return y, dx, dg, db, dw1, a.T @ dy2, dh.sum(0).reshape(b1.shape), dy2.sum(0)


def run_mlp(device, args, dy, sets, norm_type, act, zcg=False, jit=True):
    """(y, (dx, dgamma, dbeta, dw1, dw2, db1, db2), quantizer_sets cotangent) of layernorm_mlp."""

    def step(args, sets, dy):
        def fn(x, g, b, w1, w2, b1, b2, sets):
            return layernorm_mlp(
                x, g, b, [w1, w2], [b1, b2], norm_type, zcg, 1e-6, activation_type=act, quantizer_sets=sets
            )

        y, vjp = jax.vjp(fn, *args, sets)
        grads = vjp(dy)
        return y, grads[:-1], grads[-1]

    args = [None if a is None else put(a, device) for a in args]
    return (jax.jit(step) if jit else step)(args, jax.device_put(sets, device), put(dy, device))


@ACTS
@NORM_TYPES
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
def test_high_precision_matches_float64(jax_device, jax_rng, act, norm_type, zcg):
    x, gamma, beta, w1, w2, b1, b2, dy = mlp_inputs(jax_rng, (3, 5, 24), 10, 20, act, norm_type, zcg=zcg)
    args = (x, gamma, beta, w1, w2, b1, b2)
    y, grads, _ = run_mlp(jax_device, args, dy, (noop_quantizer_set,) * 2, norm_type, act, zcg, jit=zcg)
    want = float64_mlp(*args, dy, ACTIVATION_KINDS[act], zcg, 1e-6)
    assert y.shape == dy.shape and y.dtype == np.float32
    names = ("y", "dx", "dgamma", "dbeta", "dw1", "dw2", "db1", "db2")
    for got, expected, what in zip((y, *grads), want, names):
        if expected is None:
            assert got is None, what
            continue
        # FP32 norm, GEMMs and activations against float64: 1e-4 of the result's scale
        np.testing.assert_allclose(
            f64(got).reshape(expected.shape), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max(), err_msg=what
        )


def composed_mlp(device, args, dy, sets, norm_type, act):
    """The same as run_mlp through layernorm_dense, activation and dense."""

    def step(args, sets, dy):
        def fn(x, g, b, w1, w2, b1, b2, sets):
            h = layernorm_dense(x, w1, g, b, b1, norm_type, False, 1e-6, quantizer_set=sets[0])
            return dense(activation(h, act), w2, b2, quantizer_set=sets[1])

        y, vjp = jax.vjp(fn, *args, sets)
        grads = vjp(dy)
        return y, grads[:-1], grads[-1]

    args = [None if a is None else put(a, device) for a in args]
    return jax.jit(step)(args, jax.device_put(sets, device), put(dy, device))


@pytest.mark.parametrize(
    "act", [("gelu",), ("silu", "linear"), ("squared_relu", "linear"), ("clamped_silu", "clamped_linear")], ids="-".join
)
@NORM_TYPES
@pytest.mark.parametrize("name", ["delayed", "current"])
def test_fp8_equals_composition_over_jitted_steps(jax_device, jax_rng, act, norm_type, name):
    sets = (QuantizerFactory.create_set(RECIPES[name]), QuantizerFactory.create_set(RECIPES[name]))
    composed_sets = sets
    oracles = [DelayedOracle("e4m3", 4, 0.0, "max") for _ in range(2)]  # the two kernels'
    grad_oracle = DelayedOracle("e5m2", 4, 0.0, "max")  # FC2's dgrad quantizer sees dY itself
    for step_range in (1.0, 30.0, 1e-2):
        x, gamma, beta, w1, w2, b1, b2, dy = mlp_inputs(jax_rng, (2, 16, 32), 48, 32, act, norm_type)
        w1, dy = w1 * np.float32(step_range), dy * np.float32(step_range)
        args = (x, gamma, beta, w1, w2, b1, b2)
        y, grads, new_sets = run_mlp(jax_device, args, dy, sets, norm_type, act)
        y_c, grads_c, new_sets_c = composed_mlp(jax_device, args, dy, composed_sets, norm_type, act)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(y_c))
        for i, (got, want) in enumerate(zip(grads, grads_c)):
            if i == 5:  # db1: the activation kernel's FP32 order vs dense's jnp.sum
                dh_abs = np.abs(f64(want)).max() + 1.0
                np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5 * dh_abs)
            elif want is not None:
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        for a, b in zip(jax.tree_util.tree_leaves(new_sets), jax.tree_util.tree_leaves(new_sets_c)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        if name == "delayed":
            for oracle, kernel, qs in zip(oracles, (w1.reshape(32, -1), w2), new_sets):
                oracle.quantize_and_update(kernel)
                oracle.assert_matches(qs.kernel.scale, qs.kernel.amax_history)
            grad_oracle.quantize_and_update(dy)
            grad_oracle.assert_matches(new_sets[1].dgrad.scale, new_sets[1].dgrad.amax_history)
            assert not np.array_equal(np.asarray(new_sets[0].x.amax_history), np.asarray(sets[0].x.amax_history))
        sets, composed_sets = new_sets, new_sets_c


@pytest.mark.parametrize(
    "act", [("gelu",), ("silu", "linear"), ("relu", "linear"), ("clamped_silu", "clamped_linear")], ids="-".join
)
@NORM_TYPES
def test_fp8_forward_matches_emulation(jax_device, jax_rng, act, norm_type):
    """Delayed scaling at its initial scales (1): norm output, W1, the activation
    output and W2 quantized to E4M3 in float64, each FP8 value known up to the
    rounding-boundary allowance of its float64 band."""
    kind = ACTIVATION_KINDS[act]
    x, gamma, beta, w1, w2, b1, b2, _ = mlp_inputs(jax_rng, (3, 16, 32), 32, 16, act, norm_type)
    sets = (QuantizerFactory.create_set(RECIPES["delayed"]),) * 2
    y = jax.jit(lambda *a: layernorm_mlp(*a[:3], a[3:5], a[5:], norm_type, activation_type=act, quantizer_sets=sets))(
        *(None if a is None else put(a, jax_device) for a in (x, gamma, beta, w1, w2, b1, b2))
    )
    x2 = f64(x).reshape(-1, 32)
    if beta is not None:
        ln, mu, rs = nref.layernorm_fwd(x2, gamma, beta, 1e-6)
    else:
        (ln, rs), mu = nref.rmsnorm_fwd(x2, gamma, 1e-6), None
    band = nref.forward_bounds(beta is not None, x2, gamma, beta, 1e-6, False, ln, mu, rs, np.float32)[0]
    ln_dq, ln_allow = fp8_dq_within(ln, band, 1.0, "e4m3")
    w1_dq = f64(ref.dequantize_fp8(ref.quantize_fp8(w1.reshape(32, -1), 1.0, "e4m3"), 1.0, "e4m3"))
    w2_dq = f64(ref.dequantize_fp8(ref.quantize_fp8(w2, 1.0, "e4m3"), 1.0, "e4m3"))
    h = ln_dq @ w1_dq + f64(b1).reshape(-1)
    h_tol = gemm_tolerance(jax_device, ln_dq, w1_dq, np.float32, True) + ln_allow @ np.abs(w1_dq)
    h_tol = h_tol + 2.0**-24 * np.abs(h)  # the bias epilogue's rounding
    a = ra.forward(h, kind)
    # |act(h') - act(h)| for |h' - h| <= h_tol: every kind's slopes are below 4 (1 + |h|) times
    # the other half's magnitude (+1), so this band is generous and still tiny next to FP8's steps.
    p, q = ra.split(h) if kind in ra.GATED else (h, np.ones_like(h))
    tp, tq = ra.split(h_tol) if kind in ra.GATED else (h_tol, np.zeros_like(h))
    a_band = 4.0 * (1.0 + np.abs(p) + np.abs(q)) * (
        (np.abs(q) + 1.0) * tp + (np.abs(p) + 1.0) * tq
    ) + 2.0**-23 * np.abs(a)
    a_dq, a_allow = fp8_dq_within(a, a_band, 1.0, "e4m3")
    want = a_dq @ w2_dq + f64(b2)
    tol = gemm_tolerance(jax_device, a_dq, w2_dq, np.float32, True) + a_allow @ np.abs(w2_dq) + 2.0**-24 * np.abs(want)
    err = np.abs(f64(y).reshape(want.shape) - want)
    assert (err <= tol).all(), f"max error {err.max()} (tolerance there {tol.flat[err.argmax()]})"


def test_bad_arguments_name_the_argument_and_rule():
    x, g = jnp.ones((16, 32), jnp.float32), jnp.ones((32,), jnp.float32)
    w1, w2 = jnp.ones((32, 2, 16), jnp.float32), jnp.ones((16, 32), jnp.float32)
    ok = dict(activation_type=("gelu", "linear"))
    layernorm_mlp(x, g, g, [w1, w2], [None, None], "layernorm", **ok)
    with pytest.raises(ValueError, match=r"argument 'kernels\[0\]' must be \[hidden, 1, intermediate\]"):
        layernorm_mlp(x, g, g, [w1, w2], [None, None], "layernorm")
    with pytest.raises(ValueError, match=r"argument 'kernels\[1\]' must be \[intermediate=16, out\]"):
        layernorm_mlp(x, g, g, [w1, w2.T], [None, None], "layernorm", **ok)
    with pytest.raises(ValueError, match=r"argument 'biases\[0\]' must have shape \(2, 16\)"):
        layernorm_mlp(x, g, g, [w1, w2], [jnp.ones(32), None], "layernorm", **ok)
    with pytest.raises(ValueError, match=r"argument 'bias' must have shape \(32,\)"):
        layernorm_mlp(x, g, g, [w1, w2], [None, jnp.ones(16)], "layernorm", **ok)
    with pytest.raises(ValueError, match="argument 'kernels' must be a sequence of two"):
        layernorm_mlp(x, g, g, [w1], [None, None], "layernorm", **ok)
    with pytest.raises(ValueError, match="argument 'beta' must be None for norm_type 'rmsnorm'"):
        layernorm_mlp(x, g, g, [w1, w2], [None, None], "rmsnorm", **ok)
    with pytest.raises(ValueError, match="argument 'activation_type' must be one of"):
        layernorm_mlp(x, g, g, [w1, w2], [None, None], "layernorm", activation_type=("swish", "linear"))
    fp8 = (QuantizerFactory.create_set(recipe.DelayedScaling()),) * 2
    with pytest.raises(ValueError, match="FP8 dense needs multiples of 16 .* 'x' has 8 rows"):
        layernorm_mlp(jnp.ones((8, 32)), g, g, [w1, w2], [None, None], "layernorm", quantizer_sets=fp8, **ok)
