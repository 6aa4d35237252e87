"""Float8BlockScaling in te-jax against te-core's independent NumPy oracle
(transformer_engine.core.reference_fp8_block: per-block amax, scale and cast with
ml_dtypes, GEMM-ready layouts).

- quantize_fp8_block / Float8BlockQuantizer: data and scale bytes equal the
  oracle's, 1x128 and 128x128 blocks, edge blocks cut by M or K, hostile values.
- dense: forward, dgrad and wgrad equal float64 products of the oracle's
  dequantized copies (x 1-D, kernel 2-D, dY 1-D: the recipe's defaults, and all
  1-D) within te_gemm's FP32 accumulation bound; eager and jitted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import assert_product, dense_and_vjp, dense_inputs, fp8_name, put

from transformer_engine.common import recipe
from transformer_engine.core import reference_fp8_block as oracle
from transformer_engine.jax.cpp_extensions import quantize_fp8_block
from transformer_engine.jax.quantize import Float8BlockQuantizer, QuantizerFactory, ScalingMode

pytestmark = [pytest.mark.fp8_block, pytest.mark.gemm_block, pytest.mark.module]
pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures


def _bytes(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("shape", [(40, 48), (130, 272), (2, 70, 144)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("q_dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("block_2d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("pow2", [True, False], ids=["pow2", "fp32_scales"])
def test_quantize_fp8_block_bytes_equal_the_oracle(jax_device, jax_rng, shape, dtype, q_dtype, block_2d, pow2):
    x = (jax_rng.standard_normal(shape) * np.exp2(jax_rng.integers(-20, 20, shape))).astype(dtype)
    flat = x.reshape(-1)
    flat[:3] = [np.inf, -np.inf, np.nan]  # a block with infinities and a NaN
    row, row_s, col, col_s = quantize_fp8_block(
        put(x, jax_device), q_dtype, rowwise=True, columnwise=True, block_2d=block_2d, force_pow_2_scales=pow2
    )
    fmt = fp8_name(q_dtype)
    want = oracle.quantize(x, fmt, block_dim=2 if block_2d else 1, force_pow2=pow2)
    m, k = int(np.prod(shape[:-1])), shape[-1]
    assert row.shape == (m, k) and col.shape == (k, m)
    for got, name in (
        (row, "rowwise"),
        (row_s, "rowwise_scale_inv"),
        (col, "columnwise"),
        (col_s, "columnwise_scale_inv"),
    ):
        expected = np.asarray(want[name])
        np.testing.assert_array_equal(_bytes(got).reshape(-1), expected.view(np.uint8).reshape(-1), err_msg=name)


def test_create_set_reads_the_recipe():
    qs = QuantizerFactory.create_set(recipe.Float8BlockScaling())
    assert qs.scaling_mode is ScalingMode.FP8_BLOCK_SCALING
    assert isinstance(qs.x, Float8BlockQuantizer)
    assert (qs.x.block_2d, qs.kernel.block_2d, qs.dgrad.block_2d) == (False, True, False)  # the recipe's dims 1, 2, 1
    assert qs.x.power_2_scale and qs.dgrad.q_dtype == jnp.float8_e4m3fn


SHAPES = [((32, 64), (64, 48)), ((2, 24, 160), (160, 144)), ((16, 256), (256, 2, 64))]


def _dq(x2d, fmt, block_dim, columnwise, pow2):
    """The oracle's copy of x2d (rowwise [M, K] or columnwise [K, M]) dequantized, float64."""
    q = oracle.quantize(x2d, fmt, block_dim=block_dim, force_pow2=pow2)
    name = "columnwise" if columnwise else "rowwise"
    return oracle.dequantize(q[name], q[name + "_scale_inv"], fmt, block_dim, columnwise=columnwise).astype(np.float64)


@pytest.mark.parametrize("x_shape,kernel_shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("w_dim", [2, 1], ids=["w2d", "w1d"])
@pytest.mark.parametrize("pow2", [True, False], ids=["pow2", "fp32_scales"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_fp8_block_dense_matches_the_oracle(jax_device, jax_rng, x_shape, kernel_shape, dtype, w_dim, pow2, jit):
    # (FP32 scales make a tensor's two copies differ, so a GEMM reading the wrong copy fails)
    r = recipe.Float8BlockScaling(fp8_format=recipe.Format.HYBRID, w_block_scaling_dim=w_dim, use_f32_scales=not pow2)
    qs = QuantizerFactory.create_set(r)
    assert qs.x.power_2_scale == pow2
    x, kernel, bias, dy = dense_inputs(jax_rng, x_shape, kernel_shape, dtype, x_range=8.0)
    y, dx, dk, db = dense_and_vjp(jax_device, x, kernel, bias, dy, qs, jit)
    assert y.shape == dy.shape and y.dtype == dtype and dx.dtype == dtype and dk.dtype == np.float32
    x2 = x.reshape(-1, x_shape[-1])
    k = kernel.astype(dtype).reshape(kernel_shape[0], -1)
    dy2 = dy.reshape(-1, k.shape[1])
    # The copies each GEMM reads (te/gemm_block.h, TN): blocks along that GEMM's K.
    x_row, x_col = _dq(x2, "e4m3", 1, False, pow2), _dq(x2, "e4m3", 1, True, pow2)  # [M, in], [in, M]
    k_row, k_col = _dq(k, "e4m3", w_dim, False, pow2), _dq(k, "e4m3", w_dim, True, pow2)  # [in, out], [out, in]
    dy_row, dy_col = _dq(dy2, "e5m2", 1, False, pow2), _dq(dy2, "e5m2", 1, True, pow2)  # [M, out], [out, M]
    b64 = bias.astype(dtype).astype(np.float64).reshape(-1)
    # On a GPU the GEMM may take cuBLASLt's native FP8-block kernel (FP8 tensor-core
    # accumulation: fp8=True's bound) or the emulated path (operands rounded to BF16:
    # inexact for FP32 scales); the CPU computes on the FP32 dequantized values.
    near = {"fp8": True, "bf16_operands": not pow2}
    assert_product(jax_device, y, x_row, k_col.T, plus=b64, **near)  # y
    assert_product(jax_device, dx, dy_row, k_row.T, **near)  # dx
    assert_product(jax_device, np.asarray(dk).astype(dtype), x_col, dy_col.T, **near)  # dk
    np.testing.assert_allclose(np.asarray(db).reshape(-1), dy2.astype(np.float64).sum(0), rtol=1e-2, atol=1e-2)


def test_fp8_block_layernorm_mlp_stays_near_high_precision(jax_device, jax_rng):
    from transformer_engine.jax.layernorm_mlp import layernorm_mlp

    x = put(jax_rng.standard_normal((64, 64)).astype(np.float32), jax_device)
    gamma, beta = put(np.ones(64, np.float32), jax_device), put(np.zeros(64, np.float32), jax_device)
    k1 = put(jax_rng.standard_normal((64, 1, 128)).astype(np.float32) * 0.1, jax_device)
    k2 = put(jax_rng.standard_normal((128, 64)).astype(np.float32) * 0.1, jax_device)

    def mlp(x, k1, k2, sets):
        return jnp.sum(layernorm_mlp(x, gamma, beta, (k1, k2), (None, None), "layernorm", quantizer_sets=sets) ** 2)

    block = tuple(QuantizerFactory.create_set(recipe.Float8BlockScaling()) for _ in range(2))
    plain = tuple(QuantizerFactory.create_set(None) for _ in range(2))
    (v_b, g_b), (v_p, g_p) = (jax.value_and_grad(mlp, argnums=(0, 1, 2))(x, k1, k2, s) for s in (block, plain))
    rel = lambda a, b: float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))  # noqa: E731
    assert rel(v_b, v_p) < 0.05 and all(rel(a, b) < 0.2 for a, b in zip(g_b, g_p))
