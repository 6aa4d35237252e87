"""NVFP4BlockScaling in te-jax against te-core's independent NumPy oracle
(transformer_engine.core.reference_nvfp4: E2M1 / E4M3 casts, the global scale,
Philox words for stochastic rounding, the random Hadamard transform).

- quantize_nvfp4 / nvfp4_amax: data, scales and amaxes equal the oracle's, with
  1x16 blocks, 16x16 tiles, the RHT on the columnwise copy and stochastic rounding.
- dense: forward, dgrad and wgrad equal float64 products of the oracle's
  dequantized copies (the recipe's defaults: RHT on both wgrad operands, 2-D
  weights, stochastically rounded dY drawn from the dgrad quantizer's key) within
  te_gemm's FP32 accumulation bound; the key advances once per step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_helpers import assert_product, dense_and_vjp, dense_inputs, put

from transformer_engine.common import recipe
from transformer_engine.core import reference_nvfp4 as oracle
from transformer_engine.core.nvfp4 import RHT_SIGN_MASK
from transformer_engine.jax.cpp_extensions import nvfp4_amax, quantize_nvfp4
from transformer_engine.jax.quantize import NVFP4Quantizer, QuantizerFactory, ScalingMode
from transformer_engine.jax.quantize.quantizer import _key_of

pytestmark = [pytest.mark.nvfp4, pytest.mark.gemm_block, pytest.mark.module]
pytest_plugins = ["jax_fixtures"]  # the jax_device and jax_rng fixtures


def _seed_offset(words) -> tuple[int, int]:
    """The (seed, offset) uint64 pair of four uint32 words (little-endian halves)."""
    w = [int(v) for v in np.asarray(words, np.uint32)]
    return w[0] | (w[1] << 32), w[2] | (w[3] << 32)


@pytest.mark.parametrize("shape", [(32, 48), (48, 160), (2, 16, 96)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(
    "block_2d,rht,sr", [(False, False, False), (False, True, False), (True, False, False), (False, True, True)],
    ids=["1d", "rht", "2d", "rht_sr"],
)  # fmt: skip
def test_quantize_nvfp4_bytes_equal_the_oracle(jax_device, jax_rng, shape, dtype, block_2d, rht, sr):
    x = (jax_rng.standard_normal(shape) * np.exp2(jax_rng.integers(-8, 8, shape))).astype(dtype)
    x.reshape(-1)[:2] = [np.inf, np.nan]
    words = jax_rng.integers(0, 2**32, 4, dtype=np.uint64).astype(np.uint32)
    xd = put(x, jax_device)
    amax_row, amax_col = nvfp4_amax(xd, random_hadamard=rht, rht_sign_mask=RHT_SIGN_MASK)
    got = quantize_nvfp4(
        xd, amax_row, amax_col, put(words, jax_device), rowwise=True, columnwise=True, block_2d=block_2d,
        stochastic_rounding=sr, random_hadamard=rht, rht_sign_mask=RHT_SIGN_MASK,
    )  # fmt: skip
    seed, offset = _seed_offset(words)
    want = oracle.quantize(
        x.astype(np.float32), rowwise=True, columnwise=True, block_2d=block_2d, stochastic_rounding=sr, seed=seed,
        offset=offset, random_hadamard=rht, rht_sign_mask=RHT_SIGN_MASK,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(amax_row)[0], want["amax_rowwise"])
    np.testing.assert_array_equal(np.asarray(amax_col)[0], want["amax_columnwise"])
    for array, name in zip(got, ("rowwise", "rowwise_scale", "columnwise", "columnwise_scale")):
        expected = np.asarray(want[name]).view(np.uint8)
        np.testing.assert_array_equal(np.asarray(array).view(np.uint8).reshape(expected.shape), expected, err_msg=name)


def test_create_set_reads_the_recipe():
    qs = QuantizerFactory.create_set(recipe.NVFP4BlockScaling())
    assert qs.scaling_mode is ScalingMode.NVFP4_1D_SCALING and isinstance(qs.x, NVFP4Quantizer)
    assert (qs.x.random_hadamard, qs.kernel.block_2d, qs.dgrad.stochastic_rounding) == (True, True, True)
    assert qs.x.rng_state is None and qs.dgrad.rng_state.shape == (4,)  # (a key only where rounding draws)
    plain = QuantizerFactory.create_set(
        recipe.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True)
    )
    assert not (plain.x.random_hadamard or plain.kernel.block_2d or plain.dgrad.stochastic_rounding)


def _dq(q, name, amax) -> np.ndarray:
    return oracle.dequantize(q[name], q[name + "_scale"], amax).astype(np.float64)


@pytest.mark.parametrize("x_shape,kernel_shape", [((32, 64), (64, 48)), ((2, 16, 96), (96, 2, 32))], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_nvfp4_dense_matches_the_oracle(jax_device, jax_rng, x_shape, kernel_shape, dtype, jit):
    qs = QuantizerFactory.create_set(recipe.NVFP4BlockScaling(), rng_key=jax.random.PRNGKey(7))
    x, kernel, bias, dy = dense_inputs(jax_rng, x_shape, kernel_shape, dtype, x_range=4.0)
    y, dx, dk, db = dense_and_vjp(jax_device, x, kernel, bias, dy, qs, jit)
    assert y.shape == dy.shape and y.dtype == dtype and dk.dtype == np.float32
    x2 = x.reshape(-1, x_shape[-1]).astype(np.float32)
    k = kernel.astype(dtype).reshape(kernel_shape[0], -1).astype(np.float32)
    dy2 = dy.reshape(-1, k.shape[1]).astype(np.float32)
    # dY's stochastic rounding draws the words the dgrad quantizer's key gives (NVFP4Quantizer.quantize).
    _, draw = jax.random.split(_key_of(qs.dgrad.rng_state))
    seed, offset = _seed_offset(jax.random.bits(draw, (4,), jnp.uint32))
    rht = {"random_hadamard": True, "rht_sign_mask": RHT_SIGN_MASK}
    qx = oracle.quantize(x2, rowwise=True, columnwise=True, **rht)
    qk = oracle.quantize(k, rowwise=True, columnwise=True, block_2d=True)
    qdy = oracle.quantize(dy2, rowwise=True, columnwise=True, stochastic_rounding=True, seed=seed, offset=offset, **rht)
    x_row, x_col = _dq(qx, "rowwise", qx["amax_rowwise"]), _dq(qx, "columnwise", qx["amax_columnwise"])
    k_row, k_col = _dq(qk, "rowwise", qk["amax_rowwise"]), _dq(qk, "columnwise", qk["amax_columnwise"])
    dy_row, dy_col = _dq(qdy, "rowwise", qdy["amax_rowwise"]), _dq(qdy, "columnwise", qdy["amax_columnwise"])
    b64 = bias.astype(dtype).astype(np.float64).reshape(-1)
    assert_product(
        jax_device, y, x_row, k_col.T, False, plus=b64, bf16_operands=True
    )  # Y = X K: K's columnwise copy is [out, in]
    assert_product(jax_device, dx, dy_row, k_row.T, False, bf16_operands=True)  # dX = dY K^T
    assert_product(
        jax_device, np.asarray(dk).astype(dtype), x_col, dy_col.T, False, bf16_operands=True
    )  # dW = (X H)^T (dY H)
    np.testing.assert_allclose(np.asarray(db).reshape(-1), dy2.astype(np.float64).sum(0), rtol=1e-2, atol=1e-2)


def test_nvfp4_key_advances_as_the_sets_cotangent(jax_device, jax_rng):
    """The updated set comes back as the set's gradient (the delayed-scaling convention):
    the dgrad quantizer's key has moved on, so the next step draws other words."""
    from transformer_engine.jax.dense import dense

    qs = QuantizerFactory.create_set(recipe.NVFP4BlockScaling())
    x = put(jax_rng.standard_normal((32, 64)).astype(np.float32), jax_device)
    k = put(jax_rng.standard_normal((64, 32)).astype(np.float32), jax_device)
    _, new = jax.jit(jax.grad(lambda x, q: jnp.sum(dense(x, k, quantizer_set=q) ** 2), argnums=(0, 1)))(x, qs)
    want, _ = jax.random.split(_key_of(qs.dgrad.rng_state))
    np.testing.assert_array_equal(np.asarray(_key_of(new.dgrad.rng_state)), np.asarray(want))


def test_unsupported_nvfp4_options_raise():
    with pytest.raises(NotImplementedError, match="backward_override must be None"):
        QuantizerFactory.create_set(recipe.NVFP4BlockScaling(backward_override="high_precision"))
