"""MXFP8BlockScaling in te-jax against te-core's independent NumPy oracle
(transformer_engine.core.reference_mxfp8: ml_dtypes casts, E8M0 exponents).

- quantize_mxfp8 / MXFP8Quantizer: bytes of the data and scales equal the
  oracle's, rowwise, columnwise and 32x32 blocks, with hostile values.
- dense: forward, dgrad and wgrad equal float64 products of the oracle's
  dequantized copies (each GEMM reads the copy whose blocks run along its K)
  within te_gemm's FP32 accumulation bound; eager and jitted.
- layernorm_dense, layernorm_mlp and the Flax modules run under
  autocast(MXFP8BlockScaling()) and stay within MXFP8's error of high precision.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import assert_product, dense_and_vjp, dense_inputs, fp8_name, put

from transformer_engine.common import recipe
from transformer_engine.core import reference_mxfp8 as oracle
from transformer_engine.jax.cpp_extensions import quantize_mxfp8
from transformer_engine.jax.dense import dense
from transformer_engine.jax.quantize import MXFP8Quantizer, QuantizerFactory, ScalingMode

pytestmark = [pytest.mark.mxfp8, pytest.mark.gemm_block, pytest.mark.module]
pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures


def _bytes(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


def _dq(x, fmt, columnwise=False, use_2d_blocks=False) -> np.ndarray:
    """x quantized by the oracle (one direction) and dequantized, float64 [M, K]."""
    x2 = np.asarray(x).reshape(-1, np.shape(x)[-1])
    q, s = oracle.quantize_mxfp8(x2, fmt, columnwise=columnwise, use_2d_blocks=use_2d_blocks)
    return oracle.dequantize_mxfp8(q, s, fmt, columnwise=columnwise).astype(np.float64)


@pytest.mark.parametrize("shape", [(32, 64), (96, 32), (2, 48, 160)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("q_dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("use_2d_blocks", [False, True], ids=["1d", "2d"])
def test_quantize_mxfp8_bytes_equal_the_oracle(jax_device, jax_rng, shape, dtype, q_dtype, use_2d_blocks):
    x = (jax_rng.standard_normal(shape) * np.exp2(jax_rng.integers(-20, 20, shape))).astype(dtype)
    flat = x.reshape(-1)
    flat[:3] = [np.inf, -np.inf, np.nan]  # a block with infinities and a NaN
    flat[64:96] = 0  # an all-zero block
    row, row_s, col, col_s = quantize_mxfp8(
        put(x, jax_device), q_dtype, rowwise=True, columnwise=True, use_2d_blocks=use_2d_blocks
    )
    fmt = fp8_name(q_dtype)
    x2 = x.reshape(-1, shape[-1])
    for got, got_s, columnwise in ((row, row_s, False), (col, col_s, True)):
        want, want_s = oracle.quantize_mxfp8(x2, fmt, columnwise=columnwise, use_2d_blocks=use_2d_blocks)
        assert got.shape == x.shape and jnp.dtype(got.dtype) == jnp.dtype(q_dtype)
        np.testing.assert_array_equal(_bytes(got).reshape(want.shape), _bytes(want))
        np.testing.assert_array_equal(_bytes(got_s), _bytes(want_s))


def test_quantize_mxfp8_rejects_partial_blocks():
    with pytest.raises(ValueError, match="last dimension divisible by 32"):
        quantize_mxfp8(jnp.ones((32, 48)))
    with pytest.raises(ValueError, match="divisible by 32 for MXFP8 columnwise"):
        quantize_mxfp8(jnp.ones((16, 64)), columnwise=True)


def test_create_set_reads_the_recipe():
    qs = QuantizerFactory.create_set(recipe.MXFP8BlockScaling(enable_2d_quantization=True))
    assert qs.scaling_mode is ScalingMode.MXFP8_1D_SCALING
    assert isinstance(qs.x, MXFP8Quantizer) and not qs.x.use_2d_blocks and qs.kernel.use_2d_blocks
    assert qs.dgrad.q_dtype == jnp.float8_e4m3fn  # Format.E4M3, the recipe's default
    hybrid = QuantizerFactory.create_set(recipe.MXFP8BlockScaling(fp8_format=recipe.Format.HYBRID))
    assert hybrid.dgrad.q_dtype == jnp.float8_e5m2 and hybrid.x.q_dtype == jnp.float8_e4m3fn


SHAPES = [((32, 64), (64, 96)), ((2, 48, 32), (32, 64)), ((64, 128), (128, 2, 32))]


@pytest.mark.parametrize("x_shape,kernel_shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("two_d", [False, True], ids=["1d", "2d_kernel"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_mxfp8_dense_matches_the_oracle(jax_device, jax_rng, x_shape, kernel_shape, dtype, two_d, jit):
    qs = QuantizerFactory.create_set(
        recipe.MXFP8BlockScaling(fp8_format=recipe.Format.HYBRID, enable_2d_quantization=two_d)
    )
    x, kernel, bias, dy = dense_inputs(jax_rng, x_shape, kernel_shape, dtype, x_range=8.0)
    y, dx, dk, db = dense_and_vjp(jax_device, x, kernel, bias, dy, qs, jit)
    assert y.shape == dy.shape and y.dtype == dtype and dx.dtype == dtype and dk.dtype == np.float32
    k = kernel.astype(dtype).reshape(kernel_shape[0], -1)
    dy2 = dy.reshape(-1, k.shape[1])
    # The copies each GEMM reads (te/gemm_block.h): blocks along that GEMM's K.
    x_row, x_col = _dq(x, "e4m3"), _dq(x, "e4m3", columnwise=True)
    k_col = _dq(k, "e4m3", columnwise=True, use_2d_blocks=two_d)
    k_row = _dq(k, "e4m3", use_2d_blocks=two_d)
    dy_row, dy_col = _dq(dy2, "e5m2"), _dq(dy2, "e5m2", columnwise=True)
    b64 = bias.astype(dtype).astype(np.float64).reshape(-1)
    assert_product(jax_device, y, x_row, k_col, False, plus=b64)  # y
    assert_product(jax_device, dx, dy_row, k_row.T, False)  # dx
    assert_product(jax_device, np.asarray(dk).astype(dtype), x_col.T, dy_col, False)  # dk
    np.testing.assert_allclose(np.asarray(db).reshape(-1), dy2.astype(np.float64).sum(0), rtol=1e-2, atol=1e-2)


def test_mxfp8_dense_needs_whole_blocks():
    qs = QuantizerFactory.create_set(recipe.MXFP8BlockScaling())
    with pytest.raises(ValueError, match="multiples of 32 .MXFP8's 32-element blocks"):
        dense(jnp.ones((16, 64)), jnp.ones((64, 64)), quantizer_set=qs)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_mxfp8_layernorm_dense_and_mlp_stay_near_high_precision(jax_device, jax_rng):
    from transformer_engine.jax.layernorm_dense import layernorm_dense
    from transformer_engine.jax.layernorm_mlp import layernorm_mlp

    x = put(jax_rng.standard_normal((64, 64)).astype(np.float32), jax_device)
    gamma, beta = put(np.ones(64, np.float32), jax_device), put(np.zeros(64, np.float32), jax_device)
    k1 = put(jax_rng.standard_normal((64, 128)).astype(np.float32) * 0.1, jax_device)
    k2 = put(jax_rng.standard_normal((128, 64)).astype(np.float32) * 0.1, jax_device)
    mx = lambda: QuantizerFactory.create_set(recipe.MXFP8BlockScaling())  # noqa: E731
    hp = lambda: QuantizerFactory.create_set(None)  # noqa: E731

    def ln_dense(x, k, qs):
        return jnp.sum(layernorm_dense(x, k, gamma, beta, quantizer_set=qs) ** 2)

    def mlp(x, k1, k2, sets):
        return jnp.sum(
            layernorm_mlp(x, gamma, beta, (k1[:, None], k2), (None, None), "layernorm", quantizer_sets=sets) ** 2
        )

    for f, args_mx, args_hp in (
        (ln_dense, (x, k1, mx()), (x, k1, hp())),
        (mlp, (x, k1, k2, (mx(), mx())), (x, k1, k2, (hp(), hp()))),
    ):
        n = len(args_mx) - 1
        (v_mx, g_mx), (v_hp, g_hp) = (jax.value_and_grad(f, argnums=tuple(range(n)))(*a) for a in (args_mx, args_hp))
        assert _rel(v_mx, v_hp) < 0.05
        for a, b in zip(g_mx, g_hp):
            assert np.isfinite(np.asarray(a)).all() and _rel(a, b) < 0.2


def test_mxfp8_flax_dense_general_under_autocast(jax_device):
    flax = pytest.importorskip("flax")
    del flax
    from transformer_engine.jax import autocast
    from transformer_engine.jax.flax import DenseGeneral

    x = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal((32, 64)), jnp.float32), jax_device)
    layer = DenseGeneral(features=96)
    with autocast(enabled=True, recipe=recipe.MXFP8BlockScaling()):
        variables = layer.init(jax.random.PRNGKey(0), x)
        y = layer.apply(variables, x)
    plain = layer.apply(variables, x)
    assert y.shape == (32, 96) and not np.array_equal(np.asarray(y), np.asarray(plain))
    assert _rel(y, plain) < 0.1
