"""Flax DotProductAttention (fused and unfused paths), RelativePositionBiases and
MultiHeadAttention against flax.linen / jax.numpy references built from their own
parameters, the float64 oracle for the attention itself, and decode with a KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_attention_helpers import assert_close, cu, oracle, t5_buckets
from jax_helpers import put

from transformer_engine.jax import flax as te_flax


@pytest.fixture(autouse=True)
def _fp32_matmuls():
    """XLA's GPU dots compute float32 operands in TF32 by default (errors near
    1e-3); the unfused path and the flax.linen references are compared in FP32."""
    with jax.default_matmul_precision("highest"):
        yield


pytest_plugins = ["jax_fixtures"]

MASKS = ["no_mask", "causal", "padding", "padding_causal", "causal_bottom_right"]


def qkv(rng, dtype, b=2, sq=5, skv=7, h=4, hk=2, d=8):
    def r(*shape):
        return rng.standard_normal(shape).astype(dtype)

    return r(b, sq, h, d), r(b, skv, hk, d), r(b, skv, hk, d)


def padding_mask(q_lens, kv_lens, sq, skv):
    """[b, 1, sq, skv], True = masked out (a padded query or key)."""
    qm = np.arange(sq)[None, :, None] >= np.asarray(q_lens)[:, None, None]
    km = np.arange(skv)[None, None, :] >= np.asarray(kv_lens)[:, None, None]
    return (qm | km)[:, None]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("mask_type", MASKS)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_dot_product_attention_against_the_oracle(jax_device, jax_rng, monkeypatch, fused, mask_type, dtype):
    monkeypatch.setenv("NVTE_FUSED_ATTN", "1" if fused else "0")
    q, k, v = qkv(jax_rng, dtype)
    q_lens, kv_lens = jax_rng.integers(1, 6, 2), jax_rng.integers(1, 8, 2)
    mask = put(padding_mask(q_lens, kv_lens, 5, 7), jax_device) if "padding" in mask_type else None
    layer = te_flax.DotProductAttention(head_dim=8, num_attention_heads=4, num_gqa_groups=2, attn_mask_type=mask_type,
                                        transpose_batch_sequence=False)  # fmt: skip
    args = [put(x, jax_device) for x in (q, k, v)]
    variables = layer.init(jax.random.PRNGKey(0), *args, mask)
    d_o = jax_rng.standard_normal((2, 5, 4, 8)).astype(dtype)

    def loss(q, k, v):
        out = layer.apply(variables, q, k, v, mask, deterministic=True)
        return jnp.sum(out.astype(jnp.float32) * jnp.asarray(d_o, jnp.float32)), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(*args)
    lens = dict(cu_q=cu(q_lens), cu_kv=cu(kv_lens)) if "padding" in mask_type else {}
    want = oracle(q, k, v, d_o, mask=mask_type, **lens)
    if "padding" in mask_type:  # padded query rows: 0 in both paths
        want = (np.where(padding_mask(q_lens, np.full(2, 7), 5, 7)[:, 0, :, :1, None], 0.0, want[0]), *want[1:])
    assert out.dtype == dtype
    assert_close("out", out, want[0], dtype)
    for name, g, w in zip(("dq", "dk", "dv"), grads, want[1:4]):
        assert_close(name, g, w, dtype)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
def test_softmax_types_bias_window_transpose(jax_device, jax_rng, monkeypatch, fused, softmax_type):
    monkeypatch.setenv("NVTE_FUSED_ATTN", "1" if fused else "0")
    q, k, v = qkv(jax_rng, np.float32, sq=6, skv=6)
    bias = jax_rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    layer = te_flax.DotProductAttention(head_dim=8, num_attention_heads=4, num_gqa_groups=2, attn_mask_type="causal",
                                        attn_bias_type="pre_scale_bias", softmax_type=softmax_type, window_size=(2, 0),
                                        transpose_batch_sequence=True, scale_factor=0.3)  # fmt: skip
    sbhd = [put(np.swapaxes(x, 0, 1), jax_device) for x in (q, k, v)]
    variables = layer.init(jax.random.PRNGKey(0), *sbhd, None, put(bias, jax_device))
    inner = next(iter(variables["params"])) if "params" in variables else None
    offset = None
    if softmax_type == "learnable":
        assert inner == ("_FusedDotProductAttention_0" if fused else "_UnfusedDotProductAttention_0")
        offset = jax_rng.standard_normal((1, 4, 1, 1)).astype(np.float32)
        variables = {"params": {inner: {"softmax_offset": jnp.asarray(offset)}}}
    out = layer.apply(variables, *sbhd, None, put(bias, jax_device), deterministic=True)
    want = oracle(q, k, v, np.zeros_like(q), mask="causal", bias_type="pre_scale_bias", softmax=softmax_type,
                  scale=0.3, window=(2, 0), bias=bias, softmax_offset=offset)[0]  # fmt: skip
    assert_close("out", np.swapaxes(np.asarray(out), 0, 1), want, np.float32)


def test_packed_layouts_and_dropout(jax_device, jax_rng):
    q, k, v = qkv(jax_rng, np.float32, sq=6, skv=6, hk=4)
    packed = put(np.stack([q, k, v], axis=2), jax_device)
    layer = te_flax.DotProductAttention(head_dim=8, num_attention_heads=4, qkv_layout="bs3hd", attn_mask_type="causal",
                                        attention_dropout=0.3, transpose_batch_sequence=False)  # fmt: skip
    out = layer.apply({}, packed, None, None, deterministic=True)
    assert_close("out", out, oracle(q, k, v, np.zeros_like(q), mask="causal")[0], np.float32)
    rngs = {"dropout": jax.random.PRNGKey(3)}
    a = layer.apply({}, packed, None, None, rngs=rngs)
    b = layer.apply({}, packed, None, None, rngs=rngs)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(out))


def test_dot_product_attention_jit_and_errors(jax_device, jax_rng):
    q, k, v = (put(x, jax_device) for x in qkv(jax_rng, np.float32))
    layer = te_flax.DotProductAttention(head_dim=8, num_attention_heads=4, num_gqa_groups=2, attn_mask_type="no_mask")
    out = jax.jit(lambda q, k, v: layer.apply({}, q, k, v, deterministic=True))(q, k, v)
    assert out.shape == (2, 5, 4, 8)
    with pytest.raises(ValueError, match="qkv_layout"):
        te_flax.DotProductAttention(head_dim=8, num_attention_heads=4, qkv_layout="bhsd").apply({}, q, k, v)
    with pytest.raises(ValueError, match="dtype"):
        te_flax.DotProductAttention(head_dim=8, num_attention_heads=4, dtype=jnp.bfloat16).apply({}, q, k, v)
    with pytest.raises(NotImplementedError, match="context_parallel_axis"):
        te_flax.DotProductAttention(head_dim=8, num_attention_heads=4, context_parallel_axis="cp").apply({}, q, k, v)
    with pytest.raises(ValueError, match="bias"):
        te_flax.DotProductAttention(head_dim=8, num_attention_heads=4, attn_bias_type="post_scale_bias").apply(
            {}, q, k, v
        )


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_biases(bidirectional):
    layer = te_flax.RelativePositionBiases(num_buckets=32, max_distance=128, num_attention_heads=3)
    variables = layer.init(jax.random.PRNGKey(0), 40, 300, bidirectional)
    table = np.asarray(variables["params"]["rel_embedding"])
    assert table.shape == (3, 32)
    got = np.asarray(layer.apply(variables, 40, 300, bidirectional))
    want = np.array([[[table[h, t5_buckets(i, j, 32, 128, bidirectional)] for j in range(300)] for i in range(40)]
                     for h in range(3)])  # fmt: skip
    np.testing.assert_allclose(got[0], want, rtol=0, atol=0)
