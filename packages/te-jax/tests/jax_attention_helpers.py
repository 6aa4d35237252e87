"""Helpers of te-jax's attention tests: the float64 oracle (transformer_engine.core.
reference_attention) on te-core's layouts, and the comparison bound.

Bound: |got - want| <= tol * (|want| + max|want|) per tensor, tol a few roundings of the
output type (FP32 arithmetic inside; the te-core suite checks its derived per-element
bounds; here the wiring is under test: a wrong mask, length, layout or gradient route
is an O(1) error)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from transformer_engine.core import reference_attention as ref

TOL = {np.dtype(np.float32): 2.0**-16, np.dtype(ml_dtypes.bfloat16): 2.0**-6, np.dtype(np.float16): 2.0**-9}


def assert_close(name, got, want, dtype) -> None:
    got = np.asarray(np.asarray(got).astype(np.float32), np.float64)
    want = np.asarray(want, np.float64)
    tol = TOL[np.dtype(dtype)]
    scale = np.abs(want).max(initial=0.0)
    bad = ~(np.abs(got - want) <= tol * (np.abs(want) + scale) + 1e-30)
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{name}: {bad.sum()} of {bad.size} off; first at {idx}: got {got[idx]}, want {want[idx]}")


def cu(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def oracle(q, k, v, d_o, *, fmt="bshd", mask="no_mask", bias_type="no_bias", softmax="vanilla", scale=None,
           window=(-1, -1), dropout=0.0, seed=0, bias=None, softmax_offset=None, cu_q=None, cu_kv=None,
           cu_q_padded=None, cu_kv_padded=None, max_q=None, max_kv=None, attn_mask=None):  # fmt: skip
    """float64 (o, dq, dk, dv, dbias, dsoftmax_offset) in the inputs' layout (fmt)."""
    q, k, v, d_o = (np.asarray(np.asarray(x).astype(np.float32), np.float64) for x in (q, k, v, d_o))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    cfg = ref.Config(fmt, mask, bias_type, softmax, float(np.float32(scale)), dropout, tuple(window), seed, 0)
    as64 = lambda a: None if a is None else np.asarray(np.asarray(a).astype(np.float32), np.float64)  # noqa: E731
    pr = ref.make_problem(
        cfg, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, cu_seqlens_q_padded=cu_q_padded,
        cu_seqlens_kv_padded=cu_kv_padded, max_seqlen_q=max_q, max_seqlen_kv=max_kv, bias=as64(bias),
        attn_mask=attn_mask, softmax_offset=None if softmax_offset is None else as64(softmax_offset).reshape(-1),
    )  # fmt: skip
    o, _ = ref.forward(pr)
    dos = ref._sequences(d_o, fmt, cu_q, cu_q_padded, None)
    dq, dk, dv, dbias, dalpha = ref.backward(pr, dos)
    out = ref.to_layout(o, fmt, (*q.shape[:-1], v.shape[-1]), cu_q, cu_q_padded)
    dq = ref.to_layout(dq, fmt, q.shape, cu_q, cu_q_padded)
    dk = ref.to_layout(dk, fmt, k.shape, cu_kv, cu_kv_padded)
    dv = ref.to_layout(dv, fmt, v.shape, cu_kv, cu_kv_padded)
    return out, dq, dk, dv, dbias, dalpha


def seed_int(key) -> int:
    """The 64-bit dropout seed te-jax derives from a PRNG key (its two words)."""
    import jax

    words = np.asarray(jax.random.key_data(key) if hasattr(key, "dtype") and "key" in str(key.dtype) else key)
    words = words.reshape(-1).astype(np.uint64)
    return int(words[0]) | (int(words[1]) << 32)


def segments_to_thd(segment_ids: np.ndarray):
    """NumPy conversion of [b, s] segment ids (1..M contiguous, 0 = padding) to te-core's
    thd cu_seqlens and padded offsets over the flattened [b * s] tokens (independent of
    te-jax's converter: a loop over rows and runs)."""
    b, s = segment_ids.shape
    m = int(segment_ids.max(initial=0))
    lengths, starts = [], []
    for r in range(b):
        for seg in range(1, m + 1):
            where = np.nonzero(segment_ids[r] == seg)[0]
            lengths.append(len(where))
            starts.append(r * s + (where[0] if len(where) else s))
    return cu(lengths), np.array([*starts, b * s], np.int32), m


def t5_buckets(i, j, num_buckets, max_distance, bidirectional):
    """One (query i, key j) bucket by T5's definition, scalar Python."""
    n, rel, bucket = num_buckets, j - i, 0
    if bidirectional:
        n //= 2
        bucket += n if rel > 0 else 0
        rel = abs(rel)
    else:
        rel = max(-rel, 0)
    exact = n // 2
    if rel < exact:
        return bucket + rel
    large = exact + int(np.log(rel / exact + np.finfo(np.float32).eps) / np.log(max_distance / exact) * (n - exact))
    return bucket + min(large, n - 1)
