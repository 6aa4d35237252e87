"""te.MultiheadAttention against pt_transformer_ref's float64 version built
from its own parameters: self/cross attention, fused or split QKV weights
(interleaved or not), GQA, input LayerNorm/RMSNorm with return_layernorm_output,
q/k norms, rotary embeddings; forward and backward."""

from __future__ import annotations

import pytest
import torch
from pt_norm_mlp_ref import params64
from pt_transformer_ref import mha64, rope_angles

import transformer_engine.pytorch as te

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.attention, pytest.mark.module, pytest.mark.usefixtures("te_state")]

HIDDEN, HEADS = 24, 4


def _settings(groups, interleaved, fuse, rms=False, qk_norm=None, input_ln=True, mask_type="causal"):
    return dict(
        heads=HEADS,
        groups=groups,
        d=HIDDEN // HEADS,
        eps=1e-5,
        zc=False,
        rms=rms,
        interleaved=interleaved and fuse,
        input_ln=input_ln,
        qk_norm=qk_norm,
        mask_type=mask_type,
    )


def _perturb(module):
    """Random norm weights/biases (they start at 1 / 0) so that every parameter matters."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))


def _compare(module, x, want_fn, names, tol=3e-5, **kw):
    xs = x.float().clone().requires_grad_()
    out = module(xs, **kw)
    y = out[0] if isinstance(out, tuple) else out
    g = torch.randn_like(y)
    y.backward(g)
    p = params64(module)
    x64 = x.clone().requires_grad_()
    want = want_fn(x64, p)
    want.backward(g.double())
    scale = 1 + want.abs().max().item()
    assert (y.double() - want).abs().max().item() <= tol * scale, "output"
    assert (xs.grad.double() - x64.grad).abs().max().item() <= tol * (1 + x64.grad.abs().max().item()), "dx"
    for n in names:
        got, ref = dict(module.named_parameters())[n].grad.double(), p[n].grad
        assert (got - ref).abs().max().item() <= tol * (1 + ref.abs().max().item()), f"grad {n}"
    return out


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("groups", [4, 2, 1])
@pytest.mark.parametrize("fuse,interleaved", [(True, True), (True, False), (False, True)])
def test_self_attention(fmt, groups, fuse, interleaved):
    m = te.MultiheadAttention(
        HIDDEN,
        HEADS,
        num_gqa_groups=groups,
        attention_dropout=0.0,
        input_layernorm=True,
        fuse_qkv_params=fuse,
        qkv_weight_interleaved=interleaved,
        qkv_format=fmt,
        device="cpu",
    )
    _perturb(m)
    c = _settings(groups, interleaved, fuse)
    x = torch.randn(3, 5, HIDDEN, dtype=torch.float64)  # bshd
    xin = x.transpose(0, 1).contiguous() if fmt == "sbhd" else x

    def want(x64, p):
        xb = x64.transpose(0, 1) if fmt == "sbhd" else x64
        out, bias, _ = mha64(xb, p, c)
        out = out + bias
        return out.transpose(0, 1) if fmt == "sbhd" else out

    qkv = "layernorm_qkv.weight" if fuse else "layernorm_qkv.key_weight"
    _compare(m, xin, want, [qkv, "layernorm_qkv.layer_norm_weight", "proj.weight"])


@pytest.mark.parametrize("qk_norm", ["RMSNorm", "LayerNorm", "L2Normalization"])
@pytest.mark.parametrize("before_rope", [False, True])
def test_qk_norm_rope_return_layernorm_output(qk_norm, before_rope):
    m = te.MultiheadAttention(
        HIDDEN,
        HEADS,
        num_gqa_groups=2,
        attention_dropout=0.0,
        input_layernorm=True,
        normalization="RMSNorm",
        return_layernorm_output=True,
        return_bias=True,
        qk_norm_type=qk_norm,
        qk_norm_before_rope=before_rope,
        qkv_format="bshd",
        device="cpu",
    )
    _perturb(m)
    c = dict(_settings(2, True, False, rms=True, qk_norm=qk_norm), qk_norm_before_rope=before_rope)
    s, d = 6, HIDDEN // HEADS
    freqs = te.RotaryPositionEmbedding(d)(s)
    angles = rope_angles(torch.arange(s), d)[None]

    def want(x64, p):
        out, _, _ = mha64(x64, p, c, angles=angles)
        return out

    x = torch.randn(2, s, HIDDEN, dtype=torch.float64)
    out = _compare(m, x, want, ["layernorm_qkv.query_weight"], rotary_pos_emb=freqs)
    assert len(out) == 3
    p = params64(m)
    _, bias, ln = mha64(x, p, c, angles=angles)
    assert (out[1].double() - bias).abs().max() == 0  # proj's bias, returned apart
    assert (out[2].double() - ln).abs().max() < 1e-5  # the normalized input


@pytest.mark.parametrize("fuse", [True, False])
def test_cross_attention(fuse):
    m = te.MultiheadAttention(
        HIDDEN,
        HEADS,
        num_gqa_groups=2,
        attention_dropout=0.0,
        input_layernorm=True,
        attention_type="cross",
        attn_mask_type="no_mask",
        fuse_qkv_params=fuse,
        qkv_format="bshd",
        device="cpu",
    )
    _perturb(m)
    c = _settings(2, True, fuse, mask_type="no_mask")
    enc = torch.randn(2, 7, HIDDEN, dtype=torch.float64)

    def want(x64, p):
        out, bias, _ = mha64(x64, p, c, encoder=enc, cross=True)
        return out + bias

    names = [
        "key_value.weight" if fuse else "key_value.value_weight",
        "layernorm_query." + ("weight" if fuse else "query_weight"),
    ]
    _compare(m, torch.randn(2, 4, HIDDEN, dtype=torch.float64), want, names, encoder_output=enc.float())


def test_state_dict_names_and_errors():
    m = te.MultiheadAttention(
        HIDDEN,
        HEADS,
        num_gqa_groups=2,
        input_layernorm=True,
        qk_norm_type="LayerNorm",
        softmax_type="learnable",
        device="cpu",
    )
    keys = set(m.state_dict())
    for k in (
        "layernorm_qkv.query_weight",
        "layernorm_qkv.key_weight",
        "layernorm_qkv.value_weight",
        "q_norm.weight",
        "q_norm.bias",
        "k_norm.weight",
        "core_attention.softmax_offset",
        "core_attention._extra_state",
        "proj.weight",
    ):
        assert k in keys, k
    assert m.layernorm_qkv.key_weight.shape == (2 * HIDDEN // HEADS, HIDDEN)
    with pytest.raises(NotImplementedError, match="tp_size"):
        te.MultiheadAttention(HIDDEN, HEADS, tp_size=2, device="cpu")
    with pytest.raises(NotImplementedError, match="sequence_parallel"):
        te.MultiheadAttention(HIDDEN, HEADS, sequence_parallel=True, device="cpu")
    with pytest.raises(ValueError, match="qk_norm_type"):
        te.MultiheadAttention(HIDDEN, HEADS, qk_norm_type="BatchNorm", device="cpu")
    with pytest.raises(ValueError, match="encoder_output"):
        te.MultiheadAttention(HIDDEN, HEADS, attention_type="cross", device="cpu")(torch.randn(3, 2, HIDDEN))


def test_thd_equals_each_sequence_alone():
    """qkv_format='thd' (packed tokens, cu_seqlens) with RoPE = each sequence run alone in bshd."""
    kw = dict(num_gqa_groups=2, attention_dropout=0.0, input_layernorm=True, fuse_qkv_params=True, device="cpu")
    packed = te.MultiheadAttention(HIDDEN, HEADS, qkv_format="thd", attn_mask_type="padding_causal", **kw)
    single = te.MultiheadAttention(HIDDEN, HEADS, qkv_format="bshd", attn_mask_type="causal", **kw)
    single.load_state_dict(packed.state_dict())
    lens = [3, 6, 1]
    cu = torch.tensor([0, 3, 9, 10], dtype=torch.int32)
    x = torch.randn(10, HIDDEN)
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS)(8)
    out = packed(x, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=6, max_seqlen_kv=6, rotary_pos_emb=freqs)
    assert out.shape == (10, HIDDEN)
    for i, n in enumerate(lens):
        piece = x[int(cu[i]) : int(cu[i]) + n][None]
        want = single(piece, rotary_pos_emb=freqs)[0]
        torch.testing.assert_close(out[int(cu[i]) : int(cu[i]) + n], want, atol=1e-5, rtol=1e-5)
