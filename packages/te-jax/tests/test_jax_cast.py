"""Per-tensor FP8 ops of transformer_engine.jax.cpp_extensions (XLA FFI)
against the NumPy + ml_dtypes oracle of te-core: bytes and scales bit-exact,
on CPU (and GPU on the device machine), eager, under jit and under vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import hostile

from transformer_engine.core import reference as ref
from transformer_engine.jax import cpp_extensions as ext

pytestmark = pytest.mark.cast

SHAPES = [(1, 16), (5, 160), (217, 256), (2, 3, 48)]
HP_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
pytest_plugins = ["jax_fixtures"]  # the device and jax_rng fixtures
FP8 = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}


def _bytes(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


def _scalar(value, jax_device):
    return jax.device_put(jnp.array([value], jnp.float32), jax_device)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", HP_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", FP8)
def test_quantize_fp8_matches_oracle(jax_device, jax_rng, shape, dtype, fmt):
    x = hostile(jax_rng, shape, dtype)
    scale = np.float32(jax_rng.uniform(0.01, 4.0))
    amax_in = np.float32(jax_rng.uniform(0.0, 2.0))
    xd = jax.device_put(x, jax_device)
    row, col, scale_inv, amax = ext.quantize_fp8(
        xd, _scalar(scale, jax_device), _scalar(amax_in, jax_device), FP8[fmt], columnwise=True
    )
    expected = ref.quantize_fp8(x, scale, fmt)
    np.testing.assert_array_equal(_bytes(row), expected)
    np.testing.assert_array_equal(_bytes(col), ref.columnwise(expected))
    assert np.asarray(scale_inv)[0] == np.float32(1.0) / scale
    assert np.asarray(amax)[0] == max(amax_in, ref.amax(x))


def test_quantize_fp8_rowwise_or_columnwise_only(jax_device, jax_rng):
    x = jax.device_put(hostile(jax_rng, (48, 32), np.float32), jax_device)
    one, zero = _scalar(1.0, jax_device), _scalar(0.0, jax_device)
    row, col, _, _ = ext.quantize_fp8(x, one, zero, rowwise=False, columnwise=True)
    assert row is None and col.shape == (32, 48)
    row, col, _, _ = ext.quantize_fp8(x, one, zero)
    assert col is None and row.shape == (48, 32)
    np.testing.assert_array_equal(_bytes(row), ref.quantize_fp8(np.asarray(x), 1.0, "e4m3"))


def test_quantize_fp8_under_jit_and_vmap(jax_device, jax_rng):
    x = hostile(jax_rng, (3, 32, 64), ml_dtypes.bfloat16)
    scale = _scalar(0.5, jax_device)
    amax0 = _scalar(0.0, jax_device)

    @jax.jit
    def quantize(x):
        row, _, _, amax = ext.quantize_fp8(x, scale, amax0, jnp.float8_e5m2)
        return row, amax

    row, amax = quantize(jax.device_put(x, jax_device))
    np.testing.assert_array_equal(_bytes(row), ref.quantize_fp8(x, 0.5, "e5m2"))
    assert np.asarray(amax)[0] == ref.amax(x)
    # vmap: one quantize (and one amax) per slice
    rows, amaxes = jax.vmap(quantize)(jax.device_put(x, jax_device))
    for i in range(x.shape[0]):
        np.testing.assert_array_equal(_bytes(rows[i]), ref.quantize_fp8(x[i], 0.5, "e5m2"))
        assert np.asarray(amaxes[i])[0] == ref.amax(x[i])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", HP_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("pow2", [False, True])
def test_current_scaling_matches_oracle(jax_device, jax_rng, shape, dtype, fmt, pow2):
    x = jax_rng.standard_normal(shape).astype(dtype) * dtype(jax_rng.uniform(0.1, 100.0))
    x.reshape(-1)[0] = np.nan  # amax ignores NaN; the NaN byte is 0x7F
    row, col, scale, scale_inv, amax = ext.quantize_fp8_current_scaling(
        jax.device_put(x, jax_device), FP8[fmt], columnwise=True, force_pow_2_scales=pow2, amax_epsilon=1e-3
    )
    expected_amax = ref.amax(x)
    largest = np.float32(ml_dtypes.finfo(dtype).max)
    expected_scale = ref.scale_from_amax(expected_amax, fmt, pow2, 1e-3, value_for_inf=largest)
    assert np.asarray(amax)[0] == expected_amax
    assert np.asarray(scale)[0] == expected_scale
    assert np.asarray(scale_inv)[0] == np.float32(1.0) / expected_scale
    expected = ref.quantize_fp8(x, expected_scale, fmt)
    np.testing.assert_array_equal(_bytes(row), expected)
    np.testing.assert_array_equal(_bytes(col), ref.columnwise(expected))


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("out_dtype", HP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dequantize_matches_oracle(jax_device, jax_rng, fmt, out_dtype):
    q = jax_rng.integers(0, 256, size=(7, 96), dtype=np.uint8)
    scale_inv = np.float32(jax_rng.uniform(0.001, 30.0))
    data = jax.device_put(jnp.asarray(q.view(ref.FP8_NUMPY[fmt])), jax_device)
    out = ext.dequantize_fp8(data, _scalar(scale_inv, jax_device), out_dtype)
    expected = ref.dequantize_fp8(q, scale_inv, fmt, out_dtype)
    got = np.asarray(out)
    # Bit-exact except NaN payloads (the core's NaN keeps all mantissa bits set, NumPy's is the quiet NaN)
    nan = np.isnan(expected.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint8), expected[~nan].view(np.uint8))


def test_compute_amax_matches_oracle(jax_device, jax_rng):
    for shape in [(1, 16), (33, 70), (0, 8)]:
        x = hostile(jax_rng, shape, np.float32) if np.prod(shape) else np.zeros(shape, np.float32)
        assert np.asarray(ext.compute_amax(jax.device_put(x, jax_device)))[0] == ref.amax(x)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fmt", FP8)
def test_delayed_scaling_update_matches_oracle(jax_device, jax_rng, algo, fmt):
    history = np.abs(jax_rng.standard_normal((16, 5))).astype(np.float32) * 100
    history[0, 1] = 0.0  # a column that saw no data: no roll, scale kept
    history[3, 2] = np.inf  # a non-finite window max: scale kept
    scale = jax_rng.uniform(0.5, 2.0, size=5).astype(np.float32)
    put = lambda a: jax.device_put(jnp.asarray(a), jax_device)  # noqa: E731
    new_history, new_scale, new_scale_inv = ext.delayed_scaling_update(
        put(history), put(scale), FP8[fmt], margin=1.0, amax_compute_algo=algo
    )
    expected_history, expected_scale = ref.delayed_scaling_update(history, scale, fmt, margin=1.0, algo=algo)
    np.testing.assert_array_equal(np.asarray(new_history), expected_history)
    np.testing.assert_array_equal(np.asarray(new_scale), expected_scale)
    np.testing.assert_array_equal(np.asarray(new_scale_inv), np.float32(1.0) / expected_scale)


def test_bad_arguments_name_the_argument_and_rule():
    x = jnp.ones((16, 16), jnp.float32)
    one = jnp.ones((1,), jnp.float32)
    with pytest.raises(TypeError, match="argument 'x' must be one of float32, bfloat16, float16, got int32"):
        ext.quantize_fp8(jnp.ones((16, 16), jnp.int32), one, one)
    with pytest.raises(ValueError, match=r"argument 'scale' must be a float32 array of shape \(1,\)"):
        ext.quantize_fp8(x, jnp.ones((2,), jnp.float32), one)
    with pytest.raises(TypeError, match="argument 'fp8_dtype' must be float8_e4m3fn or float8_e5m2, got float16"):
        ext.quantize_fp8(x, one, one, jnp.float16)
    with pytest.raises(ValueError, match="at least one of 'rowwise' and 'columnwise' must be True"):
        ext.quantize_fp8(x, one, one, rowwise=False)
    with pytest.raises(ValueError, match="argument 'amax_epsilon' must be finite and >= 0"):
        ext.quantize_fp8_current_scaling(x, amax_epsilon=-1.0)
    with pytest.raises(ValueError, match="argument 'amax_compute_algo' must be 'max' or 'most_recent'"):
        ext.delayed_scaling_update(jnp.ones((4, 1), jnp.float32), one, amax_compute_algo="mean")
