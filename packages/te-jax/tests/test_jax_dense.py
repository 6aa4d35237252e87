"""transformer_engine.jax.dense.dense (custom VJP over te_gemm) against an
independent emulation: x, kernel and dY quantized with te-core's NumPy +
ml_dtypes oracle (transformer_engine.core.reference), dequantized, and
multiplied in float64. Forward, dgrad, wgrad and bias grad; no scaling,
current scaling and delayed scaling (whose state evolves over jitted steps
exactly as the oracle's recipe update predicts); eager and under jax.jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import EPS, DelayedOracle, assert_product, delayed_dq, dense_and_vjp, dense_inputs

from transformer_engine.common import recipe
from transformer_engine.core import reference as ref
from transformer_engine.jax.dense import dense
from transformer_engine.jax.quantize import (
    CurrentScaleQuantizer,
    DelayedScaleQuantizer,
    QuantizerFactory,
    QuantizerSet,
    ScalingMode,
    noop_quantizer_set,
)

pytestmark = [pytest.mark.gemm, pytest.mark.module]

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures
DTYPES = [np.float32, ml_dtypes.bfloat16]
BWD_FORMAT = {recipe.Format.HYBRID: "e5m2", recipe.Format.E4M3: "e4m3"}


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _rows(a) -> np.ndarray:
    """a viewed as the [M, last] matrix the GEMMs see, in float64."""
    a = _f64(a)
    return a.reshape(-1, a.shape[-1])


def _current_dq(x: np.ndarray, fmt: str, pow2: bool = False) -> np.ndarray:
    """x quantized with its own amax (reference §3.4) and dequantized, float64."""
    largest = np.float32(ml_dtypes.finfo(x.dtype).max)
    scale = ref.scale_from_amax(ref.amax(x), fmt, pow2, 0.0, value_for_inf=largest)
    return delayed_dq(x, scale, fmt)


def _assert_bias_grad(got, dy: np.ndarray, x_dtype) -> None:
    """db = sum of dY over the rows: FP32 sums, then rounded to x's type (bias is cast to it)."""
    dy64 = _f64(dy).reshape(-1, np.size(got))
    expected = dy64.sum(axis=0)
    tol = dy64.shape[0] * 2.0**-24 * np.abs(dy64).sum(axis=0) + EPS[np.dtype(x_dtype)] * np.abs(expected)
    assert np.all(np.abs(_f64(got).reshape(-1) - expected) <= tol + 1e-30)


SHAPES = [((32, 64), (64, 48)), ((2, 24, 32), (32, 16)), ((2, 16, 64), (64, 2, 16))]


@pytest.mark.parametrize("x_shape,kernel_shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_noop_dense_matches_float64(jax_device, jax_rng, x_shape, kernel_shape, dtype, jit):
    x, kernel, bias, dy = dense_inputs(jax_rng, x_shape, kernel_shape, dtype)
    y, dx, dk, db = dense_and_vjp(jax_device, x, kernel, bias, dy, noop_quantizer_set, jit)
    assert y.shape == (*x_shape[:-1], *kernel_shape[1:]) and y.dtype == dtype
    assert dx.shape == x.shape and dx.dtype == dtype
    assert dk.shape == kernel.shape and dk.dtype == np.float32 and db.dtype == np.float32
    # kernel and bias are cast to x's type first
    k64 = _f64(kernel.astype(dtype)).reshape(kernel_shape[0], -1)
    x64 = _rows(x)
    dy64 = _f64(dy).reshape(x64.shape[0], -1)
    assert_product(jax_device, y, x64, k64, False, plus=_f64(bias.astype(dtype)).reshape(-1))
    assert_product(jax_device, dx, dy64, k64.T, False)
    assert_product(jax_device, np.asarray(dk).astype(dtype).reshape(k64.shape), x64.T, dy64, False)
    _assert_bias_grad(db, dy, dtype)


@pytest.mark.parametrize("x_shape,kernel_shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fp8_format", [recipe.Format.HYBRID, recipe.Format.E4M3], ids=lambda f: f.name)
@pytest.mark.parametrize("pow2", [False, True], ids=["fp32_scales", "pow2_scales"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_current_scaling_dense_matches_emulation(
    jax_device, jax_rng, x_shape, kernel_shape, dtype, fp8_format, pow2, jit
):
    qs = QuantizerFactory.create_set(recipe.Float8CurrentScaling(fp8_format=fp8_format, use_power_2_scales=pow2))
    x, kernel, bias, dy = dense_inputs(jax_rng, x_shape, kernel_shape, dtype, x_range=30.0)
    y, dx, dk, db = dense_and_vjp(jax_device, x, kernel, bias, dy, qs, jit)
    assert y.shape == (*x_shape[:-1], *kernel_shape[1:]) and y.dtype == dtype
    assert dx.shape == x.shape and dk.shape == kernel.shape and db.shape == bias.shape
    # Emulation: forward tensors E4M3, dY in the recipe's backward format; scales from each tensor's amax.
    x_dq = _current_dq(x, "e4m3", pow2).reshape(-1, x_shape[-1])
    k_dq = _current_dq(kernel.astype(dtype), "e4m3", pow2).reshape(kernel_shape[0], -1)
    dy_dq = _current_dq(dy, BWD_FORMAT[fp8_format], pow2).reshape(x_dq.shape[0], -1)
    assert_product(jax_device, y, x_dq, k_dq, True, plus=_f64(bias.astype(dtype)).reshape(-1))
    assert_product(jax_device, dx, dy_dq, k_dq.T, True)
    assert_product(jax_device, np.asarray(dk).astype(dtype).reshape(k_dq.shape), x_dq.T, dy_dq, True)
    _assert_bias_grad(db, dy, dtype)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fp8_format", [recipe.Format.HYBRID, recipe.Format.E4M3], ids=lambda f: f.name)
def test_delayed_scaling_state_evolves_over_jitted_steps(jax_device, jax_rng, algo, fp8_format):
    history_len, margin = 4, 1
    qs = QuantizerFactory.create_set(
        recipe.DelayedScaling(
            margin=margin, fp8_format=fp8_format, amax_history_len=history_len, amax_compute_algo=algo
        )
    )
    qs = jax.device_put(qs, jax_device)
    oracles = {
        name: DelayedOracle(fmt, history_len, margin, algo)
        for name, fmt in (("x", "e4m3"), ("kernel", "e4m3"), ("dgrad", BWD_FORMAT[fp8_format]))
    }

    @jax.jit
    def train_step(params, quantizer_set, x, dy):
        def loss(params, quantizer_set, x):
            y = dense(x, params[0], params[1], quantizer_set=quantizer_set)
            return jnp.sum(y * dy), y  # dL/dy = dy

        return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(params, quantizer_set, x)

    put = lambda a: jax.device_put(jnp.asarray(a), jax_device)  # noqa: E731
    # Magnitudes grow every step (x saturates E4M3 at the initial scale 1, the kernel
    # underflows it), so every scale changes, also under "max", and a forward or
    # backward using a stale or a fresh scale would show.
    for x_range, k_range, dy_range in ((1000.0, 1e-3, 1e-3), (1e4, 2.0, 1.0), (1e5, 50.0, 1e5)):
        x, kernel, bias, dy = dense_inputs(jax_rng, (2, 16, 32), (32, 48), np.float32, x_range)
        kernel, dy = kernel * np.float32(k_range), dy * np.float32(dy_range)
        old_scales = {name: o.scale.copy() for name, o in oracles.items()}
        ((dk, db), new_qs, dx), y = train_step((put(kernel), put(bias)), qs, put(x), put(dy))
        x_dq = oracles["x"].quantize_and_update(x).reshape(-1, 32)
        k_dq = oracles["kernel"].quantize_and_update(kernel)
        dy_dq = oracles["dgrad"].quantize_and_update(dy).reshape(-1, 48)
        assert all(not np.array_equal(old_scales[name], o.scale) for name, o in oracles.items())
        assert_product(jax_device, y, x_dq, k_dq, True, plus=_f64(bias))
        assert_product(jax_device, dx, dy_dq, k_dq.T, True)
        assert_product(jax_device, dk, x_dq.T, dy_dq, True)
        _assert_bias_grad(db, dy, np.float32)
        for name, oracle in oracles.items():
            oracle.assert_matches(getattr(new_qs, name).scale, getattr(new_qs, name).amax_history)
        qs = new_qs  # the state for the next step: the quantizer set's "gradient"


def test_quantizer_sets_from_recipes():
    delayed = QuantizerFactory.create_set(
        recipe.DelayedScaling(
            margin=2, fp8_format=recipe.Format.E4M3, amax_history_len=8, amax_compute_algo="most_recent"
        )
    )
    assert delayed.scaling_mode is ScalingMode.DELAYED_TENSOR_SCALING
    for q in (delayed.x, delayed.kernel, delayed.dgrad):
        assert isinstance(q, DelayedScaleQuantizer) and q.q_dtype == jnp.float8_e4m3fn
        assert (q.margin, q.amax_compute_algo) == (2.0, "most_recent")
        np.testing.assert_array_equal(np.asarray(q.scale), np.ones(1, np.float32))
        np.testing.assert_array_equal(np.asarray(q.amax_history), np.zeros(8, np.float32))
    assert len(jax.tree_util.tree_leaves(delayed)) == 6  # scale and history of each; the rest is static
    hybrid = QuantizerFactory.create_set(recipe.DelayedScaling())
    assert hybrid.x.q_dtype == jnp.float8_e4m3fn and hybrid.dgrad.q_dtype == jnp.float8_e5m2
    assert hybrid.x.amax_history.shape == (1024,)
    current = QuantizerFactory.create_set(recipe.Float8CurrentScaling(use_power_2_scales=True))
    assert current.scaling_mode is ScalingMode.CURRENT_TENSOR_SCALING
    assert isinstance(current.kernel, CurrentScaleQuantizer) and current.kernel.power_2_scale
    assert current.dgrad.q_dtype == jnp.float8_e5m2 and jax.tree_util.tree_leaves(current) == []
    one = QuantizerFactory.create(ScalingMode.DELAYED_TENSOR_SCALING, jnp.float8_e5m2, margin=1.0)
    assert isinstance(one, DelayedScaleQuantizer) and one.q_dtype == jnp.float8_e5m2 and one.margin == 1.0
    assert QuantizerFactory.create(ScalingMode.NO_SCALING) is None
    assert QuantizerFactory.create_set() is noop_quantizer_set
    assert noop_quantizer_set.is_noop and noop_quantizer_set.scaling_mode is ScalingMode.NO_SCALING


def test_bad_arguments_name_the_argument_and_rule():
    x = jnp.ones((16, 32), jnp.float32)
    kernel = jnp.ones((32, 16), jnp.float32)
    with pytest.raises(TypeError, match="argument 'x' must be one of float32, bfloat16, float16, got int32"):
        dense(x.astype(jnp.int32), kernel)
    with pytest.raises(TypeError, match="argument 'kernel' must be one of"):
        dense(x, kernel.astype(jnp.float8_e4m3fn))
    with pytest.raises(ValueError, match=r"argument 'kernel' must be \[in, out...\] \(at least 2 dims\)"):
        dense(x, jnp.ones((32,), jnp.float32))
    with pytest.raises(ValueError, match="arguments 'x' and 'kernel' must share the contracted dimension"):
        dense(x, jnp.ones((16, 16), jnp.float32))
    with pytest.raises(ValueError, match=r"argument 'bias' must have shape \(16,\)"):
        dense(x, kernel, jnp.ones((32,), jnp.float32))
    with pytest.raises(ValueError, match=r"argument 'contracting_dims' must be \(\(x.ndim - 1,\), \(0,\)\)"):
        dense(x, jnp.ones((16, 16), jnp.float32), contracting_dims=((0,), (0,)))
    with pytest.raises(ValueError, match="argument 'contracting_dims' must be"):
        dense(x, kernel, contracting_dims=((5,), (0,)))
    dense(x, kernel, contracting_dims=((-1,), (0,)))  # the default, spelled another way
    with pytest.raises(TypeError, match="argument 'quantizer_set' must be a QuantizerSet, got str"):
        dense(x, kernel, quantizer_set="fp8")
    with pytest.raises(ValueError, match="argument 'quantizer_set' must have all of x, kernel and dgrad"):
        dense(x, kernel, quantizer_set=QuantizerSet(x=CurrentScaleQuantizer()))
    fp8 = QuantizerFactory.create_set(recipe.Float8CurrentScaling())
    with pytest.raises(ValueError, match="FP8 dense needs multiples of 16 .* 'x' has 8 rows"):
        dense(jnp.ones((8, 32), jnp.float32), kernel, quantizer_set=fp8)
    bad_history = QuantizerSet(*(DelayedScaleQuantizer(amax_history=jnp.zeros((4, 1), jnp.float32)),) * 3)
    with pytest.raises(ValueError, match=r"argument 'amax_history' of DelayedScaleQuantizer must be float32 of shape"):
        dense(x, kernel, quantizer_set=bad_history)


def test_bad_recipes_for_quantizer_sets():
    with pytest.raises(TypeError, match="argument 'recipe' must be None or a transformer_engine.common.recipe"):
        QuantizerFactory.create_set("delayed")
    with pytest.raises(NotImplementedError, match="CustomRecipe is not supported by te-jax yet"):
        QuantizerFactory.create_set(recipe.CustomRecipe(qfactory=lambda role: None))
    with pytest.raises(NotImplementedError, match="callables are not supported"):
        QuantizerFactory.create_set(recipe.DelayedScaling(amax_compute_algo=lambda history: history[0]))
    with pytest.raises(ValueError, match="argument 'scaling_mode' must be a ScalingMode"):
        QuantizerFactory.create("delayed", jnp.float8_e4m3fn)
