"""Flax MultiHeadAttention and TransformerLayer against flax.linen references built from
their own parameters (flax.linen LayerNorm / DenseGeneral / dot_product_attention, a
complex-number rotary embedding, T5 buckets), decode with a KV cache against full causal
attention, parameter names, jit and argument errors."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_attention_helpers import assert_close, t5_buckets
from jax_helpers import put

from transformer_engine.jax import flax as te_flax


@pytest.fixture(autouse=True)
def _fp32_matmuls():
    """XLA's GPU dots compute float32 operands in TF32 by default (errors near
    1e-3); the unfused path and the flax.linen references are compared in FP32."""
    with jax.default_matmul_precision("highest"):
        yield


pytest_plugins = ["jax_fixtures"]

F32 = np.float32


def ln_ref(x, p, kind="layernorm", eps=1e-6):
    """flax.linen's LayerNorm / RMSNorm with our scale (and ln_bias)."""
    if kind == "rmsnorm":
        return nn.RMSNorm(epsilon=eps).apply({"params": {"scale": p["scale"]}}, x)
    return nn.LayerNorm(epsilon=eps).apply({"params": {"scale": p["scale"], "bias": p["ln_bias"]}}, x)


def dense_ref(x, p, features):
    params = {"kernel": p["kernel"]}
    if "bias" in p:
        params["bias"] = p["bias"]
    return nn.DenseGeneral(features=features, use_bias="bias" in p).apply({"params": params}, x)


def rope_ref(x, positions, windows=(1, 10000), method="consecutive"):
    """Rotation as complex multiplication: the pair (a, b) -> (a + ib) exp(i pos / t_k)."""
    d = x.shape[-1]
    t = windows[0] * (windows[1] / windows[0]) ** (2.0 * np.arange(d // 2) / d)
    angle = np.asarray(positions, np.float64)[None, :, None, None] / t
    x = np.asarray(x, np.float64)
    a, b = (x[..., 0::2], x[..., 1::2]) if method == "consecutive" else (x[..., : d // 2], x[..., d // 2 :])
    z = (a + 1j * b) * np.exp(1j * angle)
    if method == "consecutive":
        return np.stack([z.real, z.imag], axis=-1).reshape(x.shape)
    return np.concatenate([z.real, z.imag], axis=-1)


def attention_ref(q, k, v, keep, bias=None):
    """flax.linen.dot_product_attention at scale 1 (it divides q by sqrt(d): undone), kv heads
    repeated for GQA; keep [b, 1, sq, skv] True = attend."""
    h, hk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    k, v = jnp.repeat(k, h // hk, axis=-2), jnp.repeat(v, h // hk, axis=-2)
    return nn.dot_product_attention(q * np.sqrt(d), k, v, bias=bias, mask=keep)


def mha_ref(p, xq, xkv, keep, *, h, hk, d, kind="layernorm", rope=None, bias=None):
    """The reference MHA forward from MultiHeadAttention's params."""
    b, s = xq.shape[:2]
    if "qkv" in p:
        ln = ln_ref(xq, p["qkv"], kind)
        qkv = dense_ref(ln, p["qkv"], (3, h * d)).reshape(b, s, 3, h, d)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        ln = ln_ref(xq, p["query"], kind)
        q = dense_ref(ln, p["query"], h * d).reshape(b, s, h, d)
        kv_in = ln if xkv is xq else xkv
        skv = kv_in.shape[1]
        if "kv" in p:
            kv = dense_ref(kv_in, p["kv"], (2, hk * d)).reshape(b, skv, 2, hk, d)
            k, v = kv[:, :, 0], kv[:, :, 1]
        else:
            k = dense_ref(kv_in, p["key"], hk * d).reshape(b, skv, hk, d)
            v = dense_ref(kv_in, p["value"], hk * d).reshape(b, skv, hk, d)
    if rope is not None:
        q = jnp.asarray(rope_ref(q, np.arange(q.shape[1]), method=rope), F32)
        k = jnp.asarray(rope_ref(k, np.arange(k.shape[1]), method=rope), F32)
    x = attention_ref(q, k, v, keep, bias).reshape(b, s, h * d)
    return dense_ref(x, p["out"], xq.shape[-1])


def causal(b, s):
    return jnp.broadcast_to(jnp.tril(jnp.ones((s, s), bool)), (b, 1, s, s))


CASES = {
    "fused_qkv": dict(fuse_qkv_params=True, num_gqa_groups=None),
    "gqa_rmsnorm_bias_rope": dict(
        fuse_qkv_params=True, num_gqa_groups=2, layernorm_type="rmsnorm", use_bias=True, enable_rotary_pos_emb=True
    ),  # fmt: skip
    "separate_alternate_rope": dict(
        fuse_qkv_params=False, num_gqa_groups=4, enable_rotary_pos_emb=True, rotary_pos_emb_group_method="alternate"
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", list(CASES))
def test_mha_self_attention_against_flax(jax_device, jax_rng, case):
    kw = CASES[case]
    layer = te_flax.MultiHeadAttention(head_dim=8, num_attention_heads=4, attn_mask_type="causal",
                                       transpose_batch_sequence=False, **kw)  # fmt: skip
    x = put(jax_rng.standard_normal((2, 6, 16)).astype(F32), jax_device)
    variables = layer.init(jax.random.PRNGKey(1), x, x, deterministic=True)
    p = variables["params"]
    expected_names = {"fused_qkv": {"qkv", "out"}, "gqa_rmsnorm_bias_rope": {"query", "kv", "out"},
                      "separate_alternate_rope": {"query", "key", "value", "out"}}[case]  # fmt: skip
    assert set(p) == expected_names
    out, ln_out = layer.apply(variables, x, x, deterministic=True)
    assert ln_out is None
    rope = kw.get("rotary_pos_emb_group_method", "consecutive") if kw.get("enable_rotary_pos_emb") else None
    want = mha_ref(p, x, x, causal(2, 6), h=4, hk=kw["num_gqa_groups"] or 4, d=8,
                   kind=kw.get("layernorm_type", "layernorm"), rope=rope)  # fmt: skip
    assert_close("out", out, want, F32)
    # gradients flow to every parameter
    grads = jax.grad(lambda p: jnp.sum(layer.apply({"params": p}, x, x, deterministic=True)[0] ** 2))(p)
    assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree_util.tree_leaves(grads))


def test_mha_transpose_batch_sequence(jax_device, jax_rng):
    kw = dict(head_dim=8, num_attention_heads=4, num_gqa_groups=2, attn_mask_type="causal", enable_rotary_pos_emb=True)
    x = put(jax_rng.standard_normal((2, 6, 16)).astype(F32), jax_device)
    bshd = te_flax.MultiHeadAttention(transpose_batch_sequence=False, **kw)
    variables = bshd.init(jax.random.PRNGKey(7), x, x, deterministic=True)
    want, _ = bshd.apply(variables, x, x, deterministic=True)
    xt = jnp.swapaxes(x, 0, 1)
    got, _ = te_flax.MultiHeadAttention(transpose_batch_sequence=True, **kw).apply(
        variables, xt, xt, deterministic=True
    )
    assert_close("out", jnp.swapaxes(got, 0, 1), np.asarray(want), F32)


def test_mha_cross_attention_with_padding(jax_device, jax_rng):
    layer = te_flax.MultiHeadAttention(head_dim=8, num_attention_heads=4, attn_mask_type="padding",
                                       fuse_qkv_params=True, transpose_batch_sequence=False)  # fmt: skip
    xq = put(jax_rng.standard_normal((2, 5, 16)).astype(F32), jax_device)
    xkv = put(jax_rng.standard_normal((2, 7, 16)).astype(F32), jax_device)
    kv_lens = np.array([7, 3])
    masked = np.broadcast_to(np.arange(7)[None, None, None, :] >= kv_lens[:, None, None, None], (2, 1, 5, 7))
    variables = layer.init(jax.random.PRNGKey(2), xq, xkv, put(masked, jax_device), deterministic=True)
    assert set(variables["params"]) == {"query", "kv", "out"}
    out, _ = layer.apply(variables, xq, xkv, put(masked, jax_device), deterministic=True)
    want = mha_ref(variables["params"], xq, xkv, jnp.asarray(~masked), h=4, hk=4, d=8)
    assert_close("out", out, want, F32)


@pytest.mark.parametrize("rope", [False, True])
def test_decode_with_kv_cache_equals_full_attention(jax_device, jax_rng, rope):
    s = 6
    layer = te_flax.MultiHeadAttention(head_dim=8, num_attention_heads=4, num_gqa_groups=2, fuse_qkv_params=False,
                                       attn_mask_type="causal", enable_rotary_pos_emb=rope,
                                       transpose_batch_sequence=False)  # fmt: skip
    x = put(jax_rng.standard_normal((2, s, 16)).astype(F32), jax_device)
    variables = layer.init(jax.random.PRNGKey(3), x, x, decode=True, deterministic=True)
    full, _ = layer.apply({"params": variables["params"]}, x, x, deterministic=True)
    cache = variables["cache"]
    assert set(cache) == {"cached_key", "cached_value", "cache_index"}
    step = jax.jit(lambda c, t: layer.apply({"params": variables["params"], "cache": c}, t, t, decode=True,
                                            deterministic=True, mutable=["cache"]))  # fmt: skip
    for i in range(s):
        (out, _), new = step(cache, x[:, i : i + 1])
        cache = new["cache"]
        assert_close(f"token {i}", out[:, 0], np.asarray(full)[:, i], F32)
    assert int(cache["cache_index"]) == s


def tl_ref(p, x, *, heads, encoder=True, encoded=None):
    """The reference TransformerLayer (no dropout, relu MLP, relative bias) from its params."""
    b, s, hidden = x.shape
    d = hidden // heads
    table = np.asarray(p["relpos_bias"]["rel_embedding"])
    buckets = np.array([[t5_buckets(i, j, 32, 128, encoder) for j in range(s)] for i in range(s)])
    bias = jnp.asarray(table[:, buckets][None])
    attn = p["attention" if encoder else "self_attention"]
    x = x + mha_ref(attn, x, x, causal(b, s), h=heads, hk=heads, d=d, bias=bias)
    if not encoder:
        cross = p["encoder_decoder_attention"]
        x = x + mha_ref(cross, x, encoded, jnp.ones((b, 1, s, encoded.shape[1]), bool), h=heads, hk=heads, d=d)
    mlp = p["mlp"]
    ln = ln_ref(x, mlp)
    hid = jax.nn.relu(jnp.einsum("bsh,hai->bsai", ln, mlp["wi_kernel"]))[:, :, 0]
    return x + hid @ mlp["wo_kernel"]


@pytest.mark.parametrize("layer_type", list(te_flax.TransformerLayerType))
def test_transformer_layer_against_flax(jax_device, jax_rng, layer_type):
    encoder = layer_type == te_flax.TransformerLayerType.ENCODER
    layer = te_flax.TransformerLayer(hidden_size=32, mlp_hidden_size=48, num_attention_heads=4,
                                     hidden_dropout=0.0, attention_dropout=0.0, mlp_activations=("relu",),
                                     layer_type=layer_type)  # fmt: skip
    x = put(jax_rng.standard_normal((2, 6, 32)).astype(F32), jax_device)
    enc = None if encoder else put(jax_rng.standard_normal((2, 4, 32)).astype(F32), jax_device)
    no_mask = None if encoder else put(np.zeros((2, 1, 6, 4), bool), jax_device)
    variables = layer.init(jax.random.PRNGKey(4), x, enc, None, no_mask, deterministic=True)
    names = {"relpos_bias", "mlp", "attention"} if encoder else {"relpos_bias", "mlp", "self_attention",
                                                                 "encoder_decoder_attention"}  # fmt: skip
    assert set(variables["params"]) == names
    out = jax.jit(lambda v, x, e: layer.apply(v, x, e, None, no_mask, deterministic=True))(variables, x, enc)
    want = tl_ref(variables["params"], x, heads=4, encoder=encoder, encoded=enc)
    assert_close("out", out, want, F32)


def test_transformer_layer_dropout_and_errors(jax_device, jax_rng):
    layer = te_flax.TransformerLayer(hidden_size=16, mlp_hidden_size=32, num_attention_heads=2, hidden_dropout=0.5)
    x = put(jax_rng.standard_normal((2, 4, 16)).astype(F32), jax_device)
    variables = layer.init(jax.random.PRNGKey(5), x, deterministic=True)
    a = layer.apply(variables, x, rngs={"dropout": jax.random.PRNGKey(6)})
    b = layer.apply(variables, x, rngs={"dropout": jax.random.PRNGKey(6)})
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(layer.apply(variables, x, deterministic=True)))
    with pytest.raises(ValueError, match="hidden_size"):
        te_flax.TransformerLayer(hidden_size=15, num_attention_heads=2).init(jax.random.PRNGKey(0), x[..., :15])
    with pytest.raises(ValueError, match="decode"):
        layer.init(jax.random.PRNGKey(0), x, decode=True)
    with pytest.raises(ValueError, match="encoded"):
        decoder = te_flax.TransformerLayer(hidden_size=16, num_attention_heads=2,
                                           layer_type=te_flax.TransformerLayerType.DECODER)  # fmt: skip
        decoder.init(jax.random.PRNGKey(0), x)
    with pytest.raises(NotImplementedError, match="low_rank"):
        te_flax.TransformerLayer(hidden_size=16, num_attention_heads=2, low_rank_adaptation_scope="all").init(
            jax.random.PRNGKey(0), x
        )
