"""te.DotProductAttention against the float64 oracle (pt_attention_ref), forward and backward.

Each backend (unfused torch math; te-core's fused op where the build has it)
runs mask types x layouts x GQA x windows x bias types x softmax types on
small odd shapes. Inputs are float32, the oracle float64 on the same values.
"""

from __future__ import annotations

import pytest
import torch
from pt_attention_ref import attention as oracle

import transformer_engine.pytorch as te
from transformer_engine.pytorch.kernels import attention as fused_kernels

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.attention, pytest.mark.module, pytest.mark.usefixtures("te_state")]

BACKENDS = ["unfused", "fused"]
MASKS = [
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    if request.param == "fused":
        if not fused_kernels.available():
            pytest.skip("this te-core build has no attention op")
        monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    else:
        monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")  # (test_attention_flash.py checks that one)
    return request.param


def _to_format(x, fmt):
    """padded bshd [b, s, h, d] -> sbhd / bshd (thd is built by the thd test)."""
    return x.transpose(0, 1).contiguous() if fmt == "sbhd" else x.contiguous()


def _from_format(y, fmt, b):
    """module output [s, b, h*d] / [b, s, h*d] -> [b, s, h*d]."""
    return y.transpose(0, 1) if fmt == "sbhd" else y


def _case(b, sq, skv, h, hk, d, dv, padded):
    torch.manual_seed(1234 + sq * 31 + skv)
    q = torch.randn(b, sq, h, d, dtype=torch.float64)
    k = torch.randn(b, skv, hk, d, dtype=torch.float64)
    v = torch.randn(b, skv, hk, dv, dtype=torch.float64)
    if padded:
        lq = torch.randint(1, sq + 1, (b,))
        lkv = torch.randint(1, skv + 1, (b,))
        lq[0], lkv[-1] = sq, skv  # one full sequence each way
    else:
        lq, lkv = torch.full((b,), sq), torch.full((b,), skv)
    return q, k, v, lq, lkv


def _cu(lens):
    return torch.cat((torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)))


def _run(dpa, q, k, v, fmt, g, **kw):
    """Module forward/backward in float32: (out [b, sq, h*dv], dq, dk, dv) as float64."""
    qs, ks, vs = (_to_format(t.float(), fmt).requires_grad_() for t in (q, k, v))
    out = dpa(qs, ks, vs, qkv_format=fmt, **kw)
    out_b = _from_format(out, fmt, q.shape[0])
    out_b.backward(g.float())
    grads = [_from_format(t.grad, fmt, q.shape[0]).double() for t in (qs, ks, vs)]
    return (out_b.double(), *grads)


def _oracle(q, k, v, lq, lkv, g, **kw):
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    o = oracle(qs, ks, vs, lq, lkv, **kw)
    o = o.reshape(*o.shape[:2], -1) + 0 * (qs.sum() + ks.sum() + vs.sum())  # (all rows may be masked)
    o.backward(g)
    return o.detach(), qs.grad, ks.grad, vs.grad


def _close(got, want, name, tol=2e-5):
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, f"{name}[{i}] shape {tuple(a.shape)} vs {tuple(b.shape)}"
        err = (a - b).abs().max().item()
        assert err <= tol * (1 + b.abs().max().item()), f"{name}[{i}]: max error {err}"


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("mask_type", MASKS)
@pytest.mark.parametrize("shape", [(2, 5, 5, 4, 2, 8, 8), (3, 3, 7, 6, 1, 4, 6)], ids=["self_gqa2", "cross_mqa_dv"])
def test_masks_and_layouts(backend, fmt, mask_type, shape):
    b, sq, skv, h, hk, d, dv = shape
    padded = "padding" in mask_type
    q, k, v, lq, lkv = _case(b, sq, skv, h, hk, d, dv, padded)
    g = torch.randn(b, sq, h * dv, dtype=torch.float64)
    kw, okw = {}, {}
    if padded:
        kw = dict(cu_seqlens_q=_cu(lq), cu_seqlens_kv=_cu(lkv))
    if mask_type == "arbitrary":
        arb = torch.rand(b, 1, sq, skv) < 0.3
        arb[0, 0, 1, :] = True  # one fully masked row: output 0, gradient 0
        kw["attention_mask"], okw["arbitrary"] = arb, arb
    dpa = te.DotProductAttention(h, (d, dv), num_gqa_groups=hk, attn_mask_type=mask_type, qkv_format=fmt)
    got = _run(dpa, q, k, v, fmt, g, **kw)
    bottom_right = mask_type not in ("causal", "padding_causal")
    want = _oracle(q, k, v, lq, lkv, g, mask_type=mask_type, bottom_right=bottom_right, **okw)
    _close(got, want, f"{mask_type}/{fmt}")
    assert dpa.last_backend == backend


def test_padding_from_attention_mask(backend):
    """A padding mask given as attention_mask (True = padded) equals cu_seqlens."""
    b, s, h, d = 3, 6, 2, 8
    q, k, v, lq, _ = _case(b, s, s, h, h, d, d, True)
    g = torch.randn(b, s, h * d, dtype=torch.float64)
    mask = torch.arange(s)[None, :] >= lq[:, None]
    dpa = te.DotProductAttention(h, d, attn_mask_type="padding_causal", qkv_format="bshd")
    got = _run(dpa, q, k, v, "bshd", g, attention_mask=mask[:, None, None, :])
    want = _oracle(q, k, v, lq, lq, g, mask_type="padding_causal", bottom_right=False)
    _close(got, want, "attention_mask")


@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("window", [(2, 1), (0, 0), (3, -1), (-1, 2)])
@pytest.mark.parametrize("bottom_right_diagonal", [None, True, False])
def test_sliding_window(backend, mask_type, window, bottom_right_diagonal):
    b, sq, skv, h, d = 2, 5, 7, 2, 4
    q, k, v, lq, lkv = _case(b, sq, skv, h, h, d, d, "padding" in mask_type)
    g = torch.randn(b, sq, h * d, dtype=torch.float64)
    kw = dict(cu_seqlens_q=_cu(lq), cu_seqlens_kv=_cu(lkv)) if "padding" in mask_type else {}
    with pytest.warns(UserWarning) if "causal" in mask_type and window[1] != 0 else _nothing():
        dpa = te.DotProductAttention(
            h,
            d,
            attn_mask_type=mask_type,
            window_size=window,
            qkv_format="bshd",
            bottom_right_diagonal=bottom_right_diagonal,
        )
    eff = (window[0], 0) if "causal" in mask_type else window
    br = (mask_type != "causal") if bottom_right_diagonal is None else bottom_right_diagonal
    windowed = eff[0] >= 0 or (eff[1] >= 0 and "causal" not in mask_type)
    if backend == "fused" and windowed and br != (mask_type != "causal"):
        # te-core aligns windows by the mask type only: no backend left (unfused is off here)
        with pytest.raises(ValueError, match="sliding window aligned"):
            _run(dpa, q, k, v, "bshd", g, **kw)
        return
    got = _run(dpa, q, k, v, "bshd", g, **kw)
    want = _oracle(q, k, v, lq, lkv, g, mask_type=mask_type, window=eff, bottom_right=br)
    _close(got, want, f"window {window}")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


@pytest.mark.parametrize(
    "bias_type,bias_shape",
    [
        ("pre_scale_bias", (1, 3, 5, 6)),
        ("post_scale_bias", (1, 3, 5, 6)),
        ("post_scale_bias", (2, 1, 5, 6)),
    ],
)
def test_bias(backend, bias_type, bias_shape):
    b, sq, skv, h, d = 2, 5, 6, 3, 4
    q, k, v, lq, lkv = _case(b, sq, skv, h, h, d, d, False)
    g = torch.randn(b, sq, h * d, dtype=torch.float64)
    bias = torch.randn(bias_shape, dtype=torch.float64)
    bias32 = bias.float().requires_grad_()
    dpa = te.DotProductAttention(h, d, attn_mask_type="causal_bottom_right", qkv_format="bshd")
    got = _run(dpa, q, k, v, "bshd", g, core_attention_bias_type=bias_type, core_attention_bias=bias32)
    bias64 = bias.clone().requires_grad_()
    want = _oracle(q, k, v, lq, lkv, g, mask_type="causal_bottom_right", bias_type=bias_type, bias=bias64)
    _close(got, want, bias_type)
    _close([bias32.grad.double()], [bias64.grad], "dbias")


@pytest.mark.parametrize("h", [4, 6])
@pytest.mark.parametrize("slopes", ["default", "per_head", "per_batch"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "padding_causal_bottom_right"])
def test_alibi(backend, h, slopes, mask_type):
    b, sq, skv, d = 2, 4, 6, 4
    q, k, v, lq, lkv = _case(b, sq, skv, h, h, d, d, "padding" in mask_type)
    g = torch.randn(b, sq, h * d, dtype=torch.float64)
    given = {"default": None, "per_head": torch.rand(h), "per_batch": torch.rand(b, h)}[slopes]
    kw = dict(cu_seqlens_q=_cu(lq), cu_seqlens_kv=_cu(lkv)) if "padding" in mask_type else {}
    dpa = te.DotProductAttention(h, d, attn_mask_type=mask_type, qkv_format="bshd")
    if backend == "fused" and mask_type == "causal":
        # causal aligns ALiBi top-left (bottom_right_diagonal defaults to False); te-core
        # aligns it bottom-right, so with sq != skv only the unfused backend (off here) can run
        with pytest.raises(ValueError, match="ALiBi aligned to the top-left"):
            _run(dpa, q, k, v, "bshd", g, core_attention_bias_type="alibi", alibi_slopes=given, **kw)
        return
    got = _run(dpa, q, k, v, "bshd", g, core_attention_bias_type="alibi", alibi_slopes=given, **kw)
    want = _oracle(
        q, k, v, lq, lkv, g, mask_type=mask_type, bias_type="alibi", slopes=given, bottom_right=mask_type != "causal"
    )
    _close(got, want, f"alibi {slopes}")


@pytest.mark.parametrize("softmax_type", ["vanilla", "off-by-one", "learnable"])
def test_softmax_types(backend, softmax_type):
    b, s, h, hk, d = 2, 5, 4, 2, 8
    q, k, v, lq, lkv = _case(b, s, s, h, hk, d, d, True)
    g = torch.randn(b, s, h * d, dtype=torch.float64)
    dpa = te.DotProductAttention(
        h, d, num_gqa_groups=hk, attn_mask_type="padding_causal", qkv_format="sbhd", softmax_type=softmax_type
    )
    sink = None
    if softmax_type == "learnable":
        with torch.no_grad():
            dpa.softmax_offset.copy_(torch.randn(h))
        sink = dpa.softmax_offset.detach().double().clone().requires_grad_()
    got = _run(dpa, q, k, v, "sbhd", g, cu_seqlens_q=_cu(lq), cu_seqlens_kv=_cu(lkv))
    want = _oracle(
        q, k, v, lq, lkv, g, mask_type="padding_causal", bottom_right=False, softmax_type=softmax_type, sink=sink
    )
    _close(got, want, softmax_type)
    if sink is not None:
        _close([dpa.softmax_offset.grad.double()], [sink.grad], "dsoftmax_offset")


def test_softcap_unfused(monkeypatch):
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    b, s, h, d = 2, 5, 2, 8
    q, k, v, lq, lkv = _case(b, s, s, h, h, d, d, False)
    q = q * 4  # logits big enough for the cap to bite
    g = torch.randn(b, s, h * d, dtype=torch.float64)
    dpa = te.DotProductAttention(h, d, attn_mask_type="causal", qkv_format="bshd", softcap=2.0)
    got = _run(dpa, q, k, v, "bshd", g)
    want = _oracle(q, k, v, lq, lkv, g, mask_type="causal", bottom_right=False, softcap=2.0)
    _close(got, want, "softcap")


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right", "causal"])
@pytest.mark.parametrize("gaps", [False, True], ids=["packed", "padded_apart"])
def test_thd_equals_padded(backend, mask_type, gaps):
    """thd (packed, optionally with gaps given by cu_seqlens_*_padded) against the same sequences in bshd."""
    b, s, h, hk, d = 3, 6, 4, 2, 8
    q, k, v, lq, lkv = _case(b, s, s, h, hk, d, d, True)
    lkv = lq.clone()  # self-attention on packed sequences
    g = torch.randn(b, s, h * d, dtype=torch.float64)
    pad = torch.tensor([2, 0, 1]) if gaps else torch.zeros(b, dtype=torch.long)
    cu, cu_pad = _cu(lq), _cu(lq + pad)
    total = int(cu_pad[-1])

    def pack(x):
        out = torch.zeros(total, *x.shape[2:], dtype=torch.float32)
        for i in range(b):
            out[int(cu_pad[i]) : int(cu_pad[i]) + int(lq[i])] = x[i, : int(lq[i])].float()
        return out.requires_grad_()

    qt, kt, vt = pack(q), pack(k), pack(v)
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hk, attn_mask_type=mask_type, qkv_format="thd")
    kw = dict(cu_seqlens_q_padded=cu_pad, cu_seqlens_kv_padded=cu_pad) if gaps else {}
    out = dpa(qt, kt, vt, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s, max_seqlen_kv=s, **kw)
    gt = torch.zeros(total, h * d)
    for i in range(b):
        gt[int(cu_pad[i]) : int(cu_pad[i]) + int(lq[i])] = g[i, : int(lq[i])].float()
    out.backward(gt)
    mt = "padding_" + mask_type if "padding" not in mask_type else mask_type
    want = _oracle(
        q,
        k,
        v,
        lq,
        lkv,
        g * (torch.arange(s)[None, :, None] < lq[:, None, None]),
        mask_type=mt,
        bottom_right=mt not in ("causal", "padding_causal"),
    )

    def unpack(x):
        rows = torch.zeros(b, s, *x.shape[1:], dtype=torch.float64)
        for i in range(b):
            rows[i, : int(lq[i])] = x[int(cu_pad[i]) : int(cu_pad[i]) + int(lq[i])].double()
        return rows

    got = [unpack(out.detach()), unpack(qt.grad), unpack(kt.grad), unpack(vt.grad)]
    _close(got, want, f"thd {mask_type}")
    for i in range(b):  # the gaps between sequences stay zero
        start = int(cu_pad[i]) + int(lq[i])
        assert torch.all(out[start : int(cu_pad[i + 1])] == 0)


def test_bf16_forward(backend):
    b, s, h, d = 2, 7, 4, 16
    q, k, v, lq, lkv = _case(b, s, s, h, h, d, d, False)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd")
    out = dpa(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    want = oracle(
        q.bfloat16().double(),
        k.bfloat16().double(),
        v.bfloat16().double(),
        lq,
        lkv,
        mask_type="causal",
        bottom_right=False,
    ).reshape(b, s, -1)
    # inputs exact in bf16; FP32 arithmetic; one bf16 rounding of the output (2^-8 relative)
    assert (out.double() - want).abs().max() <= 2**-8 * want.abs().max() + 1e-6


def test_qkv_layer_packed(backend):
    b, s, h, d = 2, 5, 2, 8
    x = torch.randn(b, s, 3, h, d)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd")
    got = dpa(qkv_layer=x)
    want = dpa(x[:, :, 0], x[:, :, 1], x[:, :, 2])
    assert torch.equal(got, want)


def test_dropout_train_and_eval(monkeypatch):
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    b, s, h, d = 2, 6, 2, 8
    q, k, v, lq, lkv = _case(b, s, s, h, h, d, d, False)
    dpa = te.DotProductAttention(h, d, attention_dropout=0.5, qkv_format="bshd")
    args = [t.float() for t in (q, k, v)]
    torch.manual_seed(0)
    a = dpa(*args)
    torch.manual_seed(0)
    assert torch.equal(a, dpa(*args))  # seeded: reproducible
    want = oracle(q, k, v, lq, lkv, mask_type="causal", bottom_right=False).reshape(b, s, -1)
    assert (a.double() - want).abs().max() > 1e-3  # dropout acted
    dpa.eval()
    assert (dpa(*args).double() - want).abs().max() < 1e-5


def test_checkpoint_core_attention(backend):
    b, s, h, d = 2, 5, 2, 8
    q, k, v, lq, lkv = _case(b, s, s, h, h, d, d, False)
    g = torch.randn(b, s, h * d, dtype=torch.float64)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd")
    got = _run(dpa, q, k, v, "bshd", g, checkpoint_core_attention=True)
    want = _oracle(q, k, v, lq, lkv, g, mask_type="causal", bottom_right=False)
    _close(got, want, "checkpointed")


def test_errors(monkeypatch):
    q = torch.randn(2, 4, 2, 8)
    dpa = te.DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="arbitrary")
    with pytest.raises(ValueError, match="attention_mask"):
        dpa(q, q, q)
    with pytest.raises(ValueError, match="attn_mask_type"):
        te.DotProductAttention(2, 8, attn_mask_type="diagonal")
    with pytest.raises(ValueError, match="num_gqa_groups"):
        te.DotProductAttention(4, 8, num_gqa_groups=3)
    dpa = te.DotProductAttention(2, 8, qkv_format="bshd")
    with pytest.raises(ValueError, match="key/value heads"):
        dpa(q, torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8))
    with pytest.raises(ValueError, match="core_attention_bias"):
        dpa(q, q, q, core_attention_bias_type="post_scale_bias")
    with pytest.raises(NotImplementedError, match="cp_group"):
        te.DotProductAttention(2, 8, cp_group=object())
    with pytest.raises(NotImplementedError, match="sequence_parallel"):
        te.DotProductAttention(2, 8, sequence_parallel=True)
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    with pytest.raises(ValueError, match="no attention backend can run.*NVTE_UNFUSED_ATTN"):
        dpa(q, q, q)


def test_default_backend_is_fused_with_fallback(monkeypatch):
    """With both enabled: te-core's op when it supports the call, the unfused backend otherwise."""
    if not fused_kernels.available():
        pytest.skip("this te-core build has no attention op")
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")  # (on CUDA the flash backend comes first)
    q = torch.randn(2, 4, 2, 8)
    dpa = te.DotProductAttention(2, 8, qkv_format="bshd")
    dpa(q, q, q)
    assert dpa.last_backend == "fused"
    capped = te.DotProductAttention(2, 8, qkv_format="bshd", softcap=5.0)
    capped(q, q, q)
    assert capped.last_backend == "unfused"


def test_dropout_forward_backward_agree(backend):
    """O is linear in V for a fixed dropout mask, so <g, O> = <dV, V> holds
    exactly when backward applies the forward's mask; seeded calls repeat."""
    b, s, h, d = 2, 6, 2, 8
    q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
    dpa = te.DotProductAttention(h, d, attention_dropout=0.4, qkv_format="bshd")
    vs = v.clone().requires_grad_()
    torch.manual_seed(7)
    out = dpa(q, k, vs)
    g = torch.randn_like(out)
    out.backward(g)
    lhs, rhs = (g.double() * out.double()).sum(), (vs.grad.double() * v.double()).sum()
    assert abs(lhs - rhs) <= 1e-4 * (1 + abs(lhs))
    torch.manual_seed(7)
    assert torch.equal(dpa(q, k, v), out.detach())
    dpa.eval()
    want = oracle(q.double(), k.double(), v.double(), [s] * b, [s] * b, mask_type="causal", bottom_right=False)
    assert (dpa(q, k, v).double() - want.reshape(b, s, -1)).abs().max() < 1e-5
    assert (out.double() - want.reshape(b, s, -1)).abs().max() > 1e-3  # dropout acted in training


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_forward_backward(backend, dtype):
    """16-bit q/k/v/dO (exact in the oracle), FP32 arithmetic, each result rounded
    once to the 16-bit type: within 2 units of its roundoff of the largest value
    (one rounding plus FP32 accumulation, far below it at these sizes)."""
    b, s, h, hk, d = 2, 7, 4, 2, 16
    q, k, v, lq, lkv = _case(b, s, s, h, hk, d, d, True)
    q, k, v = (t.to(dtype).double() for t in (q, k, v))
    g = torch.randn(b, s, h * d, dtype=torch.float64).to(dtype).double()
    qs, ks, vs = (t.to(dtype).requires_grad_() for t in (q, k, v))
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hk, attn_mask_type="padding_causal", qkv_format="bshd")
    out = dpa(qs, ks, vs, cu_seqlens_q=_cu(lq), cu_seqlens_kv=_cu(lkv))
    assert out.dtype == dtype
    out.backward(g.to(dtype))
    want = _oracle(q, k, v, lq, lkv, g, mask_type="padding_causal", bottom_right=False)
    u = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    for got, ref in zip((out, qs.grad, ks.grad, vs.grad), want):
        assert got.dtype == dtype
        assert (got.double() - ref).abs().max() <= 2 * u * ref.abs().max() + 1e-6
