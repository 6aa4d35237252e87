"""transformer_engine.jax.flax LayerNorm, LayerNormDenseGeneral and LayerNormMLP.

- Parameter names, shapes, types and initial values (the reference's).
- High precision against flax.linen references built from the module's own
  parameters (nn.LayerNorm / nn.RMSNorm, nn.DenseGeneral and nn.Dense with
  Precision.HIGHEST, the activations written in jax.numpy): outputs and every
  gradient, both norms, zero-centred gamma, every activation, the unfused paths
  (return_layernorm_output, enable_layernorm=False, dropout).
- FP8 under autocast (DelayedScaling, Float8CurrentScaling): bit-equal to the
  functional op called with the quantizer sets built from the module's fp8_metas
  variables, whose "gradient" is the functional op's updated state, over jitted
  training steps with update_collections; the fused and unfused LayerNormMLP
  paths keep the same state.
"""

from __future__ import annotations

import pytest

flax = pytest.importorskip("flax")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax_helpers import put

import transformer_engine.jax as te_jax
from transformer_engine.common import recipe
from transformer_engine.jax import flax as te_flax
from transformer_engine.jax.layernorm_dense import layernorm_dense
from transformer_engine.jax.layernorm_mlp import layernorm_mlp
from transformer_engine.jax.quantize import QuantizerFactory, QuantizerSet

pytestmark = [pytest.mark.module]

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures
NORM_TYPES = pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
HIGHEST = jax.lax.Precision.HIGHEST
METAS = te_jax.NVTE_FP8_COLLECTION_NAME
SIGMOID = jax.nn.sigmoid
JNP_ACTIVATIONS = {  # activation_type -> (activated, linear) in jax.numpy
    ("gelu",): (lambda a: jax.nn.gelu(a, approximate=True), None),
    ("relu",): (jax.nn.relu, None),
    ("silu",): (lambda a: a * SIGMOID(a), None),
    ("quick_gelu",): (lambda a: a * SIGMOID(1.702 * a), None),
    ("squared_relu",): (lambda a: jax.nn.relu(a) ** 2, None),
    ("gelu", "linear"): (lambda a: jax.nn.gelu(a, approximate=True), lambda b: b),
    ("relu", "linear"): (jax.nn.relu, lambda b: b),
    ("silu", "linear"): (lambda a: a * SIGMOID(a), lambda b: b),
    ("quick_gelu", "linear"): (lambda a: a * SIGMOID(1.702 * a), lambda b: b),
    ("squared_relu", "linear"): (lambda a: jax.nn.relu(a) ** 2, lambda b: b),
    ("sigmoid", "linear"): (SIGMOID, lambda b: b),
    ("clamped_silu", "clamped_linear"): (
        lambda a: jnp.minimum(a, 7.0) * SIGMOID(1.702 * jnp.minimum(a, 7.0)),
        lambda b: jnp.clip(b, -7.0, 7.0) + 1.0,
    ),
}


def ref_norm(norm_type, eps):
    if norm_type == "layernorm":
        return nn.LayerNorm(epsilon=eps, use_fast_variance=False, name="norm")
    return nn.RMSNorm(epsilon=eps, name="norm")


def norm_params(params, norm_type, zcg):
    """flax.linen's norm params from ours (the weight is 1 + scale when zero-centred)."""
    out = {"scale": params["scale"] + 1.0 if zcg else params["scale"]}
    if norm_type == "layernorm":
        out["bias"] = params["ln_bias"]
    return out


class RefLayerNormDense(nn.Module):
    norm_type: str
    features: tuple
    use_bias: bool
    enable_layernorm: bool = True

    @nn.compact
    def __call__(self, x):
        y = ref_norm(self.norm_type, 1e-6)(x) if self.enable_layernorm else x
        return nn.DenseGeneral(self.features, use_bias=self.use_bias, precision=HIGHEST, name="dense")(y), y


class RefLayerNormMLP(nn.Module):
    norm_type: str
    activations: tuple
    intermediate: int
    use_bias: bool

    @nn.compact
    def __call__(self, x):
        y = ref_norm(self.norm_type, 1e-6)(x)
        n = len(self.activations)
        h = nn.DenseGeneral((n, self.intermediate), use_bias=self.use_bias, precision=HIGHEST, name="wi")(y)
        act, lin = JNP_ACTIVATIONS[self.activations]
        a = act(h[..., 0, :]) * (1.0 if lin is None else lin(h[..., 1, :]))
        return nn.Dense(x.shape[-1], use_bias=self.use_bias, precision=HIGHEST, name="wo")(a)


def grads_of(apply, params, x, dy):
    """(y, dparams, dx) of sum(apply(params, x) * dy)."""

    def loss(params, x):
        y = apply(params, x)
        return jnp.sum(y * dy), y

    (_, y), (dp, dx) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    return y, dp, dx


def close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(np.abs(want).max(), 1e-30), err_msg=what)


def randomized(params, rng):
    """Params with every leaf redrawn (scale around 0.5..1.5, biases nonzero): a dropped or misplaced one shows."""
    return jax.tree_util.tree_map(lambda p: jnp.asarray(rng.standard_normal(p.shape) * 0.5 + 0.5, p.dtype), params)


@NORM_TYPES
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
def test_layernorm_matches_flax(jax_device, jax_rng, norm_type, zcg):
    x = jax_rng.standard_normal((3, 5, 40)).astype(np.float32) * 2 + 1
    dy = jax_rng.standard_normal(x.shape).astype(np.float32)
    model = te_flax.LayerNorm(layernorm_type=norm_type, zero_centered_gamma=zcg, dtype=jnp.bfloat16)
    with jax.default_device(jax_device):
        params = model.init(jax.random.PRNGKey(0), x)["params"]
        assert set(params) == ({"scale", "ln_bias"} if norm_type == "layernorm" else {"scale"})
        assert params["scale"].dtype == jnp.bfloat16 and params["scale"].shape == (40,)
        np.testing.assert_array_equal(np.asarray(params["scale"], np.float32), np.full(40, 0.0 if zcg else 1.0))
        params = jax.tree_util.tree_map(lambda p: p.astype(jnp.float32), randomized(params, jax_rng))
        y, dp, dx = grads_of(lambda p, x: model.apply({"params": p}, x), params, x, dy)
        theirs = ref_norm(norm_type, 1e-6)
        y_r, dp_r, dx_r = grads_of(
            lambda p, x: theirs.apply({"params": norm_params(p, norm_type, zcg)}, x), params, x, dy
        )
    assert y.dtype == np.float32
    for got, want, what in ((y, y_r, "y"), (dx, dx_r, "dx"), (dp, dp_r, "dparams")):
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            close(a, b, what)


@NORM_TYPES
@pytest.mark.parametrize(
    "variant", ["plain", "zero_centered", "bias_tuple_features", "return_ln", "no_layernorm", "depth_scaling"]
)
def test_layernorm_dense_general_matches_flax(jax_device, jax_rng, norm_type, variant):
    zcg = variant == "zero_centered"
    features = (2, 12) if variant == "bias_tuple_features" else (24,)
    use_bias = variant == "bias_tuple_features"
    enable_ln = variant != "no_layernorm"
    depth = 4.0 if variant == "depth_scaling" else None
    model = te_flax.LayerNormDenseGeneral(
        features=features if len(features) > 1 else features[0], layernorm_type=norm_type, zero_centered_gamma=zcg,
        use_bias=use_bias, return_layernorm_output=variant == "return_ln", enable_layernorm=enable_ln,
        depth_scaling=depth,
    )  # fmt: skip
    x = jax_rng.standard_normal((2, 7, 32)).astype(np.float32)
    dy = jax_rng.standard_normal((2, 7, *features)).astype(np.float32)
    with jax.default_device(jax_device):
        params = model.init(jax.random.PRNGKey(0), x)["params"]
        names = {"kernel"} | ({"bias"} if use_bias else set())
        names |= ({"scale", "ln_bias"} if norm_type == "layernorm" else {"scale"}) if enable_ln else set()
        assert set(params) == names and params["kernel"].shape == (32, *features)
        params = randomized(params, jax_rng)
        z, ln_out = model.apply({"params": params}, x)
        assert (ln_out is None) == (variant != "return_ln")
        y, dp, dx = grads_of(lambda p, x: model.apply({"params": p}, x)[0], params, x, dy)
        theirs = RefLayerNormDense(norm_type, features, use_bias, enable_ln)

        def to_ref(p):
            out = {"dense": {"kernel": p["kernel"], **({"bias": p["bias"]} if use_bias else {})}}
            return {**out, "norm": norm_params(p, norm_type, zcg)} if enable_ln else out

        def apply_ref(p, x):
            return theirs.apply({"params": to_ref(p)}, x)[0] / (depth or 1.0)

        y_r, dp_r, dx_r = grads_of(apply_ref, params, x, dy)
        if ln_out is not None:
            close(ln_out, theirs.apply({"params": to_ref(params)}, x)[1], "ln_output")
    close(y, y_r, "y")
    close(dx, dx_r, "dx")
    for name in params:
        close(dp[name], dp_r[name], f"d{name}")


def mlp_ref_apply(norm_type, activations, intermediate, use_bias, zcg=False):
    theirs = RefLayerNormMLP(norm_type, activations, intermediate, use_bias)

    def apply(p, x):
        wi = {"kernel": p["wi_kernel"], **({"bias": p["wi_bias"]} if use_bias else {})}
        wo = {"kernel": p["wo_kernel"], **({"bias": p["wo_bias"]} if use_bias else {})}
        return theirs.apply({"params": {"norm": norm_params(p, norm_type, zcg), "wi": wi, "wo": wo}}, x)

    return apply


@pytest.mark.parametrize("activations", list(JNP_ACTIVATIONS), ids="-".join)
@pytest.mark.parametrize("norm_type,zcg", [("layernorm", False), ("rmsnorm", True)], ids=["layernorm", "rmsnorm_zcg"])
def test_layernorm_mlp_matches_flax(jax_device, jax_rng, activations, norm_type, zcg):
    model = te_flax.LayerNormMLP(
        intermediate_dim=20, layernorm_type=norm_type, zero_centered_gamma=zcg, activations=activations, use_bias=True
    )
    x = jax_rng.standard_normal((2, 5, 24)).astype(np.float32)
    dy = jax_rng.standard_normal(x.shape).astype(np.float32)
    n = len(activations)
    with jax.default_device(jax_device):
        params = model.init(jax.random.PRNGKey(0), x)["params"]
        shapes = {"wi_kernel": (24, n, 20), "wi_bias": (n, 20), "wo_kernel": (20, 24), "wo_bias": (24,), "scale": (24,)}
        shapes |= {"ln_bias": (24,)} if norm_type == "layernorm" else {}
        assert jax.tree_util.tree_map(jnp.shape, params) == shapes
        params = randomized(params, jax_rng)
        params = {**params, "wi_kernel": params["wi_kernel"] - 0.5, "wo_kernel": params["wo_kernel"] - 0.5}
        y, dp, dx = grads_of(lambda p, x: model.apply({"params": p}, x)[0], params, x, dy)
        y_r, dp_r, dx_r = grads_of(mlp_ref_apply(norm_type, activations, 20, True, zcg), params, x, dy)
    close(y, y_r, "y")
    close(dx, dx_r, "dx")
    for name in params:
        close(dp[name], dp_r[name], f"d{name}")


def test_layernorm_mlp_init_unfused_paths_and_dropout(jax_device, jax_rng):
    x = jax_rng.standard_normal((2, 6, 16)).astype(np.float32)
    kwargs = dict(intermediate_dim=32, activations=("gelu", "linear"))
    fused = te_flax.LayerNormMLP(**kwargs)
    with jax.default_device(jax_device):
        params = fused.init(jax.random.PRNGKey(0), x)["params"]
        assert set(params) == {"scale", "ln_bias", "wi_kernel", "wo_kernel"}  # use_bias=False by default
        # each activation's slice is its own fan_in draw (variance 1/16 before truncation), not a copy
        wi = np.asarray(params["wi_kernel"])
        assert not np.array_equal(wi[:, 0], wi[:, 1]) and 0.02 < wi.var() < 0.08
        y, ln = fused.apply({"params": params}, x)
        assert ln is None
        y2, ln2 = te_flax.LayerNormMLP(**kwargs, return_layernorm_output=True).apply({"params": params}, x)
        np.testing.assert_allclose(np.asarray(y2), np.asarray(y), rtol=1e-6, atol=1e-6)
        want_ln = te_flax.LayerNorm().apply({"params": {"scale": params["scale"], "ln_bias": params["ln_bias"]}}, x)
        np.testing.assert_array_equal(np.asarray(ln2), np.asarray(want_ln))
        dropped = te_flax.LayerNormMLP(**kwargs, intermediate_dropout_rate=0.5)
        y3, _ = dropped.apply({"params": params}, x, deterministic=True)
        np.testing.assert_array_equal(np.asarray(y3), np.asarray(y))
        rngs = {"dropout": jax.random.PRNGKey(1)}
        y4, _ = dropped.apply({"params": params}, x, deterministic=False, rngs=rngs)
        y5, _ = dropped.apply({"params": params}, x, deterministic=False, rngs=rngs)
        np.testing.assert_array_equal(np.asarray(y4), np.asarray(y5))
        assert np.abs(np.asarray(y4) - np.asarray(y)).max() > 1e-3
        # the dropout acts on the activation output: zeroing all of it leaves wo's input 0
        all_dropped = te_flax.LayerNormMLP(**kwargs, intermediate_dropout_rate=1.0, use_bias=True)
        p_bias = all_dropped.init(jax.random.PRNGKey(0), x)["params"]
        p_bias = {**p_bias, "wo_bias": jnp.arange(16.0)}
        y6, _ = all_dropped.apply({"params": p_bias}, x, deterministic=False, rngs=rngs)
        np.testing.assert_array_equal(np.asarray(y6), np.broadcast_to(np.arange(16.0, dtype=np.float32), y6.shape))


def state_set(fp8_recipe, metas, postfix="") -> QuantizerSet:
    """QuantizerFactory's set with the fp8_metas state of one GEMM put in (delayed scaling)."""
    qs = QuantizerFactory.create_set(fp8_recipe)
    if metas is None:
        return qs
    fields = {}
    for field, prefix in (("x", "x"), ("kernel", "kernel"), ("dgrad", "grad")):
        q = getattr(qs, field)
        fields[field] = type(q)(
            scale=metas[f"{prefix}{postfix}_scale"],
            amax_history=metas[f"{prefix}{postfix}_amax_history"],
            q_dtype=q.q_dtype,
            margin=q.margin,
            amax_compute_algo=q.amax_compute_algo,
        )
    return QuantizerSet(**fields)


def assert_metas_are_states(metas, sets_and_postfixes):
    for qs, postfix in sets_and_postfixes:
        for field, prefix in (("x", "x"), ("kernel", "kernel"), ("dgrad", "grad")):
            np.testing.assert_array_equal(metas[f"{prefix}{postfix}_scale"], getattr(qs, field).scale)
            np.testing.assert_array_equal(metas[f"{prefix}{postfix}_amax_history"], getattr(qs, field).amax_history)


FP8_RECIPES = [recipe.DelayedScaling(amax_history_len=4, margin=1), recipe.Float8CurrentScaling()]


def train(model, variables, x, dy, steps):
    """Jitted README steps (value_and_grad over params and the other collections,
    update_collections); returns [(y, param grads, dx, other_vars after)] per step."""
    other, params = flax.core.pop(variables, "params")

    @jax.jit
    def step(params, other, x, dy):
        def loss(params, other, x):
            y = model.apply({"params": params, **other}, x)[0]
            return jnp.sum(y * dy), y

        (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(params, other, x)
        return y, grads

    results = []
    for i in range(steps):
        y, (dp, dother, dx) = step(params, other, x * (10.0**i), dy)
        results.append((y, dp, dx, other))
        other = te_jax.update_collections(dother, other)
        results[-1] = (y, dp, dx, results[-1][3], other)
    return params, results


@pytest.mark.parametrize("fp8_recipe", FP8_RECIPES, ids=["delayed", "current"])
@NORM_TYPES
def test_fp8_layernorm_dense_general_equals_functional(jax_device, jax_rng, fp8_recipe, norm_type):
    x = jax_rng.standard_normal((2, 16, 32)).astype(np.float32)
    dy = jax_rng.standard_normal((2, 16, 48)).astype(np.float32)
    model = te_flax.LayerNormDenseGeneral(features=48, layernorm_type=norm_type, use_bias=True)
    with jax.default_device(jax_device), te_jax.autocast(enabled=True, recipe=fp8_recipe):
        variables = model.init(jax.random.PRNGKey(0), x)
        params, results = train(model, variables, put(x, jax_device), put(dy, jax_device), steps=2)
    beta = params.get("ln_bias")

    with jax.default_device(jax_device):  # (the functional reference on the module's device)
        for i, (y, dp, dx, before, after) in enumerate(results):
            qs = state_set(fp8_recipe, before.get(METAS))

            def fn(x, kernel, gamma, beta, bias, qs):
                return layernorm_dense(x, kernel, gamma, beta, bias, norm_type, quantizer_set=qs)

            args = (x * (10.0**i), params["kernel"], params["scale"], beta, params["bias"])
            want_y, vjp = jax.vjp(fn, *args, qs)
            want = vjp(jnp.asarray(dy))
            np.testing.assert_array_equal(np.asarray(y), np.asarray(want_y))
            np.testing.assert_array_equal(np.asarray(dx), np.asarray(want[0]))
            for name, g in (("kernel", want[1]), ("scale", want[2]), ("ln_bias", want[3]), ("bias", want[4])):
                if name in dp:
                    np.testing.assert_array_equal(np.asarray(dp[name]), np.asarray(g), err_msg=name)
            if METAS in after:
                assert_metas_are_states(after[METAS], [(want[5], "")])
            else:
                assert set(after) == set()  # current scaling keeps no state


@pytest.mark.parametrize("fp8_recipe", FP8_RECIPES, ids=["delayed", "current"])
@pytest.mark.parametrize("activations", [("gelu",), ("silu", "linear")], ids="-".join)
def test_fp8_layernorm_mlp_equals_functional_and_unfused(jax_device, jax_rng, fp8_recipe, activations):
    x = jax_rng.standard_normal((2, 16, 32)).astype(np.float32)
    dy = jax_rng.standard_normal(x.shape).astype(np.float32)
    kwargs = dict(intermediate_dim=48, activations=activations, use_bias=True, layernorm_type="rmsnorm")
    model = te_flax.LayerNormMLP(**kwargs)
    with jax.default_device(jax_device), te_jax.autocast(enabled=True, recipe=fp8_recipe):
        variables = model.init(jax.random.PRNGKey(0), x)
        if isinstance(fp8_recipe, recipe.DelayedScaling):
            names = {f"{p}_{i}_{f}" for p in ("x", "kernel", "grad") for i in (0, 1) for f in ("scale", "amax_history")}
            assert set(variables[METAS]) == names
        params, results = train(model, variables, put(x, jax_device), put(dy, jax_device), steps=2)
        unfused = te_flax.LayerNormMLP(**kwargs, return_layernorm_output=True)
        _, unfused_results = train(unfused, variables, put(x, jax_device), put(dy, jax_device), steps=2)
    with jax.default_device(jax_device):  # (the functional reference on the module's device)
        for i, (y, dp, dx, before, after) in enumerate(results):
            metas = before.get(METAS)
            sets = (state_set(fp8_recipe, metas, "_0"), state_set(fp8_recipe, metas, "_1"))

            def fn(x, gamma, w1, w2, b1, b2, sets):
                return layernorm_mlp(
                    x, gamma, None, [w1, w2], [b1, b2], "rmsnorm", activation_type=activations, quantizer_sets=sets
                )

            p = params
            args = (x * (10.0**i), p["scale"], p["wi_kernel"], p["wo_kernel"], p["wi_bias"], p["wo_bias"])
            want_y, vjp = jax.vjp(fn, *args, sets)
            want = vjp(jnp.asarray(dy))
            np.testing.assert_array_equal(np.asarray(y), np.asarray(want_y))
            np.testing.assert_array_equal(np.asarray(dx), np.asarray(want[0]))
            for name, g in zip(("scale", "wi_kernel", "wo_kernel", "wi_bias"), want[1:5]):
                np.testing.assert_array_equal(np.asarray(dp[name]), np.asarray(g), err_msg=name)
            # wo_bias's gradient is XLA's sum of dy over the rows in both, fused differently
            # inside the jitted step on a GPU: equal within two FP32 summation orders' bound.
            rows = dy.reshape(-1, dy.shape[-1])
            bound = 2 * (rows.shape[0] - 1) * np.finfo(np.float32).eps * np.abs(rows).sum(axis=0)
            np.testing.assert_array_less(np.abs(np.asarray(dp["wo_bias"]) - np.asarray(want[5])), bound + 1e-30)
            if METAS in after:
                assert_metas_are_states(after[METAS], [(want[6][0], "_0"), (want[6][1], "_1")])
            # the unfused path: the same output and the same state (wi_bias's gradient is XLA's sum there)
            y_u, _, dx_u, _, after_u = unfused_results[i]
            np.testing.assert_array_equal(np.asarray(y_u), np.asarray(y))
            np.testing.assert_array_equal(np.asarray(dx_u), np.asarray(dx))
            for a, b in zip(jax.tree_util.tree_leaves(after_u), jax.tree_util.tree_leaves(after)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_fields():
    x = jnp.ones((2, 16, 32), jnp.float32)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="argument 'norm_type' must be 'layernorm' or 'rmsnorm'"):
        te_flax.LayerNorm(layernorm_type="batchnorm").init(key, x)
    with pytest.raises(ValueError, match="field 'axis' of LayerNormDenseGeneral must be -1"):
        te_flax.LayerNormDenseGeneral(features=16, axis=0).init(key, x)
    with pytest.raises(NotImplementedError, match="LayerNormMLP: enable_low_rank_adaptation=True is not yet"):
        te_flax.LayerNormMLP(intermediate_dim=16, enable_low_rank_adaptation=True).init(key, x)
    with pytest.raises(ValueError, match="field 'features' of LayerNormDenseGeneral must be a positive int"):
        te_flax.LayerNormDenseGeneral(features=0).init(key, x)
    with pytest.raises(ValueError, match="argument 'activation_type' must be one of"):
        te_flax.LayerNormMLP(intermediate_dim=16, activations=("tanh",)).init(key, x)
    with pytest.raises(ValueError, match=r"field 'features' of LayerNormMLP \(intermediate_dim\) must be"):
        te_flax.LayerNormMLP(intermediate_dim=-1).init(key, x)
