"""Activations of transformer_engine.jax.cpp_extensions (XLA FFI) on CPU (and GPU
on the device machine), eager, under jit and under vmap.

te/activation.h specifies the same bits on te-core's CPU and CUDA backends, so
every result is compared byte for byte with te-core's NumPy API (its CPU
backend, tested against the float64 oracle in te-core), on hostile inputs;
smooth inputs are also checked against the float64 oracle
(reference_activation) directly. FP8 outputs are the bytes of the NumPy
quantize of the FP32 values; dbias is the documented FP32 summation order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import fp32_scalar, hostile, put, same_floats, same_fp8

import transformer_engine.core as tc
from transformer_engine.core import reference as ref
from transformer_engine.core import reference_activation as ra
from transformer_engine.core.testing.tolerances import smallest_subnormal, unit_roundoffs
from transformer_engine.jax import cpp_extensions as ext

pytestmark = pytest.mark.activation

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures
DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
PLAIN_SHAPES = [(1, 16), (5, 160), (33, 17), (7,), (2, 3, 5, 64)]
GATED_SHAPES = [(1, 16), (5, 160), (3, 34), (2, 3, 5, 64)]
FP8 = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
# Unit roundoff and smallest subnormal of each output type (the final rounding of an FP32 value).
UNIT = unit_roundoffs(np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))
TINY = {d: smallest_subnormal(d) for d in UNIT}


def cases():
    for kind in ra.ACTIVATIONS:
        for shape in GATED_SHAPES if kind in ra.GATED else PLAIN_SHAPES:
            yield pytest.param(kind, shape, id=f"{kind}-{shape}")


def name(d) -> str:
    return np.dtype(d).name


def out_shape(shape, kind) -> tuple:
    return (*shape[:-1], shape[-1] // 2) if kind in ra.GATED else tuple(shape)


@pytest.mark.parametrize("kind,shape", list(cases()))
@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_forward_and_backward_bits_equal_te_core(jax_device, jax_rng, kind, shape, dtype):
    x = hostile(jax_rng, shape, dtype)
    y = ext.activation_fwd(put(x, jax_device), kind)
    assert y.dtype == dtype and y.shape == out_shape(shape, kind)
    same_floats(y, tc.activation_forward(x, kind))
    dy = hostile(jax_rng, y.shape, dtype)
    dx = ext.activation_bwd(put(dy, jax_device), put(x, jax_device), kind, out_dtype=np.float32)
    assert dx.dtype == np.float32 and dx.shape == shape
    same_floats(dx, tc.activation_backward(dy, x, kind, out_dtype=np.float32).grad_input)


@pytest.mark.parametrize("kind", ra.ACTIVATIONS)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=name)
def test_smooth_inputs_match_float64_oracle(jax_device, jax_rng, kind, out_dtype):
    """|x| <= 4: sigmoid arguments stay below 11, where a dozen FP32 roundings and the
    exp cost well under 2^-14 relative; plus the output type's final rounding."""
    x = jax_rng.uniform(-4.0, 4.0, (19, 96)).astype(np.float32)
    y = np.asarray(ext.activation_fwd(put(x, jax_device), kind, out_dtype=out_dtype)).astype(np.float64)
    expected = ra.forward(x, kind)
    rtol, tiny = 2.0**-14 + UNIT[np.dtype(out_dtype)], TINY[np.dtype(out_dtype)]
    np.testing.assert_allclose(y, expected, rtol=rtol, atol=2.0**-30 + tiny)
    dy = jax_rng.standard_normal(expected.shape).astype(np.float32)
    dx = ext.activation_bwd(put(dy, jax_device), put(x, jax_device), kind, out_dtype=out_dtype)
    grad = ra.backward(dy, x, kind)
    np.testing.assert_allclose(np.asarray(dx).astype(np.float64), grad, rtol=rtol, atol=2.0**-14 * 4 + tiny)


@pytest.mark.parametrize("kind", ["gelu", "swiglu", "srelu", "clamped_swiglu"])
@pytest.mark.parametrize("fmt", FP8)
def test_fp8_forward_is_quantize_of_the_fp32_values(jax_device, jax_rng, kind, fmt):
    x = hostile(jax_rng, (67, 96), ml_dtypes.bfloat16)
    scale = np.float32(jax_rng.choice([1.0, 37.5, 2.0**-3]))
    old_amax = np.float32(jax_rng.choice([0.0, 1e4]))
    out = ext.activation_fwd(
        put(x, jax_device),
        kind,
        out_dtype=FP8[fmt],
        scale=fp32_scalar(scale, jax_device),
        amax=fp32_scalar(old_amax, jax_device),
        columnwise=True,
    )
    v = np.asarray(ext.activation_fwd(put(x, jax_device), kind, out_dtype=np.float32))
    expected = ref.quantize_fp8(v, scale, fmt)
    same_fp8(out.data, expected)
    same_fp8(out.columnwise, ref.columnwise(expected))
    assert np.asarray(out.scale_inv)[0] == np.float32(1.0) / scale
    assert np.asarray(out.amax)[0] == max(old_amax, ref.amax(v))
    only_col = ext.activation_fwd(
        put(x, jax_device),
        kind,
        out_dtype=FP8[fmt],
        scale=fp32_scalar(scale, jax_device),
        rowwise=False,
        columnwise=True,
    )
    assert only_col.data is None and only_col.columnwise.shape == (v.shape[1], v.shape[0])
    same_fp8(only_col.columnwise, out.columnwise)


@pytest.mark.parametrize("kind", ["relu", "geglu", "glu"])
def test_high_precision_amax_is_of_the_stored_values(jax_device, jax_rng, kind):
    x = hostile(jax_rng, (40, 64), np.float32)
    out = ext.activation_fwd(put(x, jax_device), kind, out_dtype=jnp.bfloat16, amax=fp32_scalar(0.5, jax_device))
    assert out.scale_inv is None and out.columnwise is None
    assert np.asarray(out.amax)[0] == max(np.float32(0.5), ref.amax(np.asarray(out.data)))


@pytest.mark.parametrize("kind", ["gelu", "silu", "swiglu", "sreglu"])
@pytest.mark.parametrize("dbias_dtype", DTYPES, ids=name)
def test_backward_with_dbias_and_fp8_grad(jax_device, jax_rng, kind, dbias_dtype):
    shape = (197, 80)  # several 64-row chunks and a partial one
    x = hostile(jax_rng, shape, np.float16)
    dy = (jax_rng.standard_normal(out_shape(shape, kind))).astype(np.float16)
    g32 = np.asarray(ext.activation_bwd(put(dy, jax_device), put(x, jax_device), kind, out_dtype=np.float32))
    scale = np.float32(2.0)
    out = ext.activation_bwd(
        put(dy, jax_device),
        put(x, jax_device),
        kind,
        out_dtype=jnp.float8_e5m2,
        scale=fp32_scalar(scale, jax_device),
        columnwise=True,
        dbias=True,
        dbias_dtype=dbias_dtype,
    )
    expected = ref.quantize_fp8(g32, scale, "e5m2")
    same_fp8(out.data, expected)
    same_fp8(out.columnwise, ref.columnwise(expected))
    assert np.asarray(out.amax)[0] == ref.amax(g32)
    with np.errstate(over="ignore"):
        same_floats(out.dbias, ra.chunked_column_sum(g32).astype(dbias_dtype))
    plain = ext.activation_bwd(put(dy, jax_device), put(x, jax_device), kind, dbias=True)
    assert plain.data.dtype == np.float16 and plain.amax is None and plain.scale_inv is None
    same_floats(plain.dbias, ra.chunked_column_sum(g32).astype(np.float32))


@pytest.mark.parametrize("limit,alpha,offset", [(3.0, 1.0, 0.0), (0.5, 2.5, -1.0), (np.inf, 1.702, 1.0)])
def test_clamped_swiglu_parameters(jax_device, jax_rng, limit, alpha, offset):
    x = (jax_rng.standard_normal((41, 96)) * 6).astype(np.float32)
    kw = dict(limit=limit, alpha=alpha, glu_linear_offset=offset)
    y = ext.activation_fwd(put(x, jax_device), "clamped_swiglu", **kw)
    same_floats(y, tc.activation_forward(x, "clamped_swiglu", **kw))
    dy = jax_rng.standard_normal(y.shape).astype(np.float32)
    dx = ext.activation_bwd(put(dy, jax_device), put(x, jax_device), "clamped_swiglu", **kw)
    same_floats(dx, tc.activation_backward(dy, x, "clamped_swiglu", **kw).grad_input)


def test_subnormals_are_not_flushed(jax_device):
    """XLA's CPU threads flush denormals; the handlers compute with IEEE ones."""
    tiny = np.array([[1e-45, -1e-40, 3e-39, 1e-38]], np.float32)
    same_floats(ext.activation_fwd(put(tiny, jax_device), "relu"), np.maximum(tiny, 0))
    assert np.asarray(ext.compute_amax(put(tiny, jax_device)))[0] == np.float32(1e-38)
    ones = put(np.ones_like(tiny), jax_device)
    same_floats(ext.activation_bwd(ones, put(tiny, jax_device), "srelu"), 2 * np.maximum(tiny, 0))


def test_under_jit_and_vmap(jax_device, jax_rng):
    x = hostile(jax_rng, (3, 24, 64), ml_dtypes.bfloat16)
    scale = fp32_scalar(4.0, jax_device)

    @jax.jit
    def step(x):
        fwd = ext.activation_fwd(x, "swiglu", out_dtype=jnp.float8_e4m3fn, scale=scale)
        grad = ext.activation_bwd(jnp.ones(fwd.data.shape, x.dtype), x, "swiglu", dbias=True)
        return fwd.data, fwd.amax, grad.data, grad.dbias

    q, amax, dx, dbias = step(put(x, jax_device))
    v = tc.activation_forward(x, "swiglu", out_dtype=np.float32)
    same_fp8(q, ref.quantize_fp8(v, 4.0, "e4m3"))
    assert np.asarray(amax)[0] == ref.amax(v)
    core = tc.activation_backward(np.ones(v.shape, x.dtype), x, "swiglu", dbias=True)
    same_floats(dx, core.grad_input)
    same_floats(dbias, core.dbias)
    # vmap: one call per slice, so amax and dbias are per slice
    qs, amaxes, dxs, dbiases = jax.vmap(step)(put(x, jax_device))
    for i in range(x.shape[0]):
        for got, want in zip((qs[i], amaxes[i], dxs[i], dbiases[i]), step(put(x[i], jax_device))):
            same_floats(got, want)


def test_bad_arguments_name_the_argument_and_rule():
    x = jnp.ones((4, 16), jnp.float32)
    with pytest.raises(ValueError, match="argument 'kind' must be one of gelu, relu, silu, .*; got 'tanh'"):
        ext.activation_fwd(x, "tanh")
    with pytest.raises(ValueError, match="argument 'kind' must be one of"):
        ext.activation_fwd(x, 7)
    with pytest.raises(TypeError, match="argument 'x' must be one of float32, bfloat16, float16, got int32"):
        ext.activation_fwd(jnp.ones((4, 16), jnp.int32), "gelu")
    with pytest.raises(ValueError, match=r"argument 'x' of the gated kind 'swiglu' must have an even last dimension"):
        ext.activation_fwd(jnp.ones((4, 15), jnp.float32), "swiglu")
    with pytest.raises(ValueError, match="argument 'x' must have at least 1 dimension"):
        ext.activation_fwd(jnp.float32(1.0), "relu")
    with pytest.raises(ValueError, match=r"argument 'scale' is required for an FP8 out_dtype \(float8_e4m3fn\)"):
        ext.activation_fwd(x, "gelu", out_dtype=jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="argument 'scale' is only for an FP8 out_dtype, got bfloat16"):
        ext.activation_fwd(x, "gelu", out_dtype=jnp.bfloat16, scale=jnp.ones((1,), jnp.float32))
    with pytest.raises(ValueError, match="a columnwise output needs an FP8 out_dtype, got float32"):
        ext.activation_fwd(x, "gelu", columnwise=True)
    with pytest.raises(ValueError, match="at least one of 'rowwise' and 'columnwise' must be True"):
        ext.activation_fwd(x, "gelu", rowwise=False)
    with pytest.raises(ValueError, match=r"argument 'amax' must be a float32 array of shape \(1,\)"):
        ext.activation_fwd(x, "gelu", amax=jnp.zeros((), jnp.float32))
    with pytest.raises(ValueError, match=r"argument 'limit' must be > 0"):
        ext.activation_fwd(x, "clamped_swiglu", limit=0.0)
    with pytest.raises(ValueError, match=r"argument 'alpha' must be finite"):
        ext.activation_fwd(x, "clamped_swiglu", alpha=np.nan)
    with pytest.raises(ValueError, match=r"argument 'dy' must have the forward output's shape \(4, 8\) and the type"):
        ext.activation_bwd(x, x, "geglu")
    with pytest.raises(ValueError, match=r"argument 'dy' must .* got \(4, 16\) bfloat16"):
        ext.activation_bwd(x.astype(jnp.bfloat16), x, "gelu")
    with pytest.raises(TypeError, match="argument 'dbias_dtype' must be float32, bfloat16 or float16, got int32"):
        ext.activation_bwd(x, x, "gelu", dbias=True, dbias_dtype=jnp.int32)
