"""transformer_engine.jax.flax.DenseGeneral: without FP8 against
flax.linen.DenseGeneral with the same params (forward and gradients); under an
FP8 autocast bit-equal to transformer_engine.jax.dense.dense called with the
equivalent quantizer set; and the README training loop (fp8_metas split out of
params, value_and_grad over both, update_collections) whose delayed-scaling
state evolves over jitted steps exactly as te-core's NumPy oracle
(transformer_engine.core.reference) predicts."""

from __future__ import annotations

import contextlib

import pytest

flax = pytest.importorskip("flax")

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax_helpers import EPS, DelayedOracle

import transformer_engine.jax as te_jax
from transformer_engine.common import recipe
from transformer_engine.jax import flax as te_flax
from transformer_engine.jax.dense import dense
from transformer_engine.jax.quantize import QuantizerFactory, QuantizerSet

pytestmark = pytest.mark.module

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures
FEATURES = [48, (2, 16)]
BWD_FORMAT = {recipe.Format.HYBRID: "e5m2", recipe.Format.E4M3: "e4m3"}
QUANTIZER_VARIABLES = {"x": "x", "kernel": "kernel", "dgrad": "grad"}  # QuantizerSet field -> fp8_metas prefix


def _loss_and_grads(apply, params, x, dy):
    """(y, d params, dx) of sum(apply(params, x) * dy), i.e. dL/dy = dy."""

    def loss(params, x):
        y = apply(params, x)
        return jnp.sum(y.astype(jnp.float32) * dy), y

    (_, y), (dparams, dx) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    return y, dparams, dx


def _inputs(rng, x_shape, features):
    features = features if isinstance(features, tuple) else (features,)
    x = rng.standard_normal(x_shape).astype(np.float32)
    dy = rng.standard_normal((*x_shape[:-1], *features)).astype(np.float32)
    return x, dy


@pytest.mark.parametrize("features", FEATURES, ids=str)
@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("context", ["none", "disabled"])
def test_high_precision_matches_flax(jax_device, jax_rng, features, use_bias, context):
    x, dy = _inputs(jax_rng, (2, 8, 32), features)
    bias_init = nn.initializers.normal(1.0)  # not zeros: a bias that is dropped or misplaced shows
    ours = te_flax.DenseGeneral(features=features, use_bias=use_bias, bias_init=bias_init)
    # HIGHEST: XLA may otherwise run FP32 dots in TF32 on a GPU (te_gemm's FP32 GEMM is FP32).
    theirs = nn.DenseGeneral(
        features=features, use_bias=use_bias, bias_init=bias_init, precision=jax.lax.Precision.HIGHEST
    )
    autocast = te_jax.autocast(enabled=False, recipe=recipe.DelayedScaling())
    with jax.default_device(jax_device), autocast if context == "disabled" else contextlib.nullcontext():
        variables = ours.init(jax.random.PRNGKey(0), x)
        assert set(variables) == {"params"}  # no fp8_metas without FP8
        # Same parameter layout and the same default kernel init (Flax's lecun_normal: fan_in, truncated normal).
        reference = theirs.init(jax.random.PRNGKey(0), x)
        assert jax.tree_util.tree_structure(variables) == jax.tree_util.tree_structure(reference)
        np.testing.assert_array_equal(variables["params"]["kernel"], reference["params"]["kernel"])
        got = _loss_and_grads(lambda p, x: ours.apply({"params": p}, x), variables["params"], x, dy)
        want = _loss_and_grads(lambda p, x: theirs.apply({"params": p}, x), variables["params"], x, dy)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert a.shape == b.shape and a.dtype == b.dtype
        # FP32 GEMMs both (te_gemm vs XLA's dot): accumulation order only.
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5 * np.abs(np.asarray(b)).max())


@pytest.mark.parametrize("features", FEATURES, ids=str)
def test_init_creates_fp8_metas_for_delayed_scaling_only(features):
    x = jnp.ones((2, 16, 32), jnp.float32)
    model = te_flax.DenseGeneral(features=features, dtype=jnp.bfloat16)
    out = features if isinstance(features, tuple) else (features,)
    delayed = recipe.DelayedScaling(amax_history_len=8, fp8_format=recipe.Format.E4M3)
    with te_jax.autocast(enabled=True, recipe=delayed):
        variables = model.init(jax.random.PRNGKey(0), x)
    assert variables["params"]["kernel"].shape == (32, *out) and variables["params"]["kernel"].dtype == jnp.bfloat16
    assert variables["params"]["bias"].shape == out and variables["params"]["bias"].dtype == jnp.bfloat16
    metas = variables[te_jax.NVTE_FP8_COLLECTION_NAME]
    assert set(metas) == {f"{p}_{f}" for p in ("x", "kernel", "grad") for f in ("scale", "amax_history")}
    for prefix in ("x", "kernel", "grad"):
        np.testing.assert_array_equal(metas[f"{prefix}_scale"], np.ones(1, np.float32))
        np.testing.assert_array_equal(metas[f"{prefix}_amax_history"], np.zeros(8, np.float32))
    with te_jax.autocast(enabled=True, recipe=recipe.Float8CurrentScaling()):
        assert set(model.init(jax.random.PRNGKey(0), x)) == {"params"}  # current scaling keeps no state


def _state_set(fp8_recipe, metas) -> QuantizerSet:
    """QuantizerFactory's set for the recipe, with the fp8_metas state put in (delayed scaling)."""
    qs = QuantizerFactory.create_set(fp8_recipe)
    if metas is None:
        return qs
    fields = {}
    for field, prefix in QUANTIZER_VARIABLES.items():
        q = getattr(qs, field)
        fields[field] = type(q)(
            scale=metas[f"{prefix}_scale"],
            amax_history=metas[f"{prefix}_amax_history"],
            q_dtype=q.q_dtype,
            margin=q.margin,
            amax_compute_algo=q.amax_compute_algo,
        )
    return QuantizerSet(**fields)


FP8_RECIPES = [
    recipe.DelayedScaling(amax_history_len=4, margin=1, amax_compute_algo="most_recent"),
    recipe.DelayedScaling(amax_history_len=16, fp8_format=recipe.Format.E4M3),
    recipe.Float8CurrentScaling(),
]


@pytest.mark.parametrize("fp8_recipe", FP8_RECIPES, ids=["delayed_hybrid", "delayed_e4m3", "current"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
def test_fp8_equals_dense_with_the_same_quantizer_set(jax_device, jax_rng, fp8_recipe, dtype):
    x, dy = _inputs(jax_rng, (2, 16, 32), 48)
    x, dy = (x * 100).astype(dtype), dy.astype(dtype)
    model = te_flax.DenseGeneral(features=48, bias_init=nn.initializers.normal(1.0))
    with jax.default_device(jax_device), te_jax.autocast(enabled=True, recipe=fp8_recipe):
        variables = model.init(jax.random.PRNGKey(0), x)
        other, params = flax.core.pop(variables, "params")
        metas = other.get(te_jax.NVTE_FP8_COLLECTION_NAME)
        if metas is not None:  # a state that is not the initial one: scales 2^-3, histories of random amaxes
            metas = jax.tree_util.tree_map(
                lambda a: (
                    jnp.full_like(a, 0.125) if a.shape == (1,) else jnp.asarray(jax_rng.random(a.shape) * 50, a.dtype)
                ),
                metas,
            )
            other = {**other, te_jax.NVTE_FP8_COLLECTION_NAME: metas}

        @jax.jit
        def with_module(params, other, x):
            def loss(params, other, x):
                y = model.apply({"params": params, **other}, x)
                return jnp.sum(y.astype(jnp.float32) * dy), y

            return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(params, other, x)

        @jax.jit
        def with_dense(params, qs, x):
            def loss(params, qs, x):
                y = dense(x, params["kernel"], params["bias"], quantizer_set=qs)
                return jnp.sum(y.astype(jnp.float32) * dy), y

            return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(params, qs, x)

        (dparams, dother, dx), y = with_module(params, other, x)
        (want_dparams, new_qs, want_dx), want_y = with_dense(params, _state_set(fp8_recipe, metas), x)
    for got, want in ((y, want_y), (dx, want_dx), (dparams["kernel"], want_dparams["kernel"])):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # The bias gradient is an XLA reduction (not a te-core call), whose order XLA may pick per program:
    # equal within FP32 reordering of the row sums and one rounding to x's type.
    dy_rows = np.abs(dy.astype(np.float64)).reshape(-1, 48)
    tol = dy_rows.shape[0] * 2.0**-24 * dy_rows.sum(axis=0) + 2 * EPS[np.dtype(dtype)] * np.abs(want_dparams["bias"])
    assert (np.abs(np.asarray(dparams["bias"]) - np.asarray(want_dparams["bias"])) <= tol).all()
    if metas is None:
        assert not jax.tree_util.tree_leaves(dother)
        return
    # The fp8_metas "gradient" is the updated state, as dense's quantizer set cotangent.
    got_metas = dother[te_jax.NVTE_FP8_COLLECTION_NAME]
    for field, prefix in QUANTIZER_VARIABLES.items():
        np.testing.assert_array_equal(got_metas[f"{prefix}_scale"], getattr(new_qs, field).scale)
        np.testing.assert_array_equal(got_metas[f"{prefix}_amax_history"], getattr(new_qs, field).amax_history)
        assert not np.array_equal(got_metas[f"{prefix}_scale"], metas[f"{prefix}_scale"])  # it did change


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fp8_format", [recipe.Format.HYBRID, recipe.Format.E4M3], ids=lambda f: f.name)
def test_readme_training_loop_updates_fp8_metas_as_the_oracle(jax_device, jax_rng, algo, fp8_format):
    history_len, margin, lr = 4, 1, 1e-3
    fp8_recipe = recipe.DelayedScaling(
        margin=margin, fp8_format=fp8_format, amax_history_len=history_len, amax_compute_algo=algo
    )
    oracles = {
        "x": DelayedOracle("e4m3", history_len, margin, algo),
        "kernel": DelayedOracle("e4m3", history_len, margin, algo),
        "grad": DelayedOracle(BWD_FORMAT[fp8_format], history_len, margin, algo),
    }
    # Growing magnitudes: every scale changes at every step (also under "max").
    ranges = ((1000.0, 1e-3), (1e4, 1.0), (1e5, 1e5))
    with jax.default_device(jax_device), te_jax.autocast(enabled=True, recipe=fp8_recipe):
        model = te_flax.DenseGeneral(features=48)
        variables = model.init(jax.random.PRNGKey(0), jnp.zeros((2, 16, 32), jnp.float32))
        other_vars, params = flax.core.pop(variables, "params")

        def loss_fn(params, other_vars, x, dy):
            y = model.apply({"params": params, **other_vars}, x)
            return jnp.sum(y * dy)  # dL/dy = dy

        @jax.jit
        def train_step(params, other_vars, x, dy):
            loss, (param_grads, other_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, other_vars, x, dy)
            params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, param_grads)
            return loss, params, other_grads

        for x_range, dy_range in ranges:
            x, dy = _inputs(jax_rng, (2, 16, 32), 48)
            x, dy = x * np.float32(x_range), dy * np.float32(dy_range)
            kernel = np.asarray(params["kernel"])  # the kernel this step quantizes
            _, params, other_grads = train_step(params, other_vars, x, dy)
            other_vars = te_jax.update_collections(other_grads, other_vars)
            oracles["x"].quantize_and_update(x)
            oracles["kernel"].quantize_and_update(kernel)
            oracles["grad"].quantize_and_update(dy)
            metas = other_vars[te_jax.NVTE_FP8_COLLECTION_NAME]
            for prefix, oracle in oracles.items():
                oracle.assert_matches(metas[f"{prefix}_scale"], metas[f"{prefix}_amax_history"])
    assert all(o.scale[0] != 1.0 for o in oracles.values())


def test_bad_fields_and_states():
    x = jnp.ones((2, 16, 32), jnp.float32)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match=r"field 'axis' of DenseGeneral must be -1 .* got 0 for inputs of 3 dims"):
        te_flax.DenseGeneral(features=16, axis=0).init(key, x)
    with pytest.raises(ValueError, match=r"field 'axis' of DenseGeneral must be -1 .* got \(-2, -1\)"):
        te_flax.DenseGeneral(features=16, axis=(-2, -1)).init(key, x)
    te_flax.DenseGeneral(features=16, axis=(2,)).init(key, x)  # the last dim, spelled another way
    with pytest.raises(ValueError, match="field 'features' of DenseGeneral must be a positive int or a non-empty"):
        te_flax.DenseGeneral(features=(16, 0)).init(key, x)
    with pytest.raises(NotImplementedError, match="enable_low_rank_adaptation=True is not yet available in te-jax"):
        te_flax.DenseGeneral(features=16, enable_low_rank_adaptation=True).init(key, x)
    model = te_flax.DenseGeneral(features=16)
    plain = model.init(key, x)
    delayed = recipe.DelayedScaling(amax_history_len=8)
    with te_jax.autocast(enabled=True, recipe=delayed):
        with pytest.raises(ValueError, match="has no 'fp8_metas' variable 'x_scale': the model was initialized"):
            model.apply(plain, x)
        variables = model.init(key, x)
        with pytest.raises(ValueError, match="FP8 dense needs multiples of 16"):
            model.apply(variables, jnp.ones((3, 32), jnp.float32))
    with te_jax.autocast(enabled=True, recipe=recipe.DelayedScaling(amax_history_len=4)):
        with pytest.raises(ValueError, match=r"variable 'x_amax_history' has shape \(8,\), the recipe needs \(4,\)"):
            model.apply(variables, x)
