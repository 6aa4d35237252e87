"""Attention on CUDA through cuDNN's fused SDPA against the float64 oracle.

cuDNN's kernels round P (forward) and dP / dS (backward) to the input type
before their tensor-core products, with FP32 accumulation. Each output element
is a sum of terms whose magnitudes the oracle gives (o: P'|V|; dv: P'^T|dO|;
dq, dk: scale |dS| |K|, scale |dS|^T |Q| with |dS| <= P (|dP| + |D|)); every
term carries at most a few roundings of u_out (P or dS to the input type: 1,
the FP32 parts: far below), and the result one more. The bound used is
    |got - want| <= 4 u_out * magnitude + 2 u_out |want|
(two roundings per term and a factor 2 of slack). lse is FP32 arithmetic with
the hardware exp2: the oracle's FP32 bound plus 32 u32 (1 + |lse|).
Rows without a visible key must give O = 0, lse = -inf and zero gradients.
cuDNN is a CUDA-only backend (nothing to compare on the CPU): the module is marked gpu.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attention_helpers as ah  # noqa: E402

import transformer_engine.core as te_core  # noqa: E402
from transformer_engine.core import lib  # noqa: E402
from transformer_engine.core import reference_attention as ref  # noqa: E402
from transformer_engine.core.attention import (  # noqa: E402
    ATTN_BIAS_TYPES,
    ATTN_MASK_TYPES,
    BACKENDS,
    QKV_FORMATS,
    SOFTMAX_TYPES,
)

pytestmark = [pytest.mark.attention, pytest.mark.gpu]

U32 = 2.0**-24


@pytest.fixture(autouse=True)
def _require_cuda():
    if not (torch.cuda.is_available() and te_core.built_with_cuda()):
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    # The cuDNN backend is opt-in (TE_WITH_CUDNN=ON; off by default until these tests have
    # passed on the H200): without it every case runs the core's kernel, which
    # the device tests of test_attention.py check. Set TE_TEST_CUDNN=1 with such a build.
    if os.environ.get("TE_TEST_CUDNN") != "1":
        pytest.skip("the cuDNN attention backend is opt-in: build with TE_WITH_CUDNN=ON and set TE_TEST_CUDNN=1")


def _dtype_code(np_dtype) -> int:
    from transformer_engine.core.dtypes import te_dtype

    return int(te_dtype(np.dtype(np_dtype)))


class Device:
    """Device copies of the NumPy arrays of one call and the C API keywords."""

    def __init__(self, opts: dict):
        self.keep = []
        self.opts = opts

    def put(self, a, np_dtype=None):
        if a is None:
            return None
        a = np.ascontiguousarray(a if np_dtype is None else np.asarray(a).astype(np_dtype))
        raw = torch.from_numpy(a.reshape(-1).view(np.uint8).copy()).cuda()
        self.keep.append(raw)
        return lib.TensorDesc(raw.data_ptr(), _dtype_code(a.dtype), list(a.shape), 1, 0), raw

    def empty(self, shape, np_dtype):
        n = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
        raw = torch.full((max(n, 1),), 0xA5, dtype=torch.uint8, device="cuda")
        self.keep.append(raw)
        return lib.TensorDesc(raw.data_ptr(), _dtype_code(np_dtype), list(shape), 1, 0), raw

    def workspace(self, nbytes):
        if nbytes == 0:
            return None
        return self.empty((nbytes,), np.uint8)[0]

    def kwargs(self, q_dtype):
        o = self.opts
        window = o.get("window_size") or (-1, -1)
        rng = o.get("rng_state")
        kw = dict(
            qkv_format=QKV_FORMATS[o.get("qkv_format", "bshd")],
            mask_type=ATTN_MASK_TYPES[o.get("attn_mask_type", "no_mask")],
            bias_type=ATTN_BIAS_TYPES[o.get("attn_bias_type", "no_bias")],
            softmax_type=SOFTMAX_TYPES[o.get("softmax_type", "vanilla")],
            scale=float(np.float32(o.get("attn_scale"))),
            dropout=float(o.get("dropout", 0.0)),
            window_left=int(window[0]),
            window_right=int(window[1]),
            max_seqlen_q=int(o.get("max_seqlen_q") or 0),
            max_seqlen_kv=int(o.get("max_seqlen_kv") or 0),
            deterministic=bool(o.get("deterministic", False)),
        )
        for name in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
            if o.get(name) is not None:
                kw[name] = self.put(o[name], np.int32)[0]
        if o.get("attn_bias") is not None:
            kw["bias"] = self.put(o["attn_bias"], q_dtype)[0]
        if o.get("softmax_offset") is not None:
            kw["softmax_offset"] = self.put(o["softmax_offset"], np.float32)[0]
        if rng is not None:
            kw["rng_state"] = self.put(np.asarray(rng, np.int64))[0]
        return kw


def run_cuda(q, k, v, d_o, opts):
    """Forward and backward on the GPU; returns (backend, o, lse, dq, dk, dv, dbias, dalpha)."""
    dev = Device(opts)
    dt = q.dtype
    kw = dev.kwargs(dt)
    dq_, dk_, dv_ = (dev.put(x)[0] for x in (q, k, v))
    backend = BACKENDS[lib.attention_backend(dq_, dk_, dv_, **kw)]
    o_shape = (*q.shape[:-1], v.shape[-1])
    lse_shape = (q.shape[0], q.shape[1]) if opts.get("qkv_format") == "thd" else (
        q.shape[0] if opts.get("qkv_format", "bshd") == "bshd" else q.shape[1], q.shape[-2],
        q.shape[1] if opts.get("qkv_format", "bshd") == "bshd" else q.shape[0])  # fmt: skip
    o_d, o_raw = dev.empty(o_shape, dt)
    lse_d, lse_raw = dev.empty(lse_shape, np.float32)
    ws = dev.workspace(lib.attention_fwd_workspace_size(dq_, dk_, dv_, **kw))
    stream = torch.cuda.current_stream().cuda_stream
    lib.attention_fwd(dq_, dk_, dv_, o_d, lse_d, **kw, workspace=ws, stream=stream)
    do_d = dev.put(d_o)[0]
    grads = [dev.empty(x.shape, dt) for x in (q, k, v)]
    bias = opts.get("attn_bias")
    dbias = dev.empty(bias.shape, dt) if bias is not None else None
    dalpha = dev.empty((q.shape[-2],), np.float32) if opts.get("softmax_type") == "learnable" else None
    bkw = dict(kw)
    nb = lib.attention_bwd_workspace_size(dq_, dk_, dv_, **bkw)
    lib.attention_bwd(dq_, dk_, dv_, o_d, do_d, lse_d, *(g[0] for g in grads), **bkw,
                      dbias=dbias[0] if dbias else None, dsoftmax_offset=dalpha[0] if dalpha else None,
                      workspace=dev.workspace(nb), stream=stream)  # fmt: skip
    torch.cuda.synchronize()

    def back(raw, shape, t):
        return raw.cpu().numpy()[: int(np.prod(shape)) * np.dtype(t).itemsize].view(t).reshape(shape)

    out = [back(o_raw, o_shape, dt), back(lse_raw, lse_shape, np.float32)]
    out += [back(g[1], x.shape, dt) for g, x in zip(grads, (q, k, v))]
    out.append(back(dbias[1], bias.shape, dt) if dbias else None)
    out.append(back(dalpha[1], (q.shape[-2],), np.float32) if dalpha else None)
    return backend, out


def magnitudes(orc: ah.Oracle, d_o):
    """Per-element sums of |terms| of o, dq, dk, dv, dbias (float64, the core's layouts)."""
    pr = orc.pr
    dos = ref._sequences(d_o, orc.fmt, orc.cu_q, orc.cu_q_pad, None)
    mo = [np.zeros((x.shape[0], pr.n_heads, pr.v[0].shape[-1])) for x in pr.q]
    mq = [np.zeros_like(x) for x in pr.q]
    mk = [np.zeros_like(x) for x in pr.k]
    mv = [np.zeros_like(x) for x in pr.v]
    mb = None if pr.bias is None else np.zeros_like(pr.bias)
    s = abs(pr.cfg.scale)
    for b in range(len(pr.q)):
        for h in range(pr.n_heads):
            hk, hd = h // pr.group, ref._heads(pr, b, h)
            av, ak, aq, ado = (np.abs(pr.v[b][:, hk]), np.abs(pr.k[b][:, hk]), np.abs(pr.q[b][:, h]),
                               np.abs(dos[b][:, h]))  # fmt: skip
            pd = hd.p * hd.keep
            mo[b][:, h] = pd @ av
            drow = np.abs((hd.p * (dos[b][:, h] @ pr.v[b][:, hk].T) * hd.keep).sum(axis=1))
            mds = hd.p * ((ado @ av.T) * hd.keep + drow[:, None])
            mq[b][:, h] += s * mds @ ak
            mk[b][:, hk] += s * mds.T @ aq
            mv[b][:, hk] += pd.T @ ado
            if mb is not None:
                lq, lkv = mds.shape
                mb[min(b, mb.shape[0] - 1), min(h, mb.shape[1] - 1), :lq, :lkv] += mds
    lay = ref.to_layout
    return (orc._q_layout(mo, orc.o.shape), orc._q_layout(mq, orc.dq.shape),
            lay(mk, orc.fmt, orc.dk.shape, orc.cu_kv, orc.cu_kv_pad),
            lay(mv, orc.fmt, orc.dv.shape, orc.cu_kv, orc.cu_kv_pad), mb)  # fmt: skip


def check(name, got, want, mag, u):
    got = np.asarray(got, np.float64)
    bound = 4 * u * mag + 2 * u * np.abs(want) + 1e-30
    bad = ~(np.abs(got - want) <= bound)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        rel = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
        raise AssertionError(f"{name}: {bad.sum()} of {bad.size} outside the bound (max rel err {rel:.3g}); "
                             f"first at {i}: got {got[i]!r}, want {want[i]!r}, bound {bound[i]!r}")  # fmt: skip


# (name, options, shapes): shapes = (b, sq, skv, h, hk, d, dv)
B, S = 2, 80
CASES = [
    ("bshd_nomask_mha", dict(), (B, S, S, 4, 4, 64, 64)),
    ("bshd_causal_gqa", dict(attn_mask_type="causal"), (B, 96, 96, 4, 2, 64, 64)),
    ("bshd_causal_mqa_d128", dict(attn_mask_type="causal"), (B, 72, 72, 4, 1, 128, 128)),
    ("sbhd_causal_br", dict(qkv_format="sbhd", attn_mask_type="causal_bottom_right"), (B, 40, 88, 4, 2, 64, 64)),
    ("bshd_causal_tl_sq_lt_skv", dict(attn_mask_type="causal"), (B, 40, 88, 4, 4, 64, 64)),
    ("bshd_padding", dict(attn_mask_type="padding"), (3, S, 96, 4, 2, 64, 64)),
    ("bshd_padding_causal", dict(attn_mask_type="padding_causal"), (3, S, S, 4, 4, 64, 64)),
    ("bshd_padding_causal_br", dict(attn_mask_type="padding_causal_bottom_right"), (3, S, 96, 4, 2, 64, 64)),
    ("thd_padding_causal", dict(qkv_format="thd", attn_mask_type="padding_causal"), (3, 64, 64, 4, 2, 64, 64)),
    ("thd_padded_offsets", dict(qkv_format="thd", attn_mask_type="padding", _pad=True), (3, 64, 72, 4, 4, 64, 64)),
    ("window_causal", dict(attn_mask_type="causal", window_size=(16, 0)), (B, S, S, 4, 4, 64, 64)),
    ("window_two_sided", dict(window_size=(8, 8)), (B, S, S, 4, 4, 64, 64)),
    ("post_bias_1h", dict(attn_bias_type="post_scale_bias", _bias=(1, 4)), (B, 64, 64, 4, 4, 64, 64)),
    (
        "post_bias_b1_causal",
        dict(attn_bias_type="post_scale_bias", attn_mask_type="causal", _bias=(B, 1)),
        (B, 64, 64, 4, 4, 64, 64),
    ),
    ("alibi_causal", dict(attn_bias_type="alibi", attn_mask_type="causal"), (B, 64, 64, 8, 8, 64, 64)),
    ("off_by_one", dict(softmax_type="off_by_one", attn_mask_type="causal"), (B, 64, 64, 4, 4, 64, 64)),
    ("learnable", dict(softmax_type="learnable"), (B, 64, 64, 4, 2, 64, 64)),
    ("d_ne_dv", dict(attn_mask_type="causal"), (B, 64, 64, 4, 4, 128, 64)),
    ("fp16_padding_causal", dict(attn_mask_type="padding_causal", _dtype="fp16"), (3, S, S, 4, 2, 64, 64)),
]
# Combinations that must run on cuDNN (every cuDNN 9 supports them); others
# may fall back on an older cuDNN, which skips them here.
MUST_RUN = {"bshd_nomask_mha", "bshd_causal_gqa", "bshd_padding", "bshd_padding_causal", "thd_padding_causal"}


def make_case(rng, opts, shapes):
    b, sq, skv, h, hk, d, dv = shapes
    dtype = opts.pop("_dtype", "bf16")
    fmt = opts.get("qkv_format", "bshd")
    opts = {**opts, "attn_scale": float(np.float32(1 / np.sqrt(d)))}
    pad = opts.pop("_pad", False)
    bias_shape = opts.pop("_bias", None)
    if fmt == "thd" or "padding" in opts.get("attn_mask_type", ""):
        lq = rng.integers(1, sq + 1, b)
        lkv = rng.integers(1, skv + 1, b)
        lq[0], lkv[0] = sq, skv  # one full sequence
        opts["cu_seqlens_q"] = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
        opts["cu_seqlens_kv"] = np.concatenate([[0], np.cumsum(lkv)]).astype(np.int32)
    if fmt == "thd":
        tq, tkv = int(opts["cu_seqlens_q"][-1]), int(opts["cu_seqlens_kv"][-1])
        if pad:  # sequences 3 rows apart in the packed tensors
            opts["cu_seqlens_q_padded"] = (opts["cu_seqlens_q"] + 3 * np.arange(b + 1)).astype(np.int32)
            opts["cu_seqlens_kv_padded"] = (opts["cu_seqlens_kv"] + 3 * np.arange(b + 1)).astype(np.int32)
            tq, tkv = tq + 3 * b + 2, tkv + 3 * b + 2
        opts.update(max_seqlen_q=sq, max_seqlen_kv=skv)
    q = ah.rand(rng, ah.layout_shape(fmt, b, sq, h, d, tokens=tq if fmt == "thd" else None), dtype)
    k = ah.rand(rng, ah.layout_shape(fmt, b, skv, hk, d, tokens=tkv if fmt == "thd" else None), dtype)
    v = ah.rand(rng, ah.layout_shape(fmt, b, skv, hk, dv, tokens=tkv if fmt == "thd" else None), dtype)
    d_o = ah.rand(rng, (*q.shape[:-1], dv), dtype)
    if bias_shape is not None:
        opts["attn_bias"] = ah.rand(rng, (*bias_shape, sq, skv), dtype)
    if opts.get("softmax_type") == "learnable":
        opts["softmax_offset"] = rng.standard_normal(h).astype(np.float32)
    return q, k, v, d_o, opts, dtype


@pytest.mark.parametrize("name, opts, shapes", CASES, ids=[c[0] for c in CASES])
def test_cudnn_against_oracle(name, opts, shapes):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q, k, v, d_o, opts, dtype = make_case(rng, dict(opts), shapes)
    backend, (o, lse, dq, dk, dv, dbias, dalpha) = run_cuda(q, k, v, d_o, opts)
    if backend != "cudnn":
        assert name not in MUST_RUN, f"{name}: ran on {backend}, expected cudnn"
        pytest.skip(f"{name}: the installed cuDNN has no engine for it (ran on {backend})")
    orc = ah.Oracle(q, k, v, d_o, {**opts, "_dtype": dtype})
    u = ah.U_OUT[dtype]
    dead = np.isneginf(orc.lse)
    assert np.array_equal(np.isneginf(lse), dead), f"{name}: -inf rows of lse differ"
    lse_bound = 2 * orc.e_lse + 32 * U32 * (1 + np.abs(np.where(dead, 0, orc.lse)))
    err = np.abs(np.where(dead, 0, lse) - np.where(dead, 0, orc.lse))
    assert (err <= lse_bound).all(), f"{name}: lse max err {err.max():.3g}"
    mo, mq, mk, mv, mb = magnitudes(orc, d_o)
    check(f"{name}: o", o, orc.o, mo, u)
    check(f"{name}: dq", dq, orc.dq, mq, u)
    check(f"{name}: dk", dk, orc.dk, mk, u)
    check(f"{name}: dv", dv, orc.dv, mv, u)
    if dbias is not None:
        check(f"{name}: dbias", dbias, orc.dbias, mb, u)
    if dalpha is not None:
        scale = np.abs(orc.dalpha).max() + 1e-30
        assert np.abs(dalpha - orc.dalpha).max() <= 8 * u * scale, (
            f"{name}: dsoftmax_offset {dalpha} vs oracle {orc.dalpha}"
        )


def test_cudnn_dropout_reproducible_and_keyed():
    """cuDNN's own Philox: the same (seed, offset) gives the same bits, another seed
    other bits; lse (before dropout) is the same for both."""
    base = dict(attn_mask_type="causal", dropout=0.25)
    outs = []
    for seed in (11, 11, 12):
        q, k, v, d_o, opts, _ = make_case(np.random.default_rng(7), {**base, "rng_state": (seed, 0)},
                                          (B, 64, 64, 4, 4, 64, 64))  # fmt: skip
        backend, res = run_cuda(q, k, v, d_o, opts)
        if backend != "cudnn":
            pytest.skip(f"dropout ran on {backend}")
        outs.append(res)
    assert np.array_equal(outs[0][0].view(np.uint16), outs[1][0].view(np.uint16))
    assert np.array_equal(outs[0][2].view(np.uint16), outs[1][2].view(np.uint16))
    assert not np.array_equal(outs[0][0].view(np.uint16), outs[2][0].view(np.uint16))
    # lse does not depend on the dropout mask.
    assert np.array_equal(outs[0][1], outs[2][1])


def test_fp32_is_not_offered_to_cudnn():
    rng = np.random.default_rng(3)
    q, k, v, d_o, opts, _ = make_case(rng, {"_dtype": "bf16"}, (1, 16, 16, 2, 2, 64, 64))
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    dev = Device(opts)
    kw = dev.kwargs(np.float32)
    try:
        backend = BACKENDS[lib.attention_backend(dev.put(q)[0], dev.put(k)[0], dev.put(v)[0], **kw)]
    except NotImplementedError as e:  # a build without the core's fallback kernel
        assert "BF16 or FP16" in str(e), str(e)
        return
    assert backend == "cuda_fallback"
