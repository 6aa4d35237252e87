"""transformer_engine.jax.attention.fused_attn against the float64 oracle
(transformer_engine.core.reference_attention), forward and jax.grad: masks, packed
layouts, GQA, windows, bias, softmax types, thd from segment ids and from seqlens/offsets,
dropout reproducibility, jit, and the argument errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax_attention_helpers import assert_close, cu, oracle, seed_int, segments_to_thd
from jax_helpers import put

from transformer_engine.jax import attention as A

pytest_plugins = ["jax_fixtures"]

DTYPES = [np.float32, ml_dtypes.bfloat16]
NO_BIAS, PRE, POST = A.AttnBiasType.NO_BIAS, A.AttnBiasType.PRE_SCALE_BIAS, A.AttnBiasType.POST_SCALE_BIAS
VANILLA = A.AttnSoftmaxType.VANILLA_SOFTMAX
SEPARATE = A.QKVLayout.BSHD_BSHD_BSHD
CORE_MASK = {
    A.AttnMaskType.NO_MASK: "no_mask",
    A.AttnMaskType.PADDING_MASK: "padding",
    A.AttnMaskType.CAUSAL_MASK: "causal",
    A.AttnMaskType.PADDING_CAUSAL_MASK: "padding_causal",
    A.AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK: "causal_bottom_right",
    A.AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK: "padding_causal_bottom_right",
}
CORE_SOFTMAX = {A.AttnSoftmaxType.VANILLA_SOFTMAX: "vanilla", A.AttnSoftmaxType.OFF_BY_ONE_SOFTMAX: "off_by_one",
                A.AttnSoftmaxType.LEARNABLE_SOFTMAX: "learnable"}  # fmt: skip


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def qkv(rng, dtype, b=2, sq=5, skv=7, h=4, hk=2, d=8, dv=8):
    return (rand(rng, (b, sq, h, d), dtype), rand(rng, (b, skv, hk, d), dtype), rand(rng, (b, skv, hk, dv), dtype),
            rand(rng, (b, sq, h, dv), dtype))  # fmt: skip


def run(device, q, k, v, d_o, *, bias=None, offset=None, desc=None, layout=SEPARATE, mask=A.AttnMaskType.NO_MASK,
        bias_type=NO_BIAS, softmax=VANILLA, scale=0.35, dropout=0.0, seed=None, window=None, segments=1):  # fmt: skip
    """fused_attn's output and the gradients of sum(o * d_o) on `device`."""
    args = [put(x, device) for x in (q, k, v)]
    extra = [None if x is None else put(x, device) for x in (bias, offset)]

    def f(q, k, v, bias, offset):
        if layout.is_qkvpacked():
            packed = (jnp.stack([q, k, v], axis=2),)
        elif layout.is_kvpacked():
            packed = (q, jnp.stack([k, v], axis=2))
        else:
            packed = (q, k, v)
        o = A.fused_attn(packed, bias, desc, seed, bias_type, mask, layout, softmax, scale, dropout, True,
                         max_segments_per_seq=segments, window_size=window, softmax_offset=offset)  # fmt: skip
        return o

    o = f(*args, *extra)
    argnums = (0, 1, 2) + ((3,) if bias is not None else ()) + ((4,) if offset is not None else ())
    loss = lambda *a: jnp.sum(f(*a).astype(jnp.float32) * put(d_o, device).astype(jnp.float32))  # noqa: E731
    grads = jax.grad(loss, argnums=argnums)(*args, *extra)
    return o, grads


def check(o, grads, want, dtype, bias=False, offset=False):
    wo, wdq, wdk, wdv, wdb, walpha = want
    assert_close("o", o, wo, dtype)
    for name, g, w in zip(("dq", "dk", "dv"), grads, (wdq, wdk, wdv)):
        assert_close(name, g, w, dtype)
    if bias:
        assert_close("dbias", grads[3], wdb, dtype)
    if offset:
        assert_close("dsoftmax_offset", np.asarray(grads[-1]).reshape(-1), walpha, np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", list(A.AttnMaskType))
def test_masks(jax_device, jax_rng, dtype, mask):
    q, k, v, d_o = qkv(jax_rng, dtype)
    q_lens, kv_lens = jax_rng.integers(1, 6, 2), jax_rng.integers(1, 8, 2)
    desc = A.SequenceDescriptor.from_seqlens((jnp.asarray(q_lens), jnp.asarray(kv_lens))) if mask.is_padding() else None
    o, grads = run(jax_device, q, k, v, d_o, mask=mask, desc=desc)
    lens = dict(cu_q=cu(q_lens), cu_kv=cu(kv_lens)) if mask.is_padding() else {}
    check(o, grads, oracle(q, k, v, d_o, mask=CORE_MASK[mask], scale=0.35, **lens), dtype)


@pytest.mark.parametrize("layout", [A.QKVLayout.BS3HD, A.QKVLayout.BSHD_BS2HD])
def test_packed_layouts(jax_device, jax_rng, layout):
    skv = 6 if layout.is_qkvpacked() else 9
    q, k, v, d_o = qkv(jax_rng, np.float32, sq=6, skv=skv, hk=4)
    o, grads = run(jax_device, q, k, v, d_o, layout=layout, mask=A.AttnMaskType.CAUSAL_MASK)
    check(o, grads, oracle(q, k, v, d_o, mask="causal", scale=0.35), np.float32)


@pytest.mark.parametrize("hk", [1, 2])
@pytest.mark.parametrize("window", [(2, 0), (1, 3), (-1, 1)])
def test_gqa_and_windows(jax_device, jax_rng, hk, window):
    q, k, v, d_o = qkv(jax_rng, np.float32, sq=6, skv=6, hk=hk)
    mask = A.AttnMaskType.CAUSAL_MASK if window[1] == 0 else A.AttnMaskType.NO_MASK
    o, grads = run(jax_device, q, k, v, d_o, mask=mask, window=window)
    check(o, grads, oracle(q, k, v, d_o, mask=CORE_MASK[mask], scale=0.35, window=window), np.float32)


@pytest.mark.parametrize("bias_type", [PRE, POST])
@pytest.mark.parametrize("bias_shape", [(1, 1), (2, 4), (1, 4)])
def test_bias(jax_device, jax_rng, bias_type, bias_shape):
    q, k, v, d_o = qkv(jax_rng, np.float32)
    bias = rand(jax_rng, (*bias_shape, 5, 7), np.float32)
    o, grads = run(jax_device, q, k, v, d_o, bias=bias, bias_type=bias_type, mask=A.AttnMaskType.CAUSAL_MASK)
    name = "pre_scale_bias" if bias_type == PRE else "post_scale_bias"
    want = oracle(q, k, v, d_o, mask="causal", bias_type=name, bias=bias, scale=0.35)
    check(o, grads, want, np.float32, bias=True)


@pytest.mark.parametrize("softmax", list(A.AttnSoftmaxType))
def test_softmax_types(jax_device, jax_rng, softmax):
    q, k, v, d_o = qkv(jax_rng, np.float32)
    learnable = softmax == A.AttnSoftmaxType.LEARNABLE_SOFTMAX
    offset = rand(jax_rng, (1, 4, 1, 1), np.float32) if learnable else None
    o, grads = run(jax_device, q, k, v, d_o, softmax=softmax, offset=offset, mask=A.AttnMaskType.CAUSAL_MASK)
    want = oracle(q, k, v, d_o, mask="causal", softmax=CORE_SOFTMAX[softmax], softmax_offset=offset, scale=0.35)
    check(o, grads, want, np.float32, offset=learnable)


def random_segments(rng, b, s, m):
    """[b, s] ids: up to m contiguous segments per row (1, 2, ...) with padding gaps, and positions."""
    ids, pos = np.zeros((b, s), np.int32), np.zeros((b, s), np.int32)
    for r in range(b):
        t = 0
        for seg in range(1, m + 1):
            t += int(rng.integers(0, 2))  # a padding token between segments, sometimes
            n = int(rng.integers(1, 4))
            if t + n > s:
                break
            ids[r, t : t + n], pos[r, t : t + n] = seg, np.arange(n)
            t += n
    return ids, pos


@pytest.mark.parametrize("mask", [A.AttnMaskType.PADDING_MASK, A.AttnMaskType.PADDING_CAUSAL_MASK])
@pytest.mark.parametrize("layout", [A.QKVLayout.THD_THD_THD, A.QKVLayout.T3HD])
def test_thd_from_segment_ids(jax_device, jax_rng, mask, layout):
    b, s, m = 2, 10, 3
    q, k, v, d_o = qkv(jax_rng, np.float32, b=b, sq=s, skv=s, hk=4)
    ids, pos = random_segments(jax_rng, b, s, m)
    desc = A.SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    o, grads = run(jax_device, q, k, v, d_o, desc=desc, mask=mask, layout=layout, segments=m)
    cu_t, padded, _ = segments_to_thd(ids)
    flat = [x.reshape(b * s, *x.shape[2:]) for x in (q, k, v, d_o)]
    want = oracle(*flat, fmt="thd", mask=CORE_MASK[mask], scale=0.35, cu_q=cu_t, cu_kv=cu_t, cu_q_padded=padded,
                  cu_kv_padded=padded, max_q=s, max_kv=s)  # fmt: skip
    want = tuple(w.reshape(b, s, *w.shape[1:]) if w is not None and w.ndim == 3 else w for w in want)
    check(o, grads, want, np.float32)
    assert np.all(np.asarray(o)[ids == 0] == 0), "padding tokens must give 0"


def test_thd_from_seqlens_and_offsets(jax_device, jax_rng):
    b, s = 2, 8
    q, k, v, d_o = qkv(jax_rng, np.float32, b=b, sq=s, skv=s)
    seqlens = jnp.asarray([[3, 4, -1], [2, 1, 3]])
    offsets = jnp.asarray([[0, 4, -1, -1], [1, 3, 5, 8]])
    desc = A.SequenceDescriptor.from_seqlens_and_offsets(seqlens, offsets)
    o, grads = run(jax_device, q, k, v, d_o, desc=desc, mask=A.AttnMaskType.PADDING_CAUSAL_MASK,
                   layout=A.QKVLayout.THD_THD_THD, segments=3)  # fmt: skip
    ids = np.zeros((b, s), np.int32)
    for r, (lens, offs) in enumerate(zip(np.asarray(seqlens), np.asarray(offsets))):
        for m, (n, at) in enumerate(zip(lens, offs)):
            if n > 0:
                ids[r, at : at + n] = m + 1
    cu_t, padded, _ = segments_to_thd(ids)
    flat = [x.reshape(b * s, *x.shape[2:]) for x in (q, k, v, d_o)]
    want = oracle(*flat, fmt="thd", mask="padding_causal", scale=0.35, cu_q=cu_t, cu_kv=cu_t, cu_q_padded=padded,
                  cu_kv_padded=padded, max_q=s, max_kv=s)  # fmt: skip
    want = tuple(w.reshape(b, s, *w.shape[1:]) if w is not None and w.ndim == 3 else w for w in want)
    check(o, grads, want, np.float32)


def test_legacy_mask_gives_padding_lengths(jax_device, jax_rng):
    q, k, v, d_o = qkv(jax_rng, np.float32)
    q_lens, kv_lens = np.array([3, 5]), np.array([7, 2])
    mask = (np.arange(5)[None, :, None] >= q_lens[:, None, None]) | (
        np.arange(7)[None, None, :] >= kv_lens[:, None, None]
    )
    o, grads = run(jax_device, q, k, v, d_o, desc=put(mask[:, None], jax_device), mask=A.AttnMaskType.PADDING_MASK)
    check(o, grads, oracle(q, k, v, d_o, mask="padding", scale=0.35, cu_q=cu(q_lens), cu_kv=cu(kv_lens)), np.float32)


def test_dropout_matches_the_oracle_and_reproduces(jax_device, jax_rng):
    q, k, v, d_o = qkv(jax_rng, np.float32)
    key = jax.random.PRNGKey(int(jax_rng.integers(2**31)))
    o, grads = run(jax_device, q, k, v, d_o, dropout=0.25, seed=key, mask=A.AttnMaskType.CAUSAL_MASK)
    if jax_device.platform == "cpu":  # (cuDNN draws its own bits; the core's CPU and CUDA kernels Philox's)
        want = oracle(q, k, v, d_o, mask="causal", scale=0.35, dropout=0.25, seed=seed_int(key))
        check(o, grads, want, np.float32)
    again, _ = run(jax_device, q, k, v, d_o, dropout=0.25, seed=key, mask=A.AttnMaskType.CAUSAL_MASK)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(again))
    other, _ = run(jax_device, q, k, v, d_o, dropout=0.25, seed=jax.random.fold_in(key, 1))
    assert not np.array_equal(np.asarray(o), np.asarray(other))


def test_deterministic_switch_gives_the_same_gradients(jax_device, jax_rng, monkeypatch):
    q, k, v, d_o = qkv(jax_rng, np.float32)
    _, free = run(jax_device, q, k, v, d_o, mask=A.AttnMaskType.CAUSAL_MASK)
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
    _, first = run(jax_device, q, k, v, d_o, mask=A.AttnMaskType.CAUSAL_MASK)
    _, second = run(jax_device, q, k, v, d_o, mask=A.AttnMaskType.CAUSAL_MASK)
    for a, b, c in zip(first, second, free):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert_close("grad", a, np.asarray(c, np.float64), np.float32)


def test_thd_under_jit(jax_device, jax_rng):
    b, s = 2, 9
    q, k, v, _ = qkv(jax_rng, np.float32, b=b, sq=s, skv=s, hk=4)
    ids, pos = random_segments(jax_rng, b, s, 3)

    @jax.jit
    def f(q, k, v, ids, pos):
        desc = A.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
        return A.fused_attn((q, k, v), None, desc, None, NO_BIAS, A.AttnMaskType.PADDING_CAUSAL_MASK,
                            A.QKVLayout.THD_THD_THD, VANILLA, 0.35, 0.0, True, max_segments_per_seq=3)  # fmt: skip

    o = f(*(put(x, jax_device) for x in (q, k, v, ids, pos)))
    cu_t, padded, _ = segments_to_thd(ids)
    flat = [x.reshape(b * s, *x.shape[2:]) for x in (q, k, v)]
    want = oracle(*flat, np.zeros_like(flat[0]), fmt="thd", mask="padding_causal", scale=0.35, cu_q=cu_t, cu_kv=cu_t,
                  cu_q_padded=padded, cu_kv_padded=padded, max_q=s, max_kv=s)[0]  # fmt: skip
    assert_close("o", o, want.reshape(b, s, *want.shape[1:]), np.float32)


def test_no_dropout_when_not_training(jax_device, jax_rng):
    q, k, v, _ = qkv(jax_rng, np.float32)
    args = [put(x, jax_device) for x in (q, k, v)]
    o = A.fused_attn(
        tuple(args), None, None, None, NO_BIAS, A.AttnMaskType.NO_MASK, SEPARATE, VANILLA, 0.35, 0.5, False
    )
    want = oracle(q, k, v, np.zeros_like(q), scale=0.35)[0]
    assert_close("o", o, want, np.float32)


def test_jit(jax_device, jax_rng):
    q, k, v, d_o = qkv(jax_rng, ml_dtypes.bfloat16)
    lens = jnp.asarray([4, 2]), jnp.asarray([7, 3])

    @jax.jit
    def step(q, k, v, q_lens, kv_lens):
        desc = A.SequenceDescriptor.from_seqlens((q_lens, kv_lens))
        f = lambda q: A.fused_attn((q, k, v), None, desc, None, NO_BIAS, A.AttnMaskType.PADDING_CAUSAL_MASK, SEPARATE,  # noqa: E731
                                   VANILLA, 0.35, 0.0, True)  # fmt: skip
        o, vjp = jax.vjp(f, q)
        return o, vjp(jnp.asarray(d_o))[0]

    o, dq = step(*(put(x, jax_device) for x in (q, k, v)), *lens)
    want = oracle(q, k, v, d_o, mask="padding_causal", scale=0.35, cu_q=cu([4, 2]), cu_kv=cu([7, 3]))
    assert_close("o", o, want[0], ml_dtypes.bfloat16)
    assert_close("dq", dq, want[1], ml_dtypes.bfloat16)


def test_kernel_availability():
    ok = dict(is_training=True, q_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16, qkv_layout=SEPARATE,
              attn_bias_type=NO_BIAS, attn_mask_type=A.AttnMaskType.CAUSAL_MASK, softmax_type=VANILLA,
              dropout_probability=0.1, q_num_heads=8, kv_num_heads=2, q_max_seqlen=128, kv_max_seqlen=128,
              head_dim_qk=64, head_dim_v=64)  # fmt: skip
    assert A.is_fused_attn_kernel_available(**ok)
    assert not A.is_fused_attn_kernel_available(**{**ok, "q_dtype": jnp.float8_e4m3fn, "kv_dtype": jnp.float8_e4m3fn})
    assert not A.is_fused_attn_kernel_available(**{**ok, "kv_num_heads": 3})
    assert not A.is_fused_attn_kernel_available(**ok, window_size=(4, 2))


def test_enums_and_mask_names():
    assert A.canonicalize_attn_mask_type("causal_padding") is A.AttnMaskType.PADDING_CAUSAL_MASK
    assert A.AttnSoftmaxType.from_str("off_by_one") is A.AttnSoftmaxType.OFF_BY_ONE_SOFTMAX
    assert A.QKVLayout.T3HD.is_thd() and A.QKVLayout.T3HD.to_separate() is A.QKVLayout.THD_THD_THD
    assert A.QKVLayout.BSHD_BS2HD.get_qkv_format() is A.QKVFormat.BSHD
    with pytest.raises(ValueError, match="attn_mask_type"):
        A.canonicalize_attn_mask_type("diagonal")
    with pytest.raises(ValueError, match="softmax_type"):
        A.AttnSoftmaxType.from_str("sparse")
    swa = np.asarray(A.make_swa_mask(jnp.arange(4)[None], jnp.arange(4)[None], (1, 0)))[0, 0]
    np.testing.assert_array_equal(swa, np.tril(np.triu(np.ones((4, 4)), -1)))


def test_reorder_causal_load_balancing():
    x = jnp.arange(16).reshape(1, 16)
    dual = A.reorder_causal_load_balancing(x, A.ReorderStrategy.DualChunkSwap, 4, 1)
    # the reference's example: GPU0 [0, 1, 14, 15], GPU1 [4, 5, 10, 11], GPU2 [8, 9, 6, 7], GPU3 [12, 13, 2, 3]
    np.testing.assert_array_equal(np.asarray(dual)[0], [0, 1, 14, 15, 4, 5, 10, 11, 8, 9, 6, 7, 12, 13, 2, 3])
    striped = A.reorder_causal_load_balancing(x, A.ReorderStrategy.Striped, 4, 1)
    np.testing.assert_array_equal(np.asarray(striped)[0], [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15])
    for strategy, out in ((A.ReorderStrategy.DualChunkSwap, dual), (A.ReorderStrategy.Striped, striped)):
        back = A.inverse_reorder_causal_load_balancing(out, strategy, 4, 1)
        np.testing.assert_array_equal(np.asarray(back), np.asarray(x))
    with pytest.raises(ValueError, match="divisible"):
        A.reorder_causal_load_balancing(x[:, :12], A.ReorderStrategy.DualChunkSwap, 4, 1)


def test_run_length_fill():
    ids = jnp.asarray([[1, 1, 2, 2, 2, 0, 3, 0]])
    np.testing.assert_array_equal(np.asarray(A.run_length_fill(ids)), [[2, 2, 3, 3, 3, 0, 1, 0]])


def test_argument_errors(jax_rng):
    q, k, v, _ = (jnp.asarray(x) for x in qkv(jax_rng, np.float32))
    base = ((q, k, v), None, None, None, NO_BIAS, A.AttnMaskType.NO_MASK, SEPARATE, VANILLA, 0.35, 0.0, True)

    def call(*changes, **kw):
        args = list(base)
        for i, x in changes:
            args[i] = x
        return A.fused_attn(*args, **kw)

    with pytest.raises(ValueError, match="tuple of 1"):
        call((6, A.QKVLayout.BS3HD))
    with pytest.raises(ValueError, match="'bias' is required"):
        call((4, POST))
    with pytest.raises(ValueError, match="'bias' must be None"):
        call((1, jnp.zeros((1, 1, 5, 7))))
    with pytest.raises(ValueError, match="'sequence_descriptor' is required"):
        call((5, A.AttnMaskType.PADDING_MASK))
    with pytest.raises(ValueError, match="'seed' is required"):
        call((9, 0.1))
    with pytest.raises(ValueError, match="softmax_offset"):
        call((7, A.AttnSoftmaxType.LEARNABLE_SOFTMAX))
    with pytest.raises(TypeError, match="attn_mask_type"):
        call((5, "causal"))
    with pytest.raises(NotImplementedError, match="context_parallel_axis"):
        call(context_parallel_axis="cp")
    with pytest.raises(NotImplementedError, match="return_max_logit"):
        call(return_max_logit=True)
    with pytest.raises(NotImplementedError, match="FP8"):
        call((0, tuple(x.astype(jnp.float8_e4m3fn) for x in (q, k, v))))
    with pytest.raises(ValueError, match="SequenceDescriptor"):
        call((6, A.QKVLayout.THD_THD_THD))
    with pytest.raises(ValueError, match="segment_pos"):
        A.SequenceDescriptor.from_segment_ids_and_pos(jnp.ones((2, 5), jnp.int32))
