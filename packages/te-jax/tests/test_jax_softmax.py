"""transformer_engine.jax.softmax (the reference's softmax and SoftmaxFusionType) and its
cpp_extensions (XLA FFI over te/softmax.h), eager and under jit, forward and the custom VJP.

Checked against the float64 oracle (transformer_engine.core.reference_softmax, its
documented error bound per element) and against te-core's NumPy API (its CPU backend): byte
for byte on the CPU; on a GPU the forward within both backends' bounds (te/softmax.h: CPU and
CUDA agree within rounding -- the exp differs) and the backward, given the same y, byte for
byte, as te-core's own device tests check."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import put, same_floats

import transformer_engine.core as tc
from transformer_engine.core import reference_norm as nref
from transformer_engine.core import reference_softmax as sref
from transformer_engine.jax import cpp_extensions as ext
from transformer_engine.jax.softmax import SoftmaxFusionType, SoftmaxType, softmax

pytestmark = pytest.mark.softmax

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures
DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
T = SoftmaxFusionType
# (fusion type, logits shape): odd rows, a long row, one key, square causal blocks.
CASES = [
    (T.SCALED, (7,)),
    (T.SCALED, (2, 3, 5, 100)),
    (T.SCALED, (3, 1025)),
    (T.SCALED_MASKED, (2, 3, 5, 37)),
    (T.SCALED_MASKED, (1, 2, 4, 64)),
    (T.SCALED_MASKED, (3, 1, 7, 1)),
    (T.SCALED_UPPER_TRIANG_MASKED, (5, 9, 9)),
    (T.SCALED_UPPER_TRIANG_MASKED, (2, 3, 33, 33)),
    (T.SCALED_UPPER_TRIANG_MASKED, (1, 1, 1)),
]
ORACLE_KIND = {T.SCALED: "plain", T.SCALED_MASKED: "masked", T.SCALED_UPPER_TRIANG_MASKED: "causal"}
CORE_FORWARD = {
    T.SCALED: lambda x, m, s: tc.scaled_softmax_forward(x, s),
    T.SCALED_MASKED: tc.scaled_masked_softmax_forward,
    T.SCALED_UPPER_TRIANG_MASKED: lambda x, m, s: tc.scaled_upper_triang_masked_softmax_forward(
        x.reshape(-1, *x.shape[-2:]), s
    ).reshape(x.shape),
}


def case_id(case) -> str:
    kind, shape = case
    return f"{kind.value}-{'x'.join(map(str, shape))}"


def inputs(rng, kind, shape, dtype):
    """Logits with rows of varied spread (exp underflows in some), a row with an -inf, an
    all -inf row; a mask with a fully masked row; a non-trivial scale."""
    n = int(np.prod(shape[:-1]))
    x = rng.standard_normal((n, shape[-1])) * rng.choice([1e-3, 1.0, 10.0, 150.0], (n, 1))
    if n >= 4:
        x[1, :] = -np.inf
        x[3, rng.integers(shape[-1])] = -np.inf
    x = x.reshape(shape).astype(dtype)
    mask = None
    if kind is T.SCALED_MASKED:
        b, _, sq, sk = shape
        mask = rng.random((rng.choice([1, b]), 1, sq, sk)) < 0.3
        mask[..., 0, :] = True  # a row with nothing visible
    return x, mask, float(rng.choice([0.125, 1.0, 3.0]))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forward_and_vjp_against_oracle_and_core(jax_device, jax_rng, case, dtype):
    kind, shape = case
    x, mask, scale = inputs(jax_rng, kind, shape, dtype)
    dy = (jax_rng.standard_normal(shape) * jax_rng.choice([1e-2, 1.0, 30.0], shape)).astype(dtype)
    jmask = None if mask is None else put(mask, jax_device)

    @jax.jit
    def run(x, dy):
        y, pullback = jax.vjp(lambda t: softmax(t, jmask, scale, kind), x)
        return y, pullback(dy)[0]

    y, dx = run(put(x, jax_device), put(dy, jax_device))
    assert y.dtype == dtype and y.shape == shape and dx.dtype == dtype and dx.shape == shape
    exact, bound = sref.forward(x, scale, ORACLE_KIND[kind], mask)
    nref.assert_within(np.asarray(y), exact, bound, case_id(case))
    exact_dx, bound_dx = sref.backward(dy, np.asarray(y), scale)
    nref.assert_within(np.asarray(dx), exact_dx, bound_dx, case_id(case) + " backward")
    core_y = CORE_FORWARD[kind](x, None if mask is None else mask.astype(np.uint8), scale)
    if jax_device.platform == "cpu":
        same_floats(y, core_y)
    else:
        nref.assert_within(np.asarray(y), core_y.astype(np.float64), 2 * bound, case_id(case) + " vs te-core CPU")
    same_floats(dx, tc.scaled_softmax_backward(dy, np.asarray(y), scale))


def test_eager_matches_jit_and_grad_of_a_loss(jax_rng):
    x = jnp.asarray(jax_rng.standard_normal((2, 2, 8, 8)), jnp.float32)
    y = softmax(x, scale_factor=0.5, softmax_fusion_type=T.SCALED_UPPER_TRIANG_MASKED)
    same_floats(y, jax.jit(lambda t: softmax(t, None, 0.5, T.SCALED_UPPER_TRIANG_MASKED))(x))
    w = jnp.asarray(jax_rng.standard_normal(x.shape), jnp.float32)
    g = jax.grad(lambda t: jnp.sum(softmax(t, None, 0.5, T.SCALED_UPPER_TRIANG_MASKED) * w))(x)
    y64 = np.asarray(y, np.float64)
    expected = 0.5 * y64 * (np.asarray(w) - (np.asarray(w) * y64).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(y)[..., np.triu_indices(8, 1)[0], np.triu_indices(8, 1)[1]] == 0)


def test_reference_names():
    assert [m.value for m in SoftmaxFusionType] == ["scaled", "scaled_masked", "scaled_upper_triang_masked"]
    assert SoftmaxType is SoftmaxFusionType
    import transformer_engine.jax as te_jax

    assert te_jax.softmax.softmax is softmax
    for name in ("scaled_softmax_fwd", "scaled_masked_softmax_fwd", "scaled_upper_triang_masked_softmax_bwd"):
        assert callable(getattr(ext, name))


def test_argument_errors():
    x = jnp.zeros((2, 1, 4, 4), jnp.float32)
    with pytest.raises(ValueError, match="argument 'mask' is required for SoftmaxFusionType.SCALED_MASKED"):
        softmax(x, None, 1.0, T.SCALED_MASKED)
    with pytest.raises(ValueError, match="argument 'mask' .* must be None for SCALED"):
        softmax(x, jnp.zeros((2, 1, 4, 4), bool))
    with pytest.raises(TypeError, match="argument 'softmax_fusion_type' must be a SoftmaxFusionType"):
        softmax(x, None, 1.0, "scaled")
    with pytest.raises(ValueError, match="argument 'scale_factor' must be finite"):
        softmax(x, None, float("inf"))
    with pytest.raises(ValueError, match=r"argument 'mask' must be \[2 or 1, 1, 4, 4\]"):
        softmax(x, jnp.zeros((2, 2, 4, 4), bool), 1.0, T.SCALED_MASKED)
    with pytest.raises(TypeError, match="argument 'mask' must be bool or uint8"):
        softmax(x, jnp.zeros((2, 1, 4, 4), jnp.int32), 1.0, T.SCALED_MASKED)
    with pytest.raises(ValueError, match="square in its last two dims"):
        softmax(jnp.zeros((2, 3, 5), jnp.float32), None, 1.0, T.SCALED_UPPER_TRIANG_MASKED)
    with pytest.raises(TypeError, match="argument 'logits' must be one of float32"):
        softmax(jnp.zeros((2, 4), jnp.int32))
