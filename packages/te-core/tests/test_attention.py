"""The attention family's CPU backend against the float64 oracle
(reference_attention.py), forward and backward, within the bounds derived in
attention_helpers.py: every mask type, layout, GQA/MQA, windows, bias types,
softmax variants and odd shapes."""

from __future__ import annotations

import attention_device as ad
import core_device
import numpy as np
import pytest
from attention_helpers import DTYPES, check_against_oracle, layout_shape, rand
from conftest import CUDA_ONLY

import transformer_engine.core as tec

pytestmark = [pytest.mark.attention]

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


def random_case(rng, long=False):
    """Inputs and options of a random combination of every feature (thd excluded).
    long: sequences of several query and key tiles (32 x 64), so that the CPU
    backend's tile pruning by mask and window is exercised, with small heads."""
    fmt = str(rng.choice(["bshd", "sbhd"]))
    dtype = str(rng.choice(list(DTYPES)))
    b, h = int(rng.integers(1, 4)), int(rng.choice([2, 4, 6]))
    hk = int(rng.choice([x for x in (1, 2, h) if h % x == 0]))
    sq, skv = (int(rng.integers(30, 160)), int(rng.integers(30, 200))) if long else tuple(rng.integers(1, 40, 2))
    d, dv = (4, 4) if long else (int(rng.choice([4, 8, 12])), int(rng.choice([4, 8, 12])))
    q, k, v, d_o = make(rng, dtype, fmt, b, int(sq), int(skv), h, hk, d, dv)
    mask = str(rng.choice(MASKS))
    opts = {"qkv_format": fmt, **mask_opts(rng, mask, b, h, int(sq), int(skv))}
    windows = [-1, 0, 5, 40, 100] if long else list(range(-1, 6))
    left, right = int(rng.choice(windows)), int(rng.choice(windows))
    opts["window_size"] = (left, 0 if "causal" in mask else right)
    bias_type = str(rng.choice(["no_bias", "pre_scale_bias", "post_scale_bias", "alibi"]))
    opts["attn_bias_type"] = bias_type
    if "scale" in bias_type:
        shape = (int(rng.choice([1, b])), int(rng.choice([1, h])), int(sq), int(skv))
        opts["attn_bias"] = rand(rng, shape, dtype)
    softmax = str(rng.choice(["vanilla", "off_by_one", "learnable"]))
    opts["softmax_type"] = softmax
    if softmax == "learnable":
        opts["softmax_offset"] = rng.standard_normal(h).astype(np.float32)
    if rng.random() < 0.5:
        opts.update(dropout=float(rng.choice([0.1, 0.5])), rng_state=(int(rng.integers(1 << 62)), int(rng.integers(9))))
    return q, k, v, d_o, opts, dtype


@pytest.mark.parametrize("case", range(40))
def test_random_combinations(case):
    rng = np.random.default_rng(1000 + case)
    q, k, v, d_o, opts, dtype = random_case(rng)
    check_against_oracle(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize("case", range(8))
def test_random_combinations_over_several_tiles(case):
    rng = np.random.default_rng(9000 + case)
    q, k, v, d_o, opts, dtype = random_case(rng, long=True)
    check_against_oracle(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize("case", range(15))
def test_random_thd_combinations(case):
    rng = np.random.default_rng(5000 + case)
    b = int(rng.integers(1, 4))
    lq, lkv = list(rng.integers(0, 12, b)), list(rng.integers(0, 12, b))
    pads = (list(rng.integers(0, 3, b)), list(rng.integers(0, 3, b))) if rng.random() < 0.5 else (None, None)
    dtype = str(rng.choice(list(DTYPES)))
    q, k, v, d_o, opts = thd_case(rng, dtype, lq, lkv, *pads)
    mask = str(rng.choice(["padding", "padding_causal", "padding_causal_bottom_right", "no_mask"]))
    opts.update(attn_mask_type=mask, window_size=(int(rng.integers(-1, 5)), -1 if "causal" in mask else 2))
    bias_type = str(rng.choice(["no_bias", "post_scale_bias", "pre_scale_bias", "alibi"]))
    opts["attn_bias_type"] = bias_type
    if "scale" in bias_type:
        opts["attn_bias"] = rand(rng, (1, 4, opts["max_seqlen_q"], opts["max_seqlen_kv"]), dtype)
    if rng.random() < 0.5:
        opts.update(softmax_type="learnable", softmax_offset=rng.standard_normal(4).astype(np.float32))
    if rng.random() < 0.5:
        opts.update(dropout=0.2, rng_state=(int(rng.integers(1 << 62)), 1))
    check_against_oracle(q, k, v, d_o, opts, dtype)


def test_softmax_offset_in_the_reference_shape(rng):
    # The reference keeps its learnable offset as a [1, H, 1, 1] parameter.
    q, k, v, d_o = make(rng, "fp32")
    alpha = rng.standard_normal((1, 4, 1, 1)).astype(np.float32)
    kw = {"softmax_type": "learnable", "attn_mask_type": "causal"}
    want = check_against_oracle(q, k, v, d_o, {**kw, "softmax_offset": alpha.reshape(4)}, "fp32")
    fwd = tec.attention_fwd(q, k, v, **kw, softmax_offset=alpha)
    assert np.array_equal(fwd.o, want[0].o)


# ---------------------------------------------------------------------------
# Every backend (the `device` fixture), over the cases above: on CUDA the
# core's own attention kernel (the fallback where cuDNN has no engine;
# NVTE_FUSED_ATTN=0 forces it), against the float64 oracle within the bounds of
# attention_helpers and against the CPU backend within twice them, forward and
# backward: every mask type and layout, GQA/MQA, windows, bias types and
# broadcasts, ALiBi, softmax variants, odd shapes, thd with padded offsets and
# empty sequences, dropout (the keep mask bit for bit equal to the CPU's), large
# head dimensions (CUDA: scratch beyond shared memory), determinism, CUDA-graph
# capture. On the CPU the same checks run the CPU backend on raw buffers
# (attention_device).


@pytest.fixture
def core_cuda_kernel(monkeypatch):
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")  # the core's kernel even where cuDNN is built in


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_masks_and_layouts(device, rng, dtype, fmt, mask):
    q, k, v, d_o = make(rng, dtype, fmt)
    ad.check_device(q, k, v, d_o, {"qkv_format": fmt, **mask_opts(rng, mask, 2, 4, 7, 9)}, dtype)


@pytest.mark.parametrize("hk", [1, 2, 4])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_gqa_mqa(device, rng, hk, mask):
    q, k, v, d_o = make(rng, "fp32", h=4, hk=hk)
    ad.check_device(q, k, v, d_o, {"attn_mask_type": mask}, "fp32")


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
        ("causal", (40, 0), 200, 200),  # windows across several key tiles
        ("no_mask", (70, 5), 150, 260),
    ],
)
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_windows(device, rng, mask, window, sq, skv):
    q, k, v, d_o = make(rng, "fp32", sq=sq, skv=skv)
    ad.check_device(q, k, v, d_o, {**mask_opts(rng, mask, 2, 4, sq, skv), "window_size": window}, "fp32")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bias_type", ["pre_scale_bias", "post_scale_bias"])
@pytest.mark.parametrize("bias_shape", [(1, 4), (2, 1), (1, 1), (2, 4)])
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_bias(device, rng, dtype, bias_type, bias_shape):
    q, k, v, d_o = make(rng, dtype)
    bias = rand(rng, (*bias_shape, 7, 9), dtype)
    opts = {"attn_bias_type": bias_type, "attn_bias": bias, "attn_mask_type": "causal_bottom_right"}
    ad.check_device(q, k, v, d_o, opts, dtype)


@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_bias_long_rows(device, rng):
    """dbias rows across several query and key tiles, broadcast over the batch."""
    q, k, v, d_o = make(rng, "fp32", b=2, sq=70, skv=140, h=2, hk=1)
    bias = rand(rng, (1, 2, 70, 140), "fp32")
    opts = {"attn_bias_type": "post_scale_bias", "attn_bias": bias, "attn_mask_type": "padding"}
    opts.update(mask_opts(rng, "padding", 2, 2, 70, 140))
    ad.check_device(q, k, v, d_o, opts, "fp32")


@pytest.mark.parametrize("h", [4, 6])
@pytest.mark.parametrize("slopes", [None, "per_head", "per_batch"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding_causal_bottom_right"])
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_alibi(device, rng, h, slopes, mask):
    q, k, v, d_o = make(rng, "fp32", h=h, hk=2, sq=6, skv=10)
    opts = {"attn_bias_type": "alibi", **mask_opts(rng, mask, 2, h, 6, 10)}
    if slopes == "per_head":
        opts["alibi_slopes"] = rng.random(h).astype(np.float32)
    elif slopes == "per_batch":
        opts["alibi_slopes"] = rng.random((2, h)).astype(np.float32)
    ad.check_device(q, k, v, d_o, opts, "fp32")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("softmax", ["off_by_one", "learnable"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding"])
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_softmax_variants(device, rng, dtype, softmax, mask):
    q, k, v, d_o = make(rng, dtype)
    opts = {"softmax_type": softmax, **mask_opts(rng, mask, 2, 4, 7, 9)}
    if softmax == "learnable":
        opts["softmax_offset"] = rng.standard_normal(4).astype(np.float32)
    ad.check_device(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize(
    "b,sq,skv,h,hk,d,dv",
    [
        (3, 5, 13, 2, 1, 72, 72),
        (1, 1, 1, 1, 1, 4, 3),
        (3, 70, 33, 3, 3, 16, 24),
        (2, 33, 130, 2, 2, 8, 8),
        (1, 40, 70, 2, 1, 256, 256),  # the largest head size that stays in shared memory
        (1, 37, 66, 2, 2, 512, 512),  # scratch spills into workspace slices
        (1, 9, 70, 2, 1, 1000, 40),
    ],
)
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_odd_shapes_and_head_sizes(device, rng, b, sq, skv, h, hk, d, dv):
    for mask in ["no_mask", "causal_bottom_right"]:
        q, k, v, d_o = make(rng, "bf16", b=b, sq=sq, skv=skv, h=h, hk=hk, d=d, dv=dv)
        ad.check_device(q, k, v, d_o, {"attn_mask_type": mask}, "bf16")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mask", ["padding", "padding_causal", "padding_causal_bottom_right", "causal"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_thd(device, rng, dtype, mask, padded):
    pads = ([2, 0, 3], [1, 4, 0]) if padded else (None, None)
    q, k, v, d_o, opts = thd_case(rng, dtype, [3, 7, 1], [5, 7, 4], *pads)
    g = ad.check_device(q, k, v, d_o, {**opts, "attn_mask_type": mask, "window_size": (4, -1)}, dtype)
    inside = np.zeros(q.shape[0], bool)
    for n, o in zip([3, 7, 1], opts.get("cu_seqlens_q_padded", opts["cu_seqlens_q"])):
        inside[o : o + n] = True
    assert not g.o[~inside].any() and np.isneginf(g.softmax_lse[~inside]).all() and not g.dq[~inside].any()


@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_thd_empty_sequence_and_long(device, rng):
    q, k, v, d_o, opts = thd_case(rng, "fp32", [4, 0, 3], [2, 3, 0])
    ad.check_device(q, k, v, d_o, {**opts, "attn_mask_type": "padding"}, "fp32")
    q, k, v, d_o, opts = thd_case(rng, "bf16", [100, 37, 200], [90, 150, 200], [5, 0, 7], [0, 3, 1])
    ad.check_device(q, k, v, d_o, {**opts, "attn_mask_type": "padding_causal_bottom_right"}, "bf16")


@pytest.mark.parametrize("case", range(40))
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_random_combinations(device, case):
    """The CPU tests' random combinations of every feature (same seeds)."""
    q, k, v, d_o, opts, dtype = random_case(np.random.default_rng(1000 + case))
    ad.check_device(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize("case", range(8))
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_random_combinations_over_several_tiles(device, case):
    """The CPU tests' random combinations over several query and key tiles (same seeds)."""
    q, k, v, d_o, opts, dtype = random_case(np.random.default_rng(9000 + case), long=True)
    ad.check_device(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize("case", range(12))
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_random_thd(device, case):
    """Random packed batches with sequences across several tiles, padded apart or not."""
    rng = np.random.default_rng(7000 + case)
    b = int(rng.integers(1, 5))
    lq, lkv = [int(x) for x in rng.integers(0, 150, b)], [int(x) for x in rng.integers(0, 150, b)]
    pads = ([int(x) for x in rng.integers(0, 4, b)], [int(x) for x in rng.integers(0, 4, b)])
    dtype = str(rng.choice(list(DTYPES)))
    q, k, v, d_o, opts = thd_case(rng, dtype, lq, lkv, *(pads if case % 2 else (None, None)))
    mask = str(rng.choice(["padding", "padding_causal", "padding_causal_bottom_right"]))
    opts.update(attn_mask_type=mask, window_size=(int(rng.integers(-1, 90)), -1 if "causal" in mask else 30))
    if case % 3 == 0:
        bias = rand(rng, (1, 4, opts["max_seqlen_q"], opts["max_seqlen_kv"]), dtype)
        opts.update(attn_bias_type="post_scale_bias", attn_bias=bias)
    if case % 4 == 1:
        opts.update(dropout=0.3, rng_state=(int(rng.integers(1 << 62)), 5))
    ad.check_device(q, k, v, d_o, opts, dtype)


def _keep_mask_problem(b=2, h=3, sq=5, skv=80):
    """q = 0 makes P uniform and v = I makes O = P': O holds the keep mask / (skv (1 - p))."""
    q = np.zeros((b, sq, h, 4), np.float32)
    k = np.ones((b, skv, 1, 4), np.float32)
    v = np.broadcast_to(np.eye(skv, dtype=np.float32)[None, :, None, :], (b, skv, 1, skv)).copy()
    return q, k, v, np.zeros((b, sq, h, skv), np.float32)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("rng_on_device", [False, True], ids=["host_rng", "device_rng"])
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_dropout_keep_mask_equals_the_cpu(device, p, rng_on_device):
    q, k, v, d_o = _keep_mask_problem()
    opts = {"dropout": p, "rng_state": (0x1234_5678_9ABC, 77)}
    g = ad.device_run(q, k, v, d_o, opts, rng_on_device)
    cpu = tec.attention_fwd(q, k, v, **opts).o
    np.testing.assert_array_equal(g.o.view(np.uint32), cpu.view(np.uint32))
    assert 0 < (g.o > 0).mean() < 1


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding"])
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_dropout_against_oracle(device, rng, dtype, mask):
    q, k, v, d_o = make(rng, dtype, sq=40, skv=100)
    opts = {"dropout": 0.3, "rng_state": (int(rng.integers(1 << 62)), 3), **mask_opts(rng, mask, 2, 4, 40, 100)}
    ad.check_device(q, k, v, d_o, opts, dtype)
    ad.check_device(q, k, v, d_o, opts, dtype, rng_on_device=False)


@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_dropout_thd(device, rng):
    q, k, v, d_o, opts = thd_case(rng, "fp32", [3, 6], [5, 2], [1, 2], [0, 3])
    opts.update(dropout=0.25, rng_state=(99, 1), attn_mask_type="padding_causal_bottom_right")
    ad.check_device(q, k, v, d_o, opts, "fp32")


@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_large_logits_and_empty_rows(device, rng):
    q, k, v, d_o = make(rng, "fp32", d=16)
    q *= 40.0
    ad.check_device(q, k, v, d_o, {"attn_scale": 1.0, "attn_mask_type": "causal"}, "fp32")
    q, k, v, d_o = make(rng, "fp32", sq=9, skv=4)
    mask = np.zeros((2, 4, 9, 4), bool)
    mask[:, :, 2] = True
    for softmax in ["vanilla", "off_by_one", "learnable"]:
        opts = {"attn_mask_type": "arbitrary", "attn_mask": mask, "softmax_type": softmax}
        if softmax == "learnable":
            opts["softmax_offset"] = np.array([0.5, -1, 2, 0], np.float32)
        g = ad.check_device(q, k, v, d_o, opts, "fp32")
        assert np.isneginf(g.softmax_lse[:, :, 2]).all() and not g.o[:, 2].any() and not g.dq[:, 2].any()
    g = ad.check_device(q, k, v, d_o, {"attn_mask_type": "causal_bottom_right"}, "fp32")
    assert np.isneginf(g.softmax_lse[:, :, :5]).all()


@pytest.mark.gpu_scale
@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_long_causal_gqa(device, rng):
    q, k, v, d_o = make(rng, "bf16", b=1, sq=1024, skv=1024, h=4, hk=2, d=64)
    ad.check_device(q, k, v, d_o, {"attn_mask_type": "causal"}, "bf16")


@pytest.mark.usefixtures("core_cuda_kernel")
def test_device_deterministic(device, rng):
    q, k, v, d_o = make(rng, "fp32", sq=100, skv=150)
    bias = rand(rng, (1, 1, 100, 150), "fp32")
    opts = {"attn_mask_type": "causal_bottom_right", "attn_bias_type": "post_scale_bias", "attn_bias": bias}
    a, b = ad.device_run(q, k, v, d_o, opts), ad.device_run(q, k, v, d_o, {**opts, "deterministic": True})
    for x, y in zip(a[:6], b[:6]):
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


@CUDA_ONLY
@pytest.mark.usefixtures("core_cuda_kernel")
def test_cuda_graph_capture(device, rng):
    """Forward and backward captured in a CUDA graph replay to the eager results."""
    torch = pytest.importorskip("torch")
    from attention_device import device_args, workspace
    from gemm_device import DeviceArray

    from transformer_engine.core import lib

    q, k, v, d_o = make(rng, "bf16", sq=50, skv=70)
    opts = {"attn_mask_type": "causal", "dropout": 0.2, "rng_state": (7, 0)}
    eager = ad.device_run(q, k, v, d_o, opts)
    (gq, gk, gv), args, _held = device_args(q, k, v, opts)
    o = DeviceArray((*q.shape[:-1], v.shape[-1]), q.dtype)
    lse = DeviceArray((2, 4, 50), np.float32)  # [B, H, Sq]
    gdo = DeviceArray.of(d_o)
    dq, dk, dv = DeviceArray(q.shape, q.dtype), DeviceArray(k.shape, k.dtype), DeviceArray(v.shape, v.dtype)
    wf = workspace(lib.attention_fwd_workspace_size(gq.desc(), gk.desc(), gv.desc(), **args))
    wb = workspace(lib.attention_bwd_workspace_size(gq.desc(), gk.desc(), gv.desc(), **args))
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        s = torch.cuda.current_stream().cuda_stream
        lib.attention_fwd(gq.desc(), gk.desc(), gv.desc(), o.desc(), lse.desc(), **args,
                          workspace=None if wf is None else wf.desc(), stream=s)  # fmt: skip
        lib.attention_bwd(gq.desc(), gk.desc(), gv.desc(), o.desc(), gdo.desc(), lse.desc(), dq.desc(),
                          dk.desc(), dv.desc(), **args, workspace=None if wb is None else wb.desc(),
                          stream=s)  # fmt: skip
    graph.replay()
    core_device.sync()
    for got, want in [(o, eager.o), (lse, eager.softmax_lse), (dq, eager.dq), (dk, eager.dk), (dv, eager.dv)]:
        np.testing.assert_array_equal(got.numpy().view(np.uint8), np.asarray(want).view(np.uint8))
