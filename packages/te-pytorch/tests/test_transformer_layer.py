"""te.TransformerLayer: against pt_transformer_ref's float64 layer built from
its own parameters (every layout option), the reference's state_dict keys,
a checkpoint round trip, FP8 autocast and torch.compile."""

from __future__ import annotations

import io

import pytest
import torch
from pt_norm_mlp_ref import params64
from pt_transformer_ref import transformer64

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.attention, pytest.mark.module, pytest.mark.usefixtures("te_state")]

H, F, HEADS = 32, 48, 4  # (FP8 GEMMs need multiples of 16)


def _layer(**kw):
    args = dict(hidden_dropout=0.0, attention_dropout=0.0, device="cpu")
    args.update(kw)
    layer = te.TransformerLayer(H, F, HEADS, **args)
    with torch.no_grad():  # norm weights/biases start at 1/0: make every parameter matter
        for name, p in layer.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    return layer


def _settings(layer, **kw):
    c = dict(
        heads=HEADS,
        groups=HEADS,
        d=H // HEADS,
        eps=1e-5,
        zc=False,
        rms=False,
        interleaved=False,
        input_ln=True,
        mask_type="causal",
        act="gelu",
        post_ln=False,
        output_ln=False,
        parallel=False,
        decoder=False,
    )
    c.update(kw)
    return c


CASES = {
    "pre_ln": {},
    "post_ln": dict(apply_residual_connection_post_layernorm=True),
    "output_ln": dict(output_layernorm=True),
    "parallel": dict(parallel_attention_mlp=True),
    "decoder": dict(layer_type="decoder"),
    "llama": dict(
        normalization="RMSNorm",
        activation="swiglu",
        num_gqa_groups=2,
        bias=False,
        zero_centered_gamma=True,
        fuse_qkv_params=True,
    ),
    "interleaved_qkv_bshd": dict(
        fuse_qkv_params=True, attn_input_format="bshd", activation="relu", self_attn_mask_type="no_mask"
    ),
}


def _oracle_settings(name, kw):
    return dict(
        post_ln=kw.get("apply_residual_connection_post_layernorm", False),
        output_ln=kw.get("output_layernorm", False),
        input_ln=not kw.get("output_layernorm", False),
        parallel=kw.get("parallel_attention_mlp", False),
        decoder=kw.get("layer_type") == "decoder",
        rms=kw.get("normalization") == "RMSNorm",
        zc=kw.get("zero_centered_gamma", False),
        act=kw.get("activation", "gelu"),
        groups=kw.get("num_gqa_groups", HEADS),
        interleaved=kw.get("fuse_qkv_params", False),
        mask_type=kw.get("self_attn_mask_type", "causal"),
    )


@pytest.mark.parametrize("name", list(CASES))
def test_against_float64(name):
    kw = CASES[name]
    layer = _layer(**kw)
    c = _settings(layer, **_oracle_settings(name, kw))
    bshd = kw.get("attn_input_format") == "bshd"
    x = torch.randn(2, 5, H, dtype=torch.float64)  # [b, s, h]
    enc = torch.randn(2, 3, H, dtype=torch.float64)
    to_fmt = (lambda t: t) if bshd else (lambda t: t.transpose(0, 1).contiguous())
    xs = to_fmt(x).float().requires_grad_()
    extra = dict(encoder_output=to_fmt(enc).float()) if c["decoder"] else {}
    y = layer(xs, **extra)
    g = torch.randn_like(y)
    y.backward(g)
    p = params64(layer)
    x64 = x.clone().requires_grad_()
    want = transformer64(x64, p, c, encoder=enc)
    want_fmt = want if bshd else want.transpose(0, 1)
    want_fmt.backward(g.double())
    tol = 5e-5
    assert (y.double() - want_fmt).abs().max() <= tol * (1 + want.abs().max()), "output"
    dx = xs.grad if bshd else xs.grad.transpose(0, 1)
    assert (dx.double() - x64.grad).abs().max() <= tol * (1 + x64.grad.abs().max()), "dx"
    for n, param in layer.named_parameters():
        ref = p[n].grad
        assert ref is not None, n
        assert (param.grad.double() - ref).abs().max() <= tol * (1 + ref.abs().max()), f"grad {n}"


# The reference's key names for TransformerLayer(hidden, ffn, heads) with the
# defaults (fuse_qkv_params=False: split query/key/value; LayerNorm; bias),
# from te_reference.md §2.4 and §9.7 (layernorm_qkv / query_weight / proj /
# layer_norm_weight / fc1_weight and `_extra_state` per TE module, FP8
# attention metadata at core_attention._extra_state since v1.8) and the
# reference's transformer_engine/pytorch/attention/multi_head_attention.py
# (parameters_split=("query", "key", "value") for layernorm_qkv).
REFERENCE_KEYS = [
    "self_attention.layernorm_qkv.layer_norm_weight",
    "self_attention.layernorm_qkv.layer_norm_bias",
    "self_attention.layernorm_qkv.query_weight",
    "self_attention.layernorm_qkv.query_bias",
    "self_attention.layernorm_qkv.key_weight",
    "self_attention.layernorm_qkv.key_bias",
    "self_attention.layernorm_qkv.value_weight",
    "self_attention.layernorm_qkv.value_bias",
    "self_attention.layernorm_qkv._extra_state",
    "self_attention.core_attention._extra_state",
    "self_attention.proj.weight",
    "self_attention.proj.bias",
    "self_attention.proj._extra_state",
    "layernorm_mlp.layer_norm_weight",
    "layernorm_mlp.layer_norm_bias",
    "layernorm_mlp.fc1_weight",
    "layernorm_mlp.fc1_bias",
    "layernorm_mlp.fc2_weight",
    "layernorm_mlp.fc2_bias",
    "layernorm_mlp._extra_state",
]
# fuse_qkv_params=True: one fused QKV weight (te_reference.md §2.4; the names test_numerics' GPT uses).
REFERENCE_KEYS_FUSED = [k for k in REFERENCE_KEYS if not k.startswith("self_attention.layernorm_qkv.")] + [
    "self_attention.layernorm_qkv.layer_norm_weight",
    "self_attention.layernorm_qkv.layer_norm_bias",
    "self_attention.layernorm_qkv.weight",
    "self_attention.layernorm_qkv.bias",
    "self_attention.layernorm_qkv._extra_state",
]


def test_state_dict_keys_are_the_reference_ones():
    assert sorted(te.TransformerLayer(H, F, HEADS, device="cpu").state_dict()) == sorted(REFERENCE_KEYS)
    fused = te.TransformerLayer(H, F, HEADS, fuse_qkv_params=True, device="cpu")
    assert sorted(fused.state_dict()) == sorted(REFERENCE_KEYS_FUSED)
    # GQA shapes (the reference's test_gqa): key/value weights have num_gqa_groups heads.
    gqa = te.TransformerLayer(H, F, HEADS, num_gqa_groups=2, device="cpu")
    assert gqa.self_attention.layernorm_qkv.key_weight.shape == (2 * H // HEADS, H)
    assert gqa.self_attention.proj.weight.shape == (H, H)
    dec = te.TransformerLayer(H, F, HEADS, layer_type="decoder", device="cpu")
    keys = set(dec.state_dict())
    for k in (
        "inter_attention.layernorm_query.query_weight",
        "inter_attention.key_value.key_weight",
        "inter_attention.key_value.value_weight",
        "inter_attention.proj.weight",
    ):
        assert k in keys


def test_checkpoint_round_trip():
    a = _layer(fuse_qkv_params=True)
    b = _layer(fuse_qkv_params=True)
    x = torch.randn(8, 2, H)
    with te.autocast(recipe=recipe.DelayedScaling()):  # FP8 state in the linears' _extra_state
        a(x).sum().backward()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf, weights_only=True))
    for (n, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        if isinstance(pa, torch.Tensor):
            assert torch.equal(pa, pb), n
    assert torch.equal(a(x), b(x))
    with te.autocast(recipe=recipe.DelayedScaling()):
        assert torch.equal(a(x), b(x))  # same scales from the loaded state


@pytest.mark.parametrize(
    "fp8_recipe", [recipe.DelayedScaling(), recipe.Float8CurrentScaling()], ids=["delayed", "current"]
)
def test_fp8_autocast(fp8_recipe):
    """The QKV/proj/MLP GEMMs run in FP8, the attention in high precision. The
    bound: E4M3 perturbs each GEMM operand by at most 2^-4 relative; the 4
    GEMMs of the forward path have 8 quantized operands, so the branches
    (output minus the exact residual x) are off by at most 8 * 2^-4 of their
    norm to first order. The FP8 result must also differ from the
    high-precision one (it really ran in FP8)."""
    layer = _layer(num_gqa_groups=2)
    x = torch.randn(8, 4, H)
    ref = layer(x)
    for _ in range(3):  # delayed scaling: the later steps use the recorded amaxes
        xs = x.clone().requires_grad_()
        with te.autocast(recipe=fp8_recipe):
            y = layer(xs)
        y.sum().backward()
    err = ((y - ref).norm() / (ref - x).norm()).item()
    assert 0 < err <= 8 * 2.0**-4
    assert torch.isfinite(xs.grad).all()


def test_drop_path_and_dropout_modes():
    layer = _layer(drop_path_rate=0.5, hidden_dropout=0.3)
    x = torch.randn(8, 2, H)
    layer.eval()
    a = layer(x)
    assert torch.equal(a, layer(x))  # eval: no randomness
    layer.train()
    torch.manual_seed(3)
    b = layer(x)
    assert not torch.equal(a, b)


def test_unsupported_arguments():
    with pytest.raises(NotImplementedError, match="sequence_parallel"):
        te.TransformerLayer(H, F, HEADS, sequence_parallel=True, device="cpu")
    with pytest.raises(NotImplementedError, match="ub_tp_comm_overlap"):
        te.TransformerLayer(H, F, HEADS, ub_tp_comm_overlap=True, device="cpu")
    with pytest.raises(NotImplementedError, match="tp_size"):
        te.TransformerLayer(H, F, HEADS, tp_size=2, device="cpu")
    with pytest.raises(ValueError, match="layer_type"):
        te.TransformerLayer(H, F, HEADS, layer_type="middle", device="cpu")
    with pytest.raises(ValueError, match="parallel_attention_mlp"):
        te.TransformerLayer(H, F, HEADS, parallel_attention_mlp=True, layer_type="decoder", device="cpu")
    layer = te.TransformerLayer(H, F, HEADS, device="cpu")
    with pytest.raises(NotImplementedError, match="context parallelism"):
        layer.set_context_parallel_group(object(), [0, 1], None)


@pytest.mark.parametrize(
    "attn_backend,fp8_recipe",
    [("fused", None), ("fused", recipe.Float8CurrentScaling()), ("unfused", None)],
    ids=["fused", "fused_current", "unfused"],
)
def test_compile_fullgraph_matches_eager(attn_backend, fp8_recipe, monkeypatch):
    """torch.compile(fullgraph=True) of a forward + backward: the same kernels run,
    so outputs and every gradient are bit-identical (aot_eager)."""
    from transformer_engine.pytorch.kernels import attention as fused_kernels

    if attn_backend == "fused" and not fused_kernels.available():
        pytest.skip("this te-core build has no attention op")
    monkeypatch.setenv("NVTE_FUSED_ATTN" if attn_backend == "unfused" else "NVTE_UNFUSED_ATTN", "0")
    torch._dynamo.reset()
    layer = _layer(num_gqa_groups=2)
    x = torch.randn(8, 2, H)

    def step(model):
        xs = x.clone().requires_grad_()
        for p in layer.parameters():
            p.grad = None
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            y = model(xs)
        y.square().sum().backward()
        return [y.detach(), xs.grad] + [p.grad.clone() for p in layer.parameters()]

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        got, want = step(compiled), step(layer)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert layer.self_attention.core_attention.last_backend == attn_backend
    torch._dynamo.reset()


@pytest.mark.parametrize("window", [None, (2, 0)])
def test_padded_batch_equals_each_sequence_alone(window):
    """A right-padded batch with a padding_causal attention_mask (True = padded):
    the real tokens' outputs equal each sequence run alone with a causal mask."""
    layer = _layer(attn_input_format="bshd", window_size=window)
    lens = [5, 2, 4]
    x = torch.randn(3, 5, H)
    pad = torch.arange(5)[None, :] >= torch.tensor(lens)[:, None]
    out = layer(x, attention_mask=pad[:, None, None, :], self_attn_mask_type="padding_causal")
    for i, n in enumerate(lens):
        want = layer(x[i : i + 1, :n], self_attn_mask_type="causal")
        torch.testing.assert_close(out[i, :n], want[0], atol=1e-5, rtol=1e-5)
