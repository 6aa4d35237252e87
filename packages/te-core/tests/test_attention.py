"""The attention family's CPU backend against the float64 oracle
(reference_attention.py), forward and backward, within the bounds derived in
attention_helpers.py: every mask type, layout, GQA/MQA, windows, bias types,
softmax variants and odd shapes."""

from __future__ import annotations

import numpy as np
import pytest
from attention_helpers import DTYPES, check_against_oracle, layout_shape, rand

import transformer_engine.core as tec

MASKS = [
    "no_mask",
    "causal",
    "causal_bottom_right",
    "padding",
    "padding_causal",
    "padding_causal_bottom_right",
    "arbitrary",
]


def make(rng, dtype, fmt="bshd", b=2, sq=7, skv=9, h=4, hk=2, d=8, dv=None):
    dv = d if dv is None else dv
    q = rand(rng, layout_shape(fmt, b, sq, h, d), dtype)
    k = rand(rng, layout_shape(fmt, b, skv, hk, d), dtype)
    v = rand(rng, layout_shape(fmt, b, skv, hk, dv), dtype)
    d_o = rand(rng, layout_shape(fmt, b, sq, h, dv), dtype)
    return q, k, v, d_o


def cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def mask_opts(rng, mask, b, h, sq, skv):
    opts = {"attn_mask_type": mask}
    if "padding" in mask:
        opts["cu_seqlens_q"] = cu(rng.integers(1, sq + 1, b))
        opts["cu_seqlens_kv"] = cu(rng.integers(1, skv + 1, b))
    if mask == "arbitrary":
        opts["attn_mask"] = rng.random((b, 1, sq, skv)) < 0.3
    return opts


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask", MASKS)
def test_masks_and_layouts(rng, dtype, fmt, mask):
    q, k, v, d_o = make(rng, dtype, fmt)
    check_against_oracle(q, k, v, d_o, {"qkv_format": fmt, **mask_opts(rng, mask, 2, 4, 7, 9)}, dtype)


@pytest.mark.parametrize("hk", [1, 2, 4])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
def test_gqa_mqa(rng, hk, mask):
    q, k, v, d_o = make(rng, "fp32", h=4, hk=hk)
    check_against_oracle(q, k, v, d_o, {"attn_mask_type": mask}, "fp32")


@pytest.mark.parametrize(
    "mask,window,sq,skv",
    [
        ("causal", (2, 0), 9, 9),
        ("causal", (0, -1), 9, 9),
        ("no_mask", (3, 1), 7, 11),
        ("no_mask", (-1, 2), 11, 7),
        ("no_mask", (0, 0), 8, 8),
        ("causal_bottom_right", (3, 0), 5, 12),
        ("padding_causal", (2, 0), 9, 9),
        ("padding", (1, 1), 9, 6),
        ("arbitrary", (4, 2), 8, 10),
    ],
)
def test_windows(rng, mask, window, sq, skv):
    q, k, v, d_o = make(rng, "fp32", sq=sq, skv=skv)
    opts = {**mask_opts(rng, mask, 2, 4, sq, skv), "window_size": window}
    check_against_oracle(q, k, v, d_o, opts, "fp32")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bias_type", ["pre_scale_bias", "post_scale_bias"])
@pytest.mark.parametrize("bias_shape", [(1, 4), (2, 1), (1, 1), (2, 4)])
def test_bias(rng, dtype, bias_type, bias_shape):
    q, k, v, d_o = make(rng, dtype)
    bias = rand(rng, (*bias_shape, 7, 9), dtype)
    opts = {"attn_bias_type": bias_type, "attn_bias": bias, "attn_mask_type": "causal_bottom_right"}
    check_against_oracle(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize("h", [4, 6])
@pytest.mark.parametrize("slopes", [None, "per_head", "per_batch"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding_causal_bottom_right"])
def test_alibi(rng, h, slopes, mask):
    q, k, v, d_o = make(rng, "fp32", h=h, hk=2, sq=6, skv=10)
    opts = {"attn_bias_type": "alibi", **mask_opts(rng, mask, 2, h, 6, 10)}
    if slopes == "per_head":
        opts["alibi_slopes"] = rng.random(h).astype(np.float32)
    elif slopes == "per_batch":
        opts["alibi_slopes"] = rng.random((2, h)).astype(np.float32)
    check_against_oracle(q, k, v, d_o, opts, "fp32")


def test_default_alibi_slopes_formula():
    from transformer_engine.core import reference_attention as ref

    assert np.allclose(ref.default_alibi_slopes(8), [2.0 ** (-(i + 1)) for i in range(8)])
    # 6 heads: the 4 slopes of 4 heads, then slopes 1 and 3 of 8 heads.
    want = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    assert np.allclose(ref.default_alibi_slopes(6), want)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("softmax", ["off_by_one", "learnable"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding"])
def test_softmax_variants(rng, dtype, softmax, mask):
    q, k, v, d_o = make(rng, dtype)
    opts = {"softmax_type": softmax, **mask_opts(rng, mask, 2, 4, 7, 9)}
    if softmax == "learnable":
        opts["softmax_offset"] = rng.standard_normal(4).astype(np.float32)
    check_against_oracle(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize(
    "b,sq,skv,h,hk,d,dv",
    [(3, 5, 13, 2, 1, 72, 72), (1, 1, 1, 1, 1, 4, 3), (3, 70, 33, 3, 3, 16, 24), (2, 33, 130, 2, 2, 8, 8)],
)
def test_odd_shapes(rng, b, sq, skv, h, hk, d, dv):
    for mask in ["no_mask", "causal_bottom_right"]:
        q, k, v, d_o = make(rng, "bf16", b=b, sq=sq, skv=skv, h=h, hk=hk, d=d, dv=dv)
        check_against_oracle(q, k, v, d_o, {"attn_mask_type": mask}, "bf16")


def test_custom_scale(rng):
    q, k, v, d_o = make(rng, "fp32")
    check_against_oracle(q, k, v, d_o, {"attn_scale": 0.37, "attn_mask_type": "causal"}, "fp32")


# ---- thd: packed sequences, with and without padded offsets.


def thd_case(rng, dtype, lq, lkv, pad_q=None, pad_kv=None, h=4, hk=2, d=8):
    """Packed q/k/v/d_o of sequences of lengths lq/lkv, gaps of pad_q/pad_kv rows after each."""
    pad_q = [0] * len(lq) if pad_q is None else pad_q
    pad_kv = [0] * len(lkv) if pad_kv is None else pad_kv
    off_q, off_kv = cu(np.add(lq, pad_q)), cu(np.add(lkv, pad_kv))
    q = rand(rng, (off_q[-1], h, d), dtype)
    k = rand(rng, (off_kv[-1], hk, d), dtype)
    v = rand(rng, (off_kv[-1], hk, d), dtype)
    d_o = rand(rng, (off_q[-1], h, d), dtype)
    opts = {
        "qkv_format": "thd",
        "cu_seqlens_q": cu(lq),
        "cu_seqlens_kv": cu(lkv),
        "max_seqlen_q": max(lq) + 1,
        "max_seqlen_kv": max(lkv) + 2,
    }
    if any(pad_q) or any(pad_kv):
        opts["cu_seqlens_q_padded"], opts["cu_seqlens_kv_padded"] = off_q, off_kv
    return q, k, v, d_o, opts


def to_bshd(x, lengths, offsets, s):
    """The packed sequences of x padded apart into [B, s, H, D] (zeros past each sequence)."""
    out = np.zeros((len(lengths), s, *x.shape[1:]), dtype=x.dtype)
    for b, (n, o) in enumerate(zip(lengths, offsets)):
        out[b, :n] = x[o : o + n]
    return out


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mask", ["padding", "padding_causal", "padding_causal_bottom_right", "causal"])
@pytest.mark.parametrize("padded", [False, True])
def test_thd_against_oracle_and_bshd(rng, dtype, mask, padded):
    lq, lkv = [3, 7, 1], [5, 7, 4]
    pads = ([2, 0, 3], [1, 4, 0]) if padded else (None, None)
    q, k, v, d_o, opts = thd_case(rng, dtype, lq, lkv, *pads)
    opts["attn_mask_type"] = mask
    fwd, grad, _ = check_against_oracle(q, k, v, d_o, {**opts, "window_size": (4, -1)}, dtype)
    # The same sequences padded apart in bshd with a padding mask: the same bits
    # on every row of every sequence (the CPU backend computes them identically).
    oq = opts.get("cu_seqlens_q_padded", opts["cu_seqlens_q"])
    okv = opts.get("cu_seqlens_kv_padded", opts["cu_seqlens_kv"])
    sq, skv = opts["max_seqlen_q"], opts["max_seqlen_kv"]
    pad = lambda x, n, o, s: to_bshd(x, n, o, s)  # noqa: E731
    bshd_mask = mask if "padding" in mask else "padding_" + mask
    bopts = {"attn_mask_type": bshd_mask, "window_size": (4, -1)}
    bopts.update(cu_seqlens_q=opts["cu_seqlens_q"], cu_seqlens_kv=opts["cu_seqlens_kv"])
    bq, bk, bv, bdo = pad(q, lq, oq, sq), pad(k, lkv, okv, skv), pad(v, lkv, okv, skv), pad(d_o, lq, oq, sq)
    bf = tec.attention_fwd(bq, bk, bv, **bopts)
    bg = tec.attention_bwd(bq, bk, bv, bf.o, bdo, bf.softmax_lse, **bopts)
    for b, (n, o) in enumerate(zip(lq, oq)):
        assert np.array_equal(fwd.o[o : o + n], bf.o[b, :n])
        assert np.array_equal(fwd.softmax_lse[o : o + n], bf.softmax_lse[b, :, :n].T)
        assert np.array_equal(grad.dq[o : o + n], bg.dq[b, :n])
    for b, (n, o) in enumerate(zip(lkv, okv)):
        assert np.array_equal(grad.dk[o : o + n], bg.dk[b, :n])
        assert np.array_equal(grad.dv[o : o + n], bg.dv[b, :n])
    # Rows in the gaps between sequences: masked rows (O = 0, lse = -inf, zero gradients).
    inside = np.zeros(q.shape[0], bool)
    for n, o in zip(lq, oq):
        inside[o : o + n] = True
    assert not fwd.o[~inside].any() and np.isneginf(fwd.softmax_lse[~inside]).all()
    assert not grad.dq[~inside].any()


def test_thd_empty_sequence(rng):
    q, k, v, d_o, opts = thd_case(rng, "fp32", [4, 0, 3], [2, 3, 0])
    fwd, grad, _ = check_against_oracle(q, k, v, d_o, {**opts, "attn_mask_type": "padding"}, "fp32")
    # Sequence 2 has no keys: its query rows are masked rows.
    assert np.isneginf(fwd.softmax_lse[4:]).all() and not fwd.o[4:].any()


def test_gradient_is_deterministic(rng):
    q, k, v, d_o = make(rng, "fp32", sq=40, skv=70)
    bias = rand(rng, (1, 1, 40, 70), "fp32")
    kw = {"attn_mask_type": "causal_bottom_right", "attn_bias_type": "post_scale_bias", "attn_bias": bias}
    runs = []
    for _ in range(2):
        f = tec.attention_fwd(q, k, v, **kw)
        runs.append((f, tec.attention_bwd(q, k, v, f.o, d_o, f.softmax_lse, **kw)))
    for a, b in zip(runs[0][0] + runs[0][1][:4], runs[1][0] + runs[1][1][:4]):
        assert np.array_equal(a, b)
