"""Attention argument errors: each names the argument and the rule broken
(ValueError: invalid argument, TypeError: wrong dtype, NotImplementedError:
valid but unsupported)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import transformer_engine.core as tec
from transformer_engine.core import lib
from transformer_engine.core._arrays import desc


def qkv(b=2, sq=4, skv=5, h=4, hk=2, d=8, dtype=np.float32, fmt="bshd"):
    shape = lambda s, n: (b, s, n, d) if fmt == "bshd" else (s, b, n, d)  # noqa: E731
    return np.zeros(shape(sq, h), dtype), np.zeros(shape(skv, hk), dtype), np.zeros(shape(skv, hk), dtype)


def cu(*lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def fails(exc, match, q=None, k=None, v=None, **kw):
    dq, dk, dv = qkv()
    q, k, v = (dq if q is None else q), (dk if k is None else k), (dv if v is None else v)
    with pytest.raises(exc, match=match):
        tec.attention_fwd(q, k, v, **kw)


def test_config_values():
    fails(ValueError, "argument 'attn_mask_type' must be one of", attn_mask_type="sliding")
    fails(ValueError, r"'config.dropout' must be in \[0, 1\)", dropout=1.0)
    fails(ValueError, r"'config.dropout' must be in \[0, 1\)", dropout=-0.1)
    fails(ValueError, "'config.scale' must be finite", attn_scale=float("inf"))
    fails(ValueError, "must be >= 0 or -1", window_size=(-2, 0))
    fails(ValueError, "'config.window_right' must be 0 or -1 with a causal mask", attn_mask_type="causal",
          window_size=(-1, 1))  # fmt: skip


def test_dtypes():
    q, k, v = qkv()
    fails(TypeError, "argument 'k' must have the type of 'q'", k=k.astype(np.float16))
    fails(TypeError, "argument 'q' must be float32, bfloat16 or float16", q=q.astype(np.float64))
    q8 = q.astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="FP8 attention is not yet supported"):
        lib.attention_fwd(desc(q8), desc(q8), desc(q8), desc(q8), desc(np.zeros((2, 4, 4), np.float32)),
                          qkv_format=0, mask_type=0, scale=1.0)  # fmt: skip


def test_shapes():
    q, k, v = qkv()
    fails(ValueError, "argument 'q' must have 4 dimensions", q=q[0])
    fails(ValueError, "same batch size", k=np.zeros((3, 5, 2, 8), np.float32), v=np.zeros((3, 5, 2, 8), np.float32))
    fails(ValueError, "same head size D", k=np.zeros((2, 5, 2, 6), np.float32))
    fails(ValueError, "argument 'v' must match 'k'", v=np.zeros((2, 6, 2, 8), np.float32))
    fails(ValueError, "multiple of the key/value heads", k=np.zeros((2, 5, 3, 8), np.float32),
          v=np.zeros((2, 5, 3, 8), np.float32))  # fmt: skip


def test_output_shapes_through_the_binding():
    q, k, v = qkv()
    o, lse = np.zeros((2, 4, 4, 8), np.float32), np.zeros((2, 4, 4), np.float32)
    base = dict(qkv_format=0, mask_type=0, scale=1.0)
    with pytest.raises(ValueError, match="argument 'o' must have the shape of 'q'"):
        lib.attention_fwd(desc(q), desc(k), desc(v), desc(np.zeros((2, 3, 4, 8), np.float32)), desc(lse), **base)
    with pytest.raises(ValueError, match=r"argument 'softmax_lse' must be FP32 \[2, 4, 4\]"):
        lib.attention_fwd(desc(q), desc(k), desc(v), desc(o), desc(lse[:1]), **base)
    with pytest.raises(TypeError, match="argument 'o' must have the type of 'q'"):
        lib.attention_fwd(desc(q), desc(k), desc(v), desc(o.astype(np.float16)), desc(lse), **base)


def test_cu_seqlens():
    fails(ValueError, "'cu_seqlens_q' and 'cu_seqlens_kv' are required with a padding mask", attn_mask_type="padding")
    fails(ValueError, "only for thd and padding mask types", cu_seqlens_q=cu(1, 2), cu_seqlens_kv=cu(1, 2))
    fails(ValueError, "must be a vector of 3 INT32", attn_mask_type="padding", cu_seqlens_q=cu(1, 2, 3),
          cu_seqlens_kv=cu(1, 2))  # fmt: skip
    fails(ValueError, "'cu_seqlens_q' must be non-decreasing", attn_mask_type="padding",
          cu_seqlens_q=np.array([0, 3, 2], np.int32), cu_seqlens_kv=cu(1, 2))  # fmt: skip
    fails(ValueError, "'cu_seqlens_kv' must start at 0", attn_mask_type="padding", cu_seqlens_q=cu(1, 2),
          cu_seqlens_kv=np.array([1, 2, 3], np.int32))  # fmt: skip
    fails(ValueError, "sequence 1 length 5, more than the tensor's sequence size 4", attn_mask_type="padding",
          cu_seqlens_q=cu(1, 5), cu_seqlens_kv=cu(1, 2))  # fmt: skip
    fails(ValueError, "'cu_seqlens_q_padded' and 'cu_seqlens_kv_padded' are only for thd", attn_mask_type="padding",
          cu_seqlens_q=cu(1, 2), cu_seqlens_kv=cu(1, 2), cu_seqlens_q_padded=cu(1, 2))  # fmt: skip
    with pytest.raises(TypeError, match="must hold integers"):
        tec.attention_fwd(*qkv(), attn_mask_type="padding", cu_seqlens_q=[0.0, 1.0, 2.0], cu_seqlens_kv=cu(1, 2))


def test_thd():
    q, k, v = np.zeros((6, 4, 8), np.float32), np.zeros((7, 2, 8), np.float32), np.zeros((7, 2, 8), np.float32)
    thd = dict(qkv_format="thd", cu_seqlens_q=cu(2, 4), cu_seqlens_kv=cu(3, 4), max_seqlen_q=4, max_seqlen_kv=4)
    tec.attention_fwd(q, k, v, **thd)  # valid
    fails(ValueError, "'config.max_seqlen_q' and 'config.max_seqlen_kv' must be >= 1 for thd", q, k, v,
          **{**thd, "max_seqlen_q": None})  # fmt: skip
    fails(ValueError, "more than the config's max_seqlen 3", q, k, v, **{**thd, "max_seqlen_q": 3})
    fails(ValueError, "'cu_seqlens_q' and 'cu_seqlens_kv' are required for thd", q, k, v,
          **{**thd, "cu_seqlens_q": None})  # fmt: skip
    fails(ValueError, "overlaps the next one", q, k, v, **thd, cu_seqlens_q_padded=np.array([0, 1, 6], np.int32))
    fails(ValueError, "ends at row 9, past the 6 rows", q, k, v, **thd,
          cu_seqlens_q_padded=np.array([0, 5, 9], np.int32))  # fmt: skip
    fails(NotImplementedError, "'arbitrary' is not supported with qkv_format thd", q, k, v,
          **{**thd, "attn_mask_type": "arbitrary"}, attn_mask=np.zeros((1, 1, 4, 4), bool))  # fmt: skip


def test_bias_mask_and_softmax_arguments():
    fails(ValueError, "argument 'bias' is required with bias_type pre_scale_bias", attn_bias_type="pre_scale_bias")
    fails(ValueError, "argument 'bias' is only for bias_type", attn_bias=np.zeros((1, 4, 4, 5), np.float32))
    fails(ValueError, r"argument 'bias' must be \[1 or 2, 1 or 4, 4, 5\]", attn_bias_type="post_scale_bias",
          attn_bias=np.zeros((1, 3, 4, 5), np.float32))  # fmt: skip
    fails(ValueError, "'alibi_slopes' is only for bias_type alibi", alibi_slopes=np.ones(4))
    fails(ValueError, r"'alibi_slopes' must be \[4\] or \[2, 4\]", attn_bias_type="alibi", alibi_slopes=np.ones(3))
    fails(ValueError, "argument 'attn_mask' is required with mask type 'arbitrary'", attn_mask_type="arbitrary")
    fails(ValueError, "argument 'attn_mask' is only for mask type 'arbitrary'", attn_mask=np.zeros((1, 1, 4, 5)))
    fails(ValueError, "'softmax_offset' is required with softmax_type learnable", softmax_type="learnable")
    fails(ValueError, "'softmax_offset' is only for softmax_type learnable", softmax_offset=np.zeros(4))
    fails(ValueError, r"one FP32 value per query head \(\[4\]\)", softmax_type="learnable", softmax_offset=np.ones(2))
    fails(ValueError, "'rng_state' .* is required with dropout > 0", dropout=0.1)
    fails(ValueError, "argument 'rng_state' must have 2 element", dropout=0.1, rng_state=(1, 2, 3))


def test_backward_arguments():
    q, k, v = qkv()
    o, lse = tec.attention_fwd(q, k, v)
    with pytest.raises(ValueError, match="argument 'd_o' must have the shape of 'q'"):
        tec.attention_bwd(q, k, v, o, o[:, :2], lse)
    with pytest.raises(ValueError, match="argument 'softmax_lse' must be FP32"):
        tec.attention_bwd(q, k, v, o, o, lse[..., :2])
    base = dict(qkv_format=0, mask_type=0, scale=1.0)
    with pytest.raises(ValueError, match="argument 'dbias' is only for bias_type"):
        d = [desc(np.zeros_like(x)) for x in (q, k, v)]
        lib.attention_bwd(desc(q), desc(k), desc(v), desc(o), desc(o), desc(lse), *d, dbias=desc(lse), **base)
    with pytest.raises(ValueError, match="argument 'dsoftmax_offset' is only for softmax_type learnable"):
        lib.attention_bwd(desc(q), desc(k), desc(v), desc(o), desc(o), desc(lse), *d,
                          dsoftmax_offset=desc(np.zeros(4, np.float32)), **base)  # fmt: skip
    with pytest.raises(ValueError, match="argument 'dq' must have the shape of 'q'"):
        d2 = [desc(np.zeros_like(x)) for x in (k, k, v)]
        lib.attention_bwd(desc(q), desc(k), desc(v), desc(o), desc(o), desc(lse), *d2, **base)


def test_backend_and_workspace_queries():
    q, k, v = qkv()
    assert tec.attention_backend(q, k, v, attn_mask_type="causal") == "cpu"
    assert lib.attention_fwd_workspace_size(desc(q), desc(k), desc(v), qkv_format=0, mask_type=2, scale=1.0) == 0
    assert lib.attention_bwd_workspace_size(desc(q), desc(k), desc(v), qkv_format=0, mask_type=2, scale=1.0) == 0
    with pytest.raises(ValueError, match="argument 'config.mask_type' must be a te_attn_mask_type"):
        lib.attention_backend(desc(q), desc(k), desc(v), qkv_format=0, mask_type=9, scale=1.0)


@pytest.mark.skipif(tec.built_with_cuda(), reason="checks the message of a build without CUDA")
def test_cuda_tensors_need_a_cuda_build():
    q, k, v = qkv()
    dq = lib.TensorDesc(q.ctypes.data, 4, list(q.shape), 1, 0)
    dk = lib.TensorDesc(k.ctypes.data, 4, list(k.shape), 1, 0)
    dv = lib.TensorDesc(v.ctypes.data, 4, list(v.shape), 1, 0)
    with pytest.raises(NotImplementedError, match="no CUDA backend"):
        lib.attention_backend(dq, dk, dv, qkv_format=0, mask_type=0, scale=1.0)
