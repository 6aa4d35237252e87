"""transformer_engine.jax.cpp_extensions.gemm (XLA FFI -> te_gemm) against a
float64 NumPy product of the operands as te/gemm.h defines them (FP8 ones
dequantized: float32(q) * scale_inv), for every transpose combination, bias,
bias gradient and FP8 pairing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import EPS, gemm_tolerance

from transformer_engine.core import reference as ref
from transformer_engine.jax import cpp_extensions as ext

pytestmark = pytest.mark.gemm

pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures


def _op(x: np.ndarray, trans: bool) -> np.ndarray:
    """op(x) in float64: the stored matrix, transposed when trans."""
    x = x.reshape(-1, x.shape[-1]).astype(np.float64)
    return x.T if trans else x


@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("transb", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16], ids=lambda d: np.dtype(d).name)
def test_high_precision_gemm(jax_device, jax_rng, transa, transb, dtype):
    m, k, n = 48, 80, 32
    a = jax_rng.standard_normal((k, m) if transa else (m, k)).astype(dtype)
    b = jax_rng.standard_normal((n, k) if transb else (k, n)).astype(dtype)
    put = lambda x: jax.device_put(jnp.asarray(x), jax_device)  # noqa: E731
    out = ext.gemm(put(a), put(b), transa=transa, transb=transb)
    assert out.dtype == dtype and out.shape == (m, n)
    a64 = _op(a, transa)
    b64 = _op(b, transb)  # op(B): B stored [N, K] when transb
    expected = a64 @ b64
    err = np.abs(np.asarray(out).astype(np.float64) - expected)
    assert (err <= gemm_tolerance(jax_device, a64, b64, dtype, False)).all()


@pytest.mark.parametrize("a_fmt,b_fmt", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")])
@pytest.mark.parametrize("out_dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_fp8_gemm_with_bias(jax_device, jax_rng, a_fmt, b_fmt, out_dtype):
    m, k, n = 64, 96, 48  # (FP8 GEMMs need multiples of 16)
    a_q = ref.quantize_fp8(jax_rng.standard_normal((m, k)) * 3, 1.0, a_fmt)
    b_q = ref.quantize_fp8(jax_rng.standard_normal((n, k)), 1.0, b_fmt)
    a_si, b_si = np.float32(0.25), np.float32(1.5)
    bias = jax_rng.standard_normal(n).astype(out_dtype)
    put = lambda x: jax.device_put(jnp.asarray(x), jax_device)  # noqa: E731
    out = ext.gemm(
        put(a_q.view(ref.FP8_NUMPY[a_fmt])),
        put(b_q.view(ref.FP8_NUMPY[b_fmt])),
        transb=True,
        a_scale_inv=put(np.array([a_si])),
        b_scale_inv=put(np.array([b_si])),
        bias=put(bias),
        out_dtype=out_dtype,
    )
    a64 = ref.dequantize_fp8(a_q, a_si, a_fmt).astype(np.float64)
    b64 = ref.dequantize_fp8(b_q, b_si, b_fmt).astype(np.float64).T
    expected = a64 @ b64 + bias.astype(np.float64)
    err = np.abs(np.asarray(out).astype(np.float64) - expected)
    # (+ one more rounding of the output type: the fused bias epilogue may round the product first)
    tol = gemm_tolerance(jax_device, a64, b64, out_dtype, True) + EPS[np.dtype(out_dtype)] * np.abs(expected)
    assert (err <= tol).all()


def test_wgrad_gemm_with_bias_grad_and_3d_input(jax_device, jax_rng):
    tokens, out_f, in_f = 2 * 24, 32, 40
    dy = jax_rng.standard_normal((2, 24, out_f)).astype(np.float32)
    x = jax_rng.standard_normal((2, 24, in_f)).astype(np.float32)
    put = lambda v: jax.device_put(jnp.asarray(v), jax_device)  # noqa: E731
    # dW = dY^T X: A = dY stored [tokens, out] transposed, B = X stored [tokens, in]
    dw, db = ext.gemm(put(dy), put(x), transa=True, bias_grad=True)
    dy64, x64 = dy.reshape(tokens, out_f).astype(np.float64), x.reshape(tokens, in_f).astype(np.float64)
    np.testing.assert_allclose(np.asarray(dw), dy64.T @ x64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(db), dy64.sum(axis=0), rtol=1e-5, atol=1e-5)
    # forward: Y = X W^T keeps X's leading dims
    w = jax_rng.standard_normal((out_f, in_f)).astype(np.float32)
    y = ext.gemm(put(x), put(w), transb=True)
    assert y.shape == (2, 24, out_f)
    np.testing.assert_allclose(np.asarray(y).reshape(tokens, out_f), x64 @ w.T.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_gemm_under_jit(jax_device, jax_rng):
    a = jax.device_put(jnp.asarray(jax_rng.standard_normal((32, 16)).astype(np.float32)), jax_device)
    b = jax.device_put(jnp.asarray(jax_rng.standard_normal((24, 16)).astype(np.float32)), jax_device)
    out = jax.jit(lambda a, b: ext.gemm(a, b, transb=True))(a, b)
    np.testing.assert_allclose(np.asarray(out), np.asarray(a) @ np.asarray(b).T, rtol=1e-5, atol=1e-5)


def test_bad_gemm_arguments_name_the_argument_and_rule():
    a = jnp.ones((32, 16), jnp.float32)
    with pytest.raises(ValueError, match=r"inner dimensions differ: op\(a\) is \[32, 16\] but op\(b\) is \[32, 16\]"):
        ext.gemm(a, a)
    fp8 = jnp.ones((32, 16), jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="argument 'a_scale_inv' is required for an FP8 'a'"):
        ext.gemm(fp8, fp8, transb=True)
    with pytest.raises(TypeError, match="arguments 'a' and 'b' must both be FP8 or have the same type"):
        ext.gemm(a, jnp.ones((32, 16), jnp.bfloat16), transb=True)
    with pytest.raises(ValueError, match=r"argument 'bias' must have shape \(32,\)"):
        ext.gemm(a, a, transb=True, bias=jnp.ones((16,), jnp.float32))
    with pytest.raises(ValueError, match="argument 'a' must have at least 2 dimensions"):
        ext.gemm(jnp.ones((16,), jnp.float32), a)
