"""Float64 oracle of the attention family, written from the formulas of
core/include/te/attention.h in plain NumPy: the full S matrix per (batch,
head), no tiling, no code shared with the core.

Inputs are NumPy arrays in the core's layouts (bshd, sbhd, thd); every value
is widened to float64, so the oracle of BF16/FP16 inputs is exact arithmetic
on the rounded inputs. Outputs are float64 in the same layouts.

Dropout keep masks come from an independent NumPy Philox4x32-10 (Salmon et
al., SC 2011), keyed as the header states: word n of the stream
(seed, offset), n = ((b * H + h) * Sq + i) * Skv + j, keep iff
word >= floor(p * 2^32).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 round multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of counters [N, 4] (uint32 values) with key (k0, k1) -> [N, 4]."""
    c = [counters[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for rnd in range(10):
        if rnd:
            k0 = (k0 + np.uint64(_W0)) & _MASK32
            k1 = (k1 + np.uint64(_W1)) & _MASK32
        p0 = np.uint64(_M0) * c[0]  # < 2^64: exact in uint64
        p1 = np.uint64(_M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _MASK32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _MASK32]
    return np.stack(c, axis=1).astype(np.uint32)


def philox_words(seed: int, offset: int, n: np.ndarray) -> np.ndarray:
    """Word n (any uint64 array) of the stream (seed, offset)."""
    n = np.asarray(n, dtype=np.uint64)
    block = n >> np.uint64(2)
    counters = np.stack(
        [
            block & _MASK32,
            block >> np.uint64(32),
            np.full_like(block, offset & 0xFFFFFFFF),
            np.full_like(block, (offset >> 32) & 0xFFFFFFFF),
        ],
        axis=-1,
    ).reshape(-1, 4)
    words = philox4x32_10(counters, (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    lane = (n & np.uint64(3)).reshape(-1).astype(np.int64)
    return words[np.arange(lane.size), lane].reshape(n.shape)


def dropout_keep(p: float, seed: int, offset: int, b: int, h: int, n_heads: int, sq: int, skv: int, lq: int, lkv: int):
    """Boolean keep mask [lq, lkv] of (batch b, head h) for the sequence sizes sq, skv."""
    threshold = math.floor(float(np.float32(p)) * 2.0**32)
    i = np.arange(lq, dtype=np.uint64)[:, None]
    j = np.arange(lkv, dtype=np.uint64)[None, :]
    n = ((np.uint64(b * n_heads + h) * np.uint64(sq) + i) * np.uint64(skv)) + j
    return philox_words(seed, offset, n) >= threshold


def default_alibi_slopes(n_heads: int) -> np.ndarray:
    """The reference's ALiBi slopes (closest power of two, then odd slopes of twice as many)."""
    n = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (n_heads - n), 2)]
    return np.array(slopes, dtype=np.float32).astype(np.float64)


class Config(NamedTuple):
    qkv_format: str = "bshd"
    attn_mask_type: str = "no_mask"
    attn_bias_type: str = "no_bias"
    softmax_type: str = "vanilla"
    scale: float = 1.0
    dropout: float = 0.0
    window: tuple[int, int] = (-1, -1)
    seed: int = 0
    offset: int = 0


def _sequences(x, fmt, cu, cu_padded, max_len):
    """[B] list of per-sequence [len, heads, dim] float64 arrays, plus the row index maps."""
    x = np.asarray(x, dtype=np.float64)
    if fmt == "bshd":
        seqs = [x[b] for b in range(x.shape[0])]
    elif fmt == "sbhd":
        seqs = [x[:, b] for b in range(x.shape[1])]
    else:
        starts = cu if cu_padded is None else cu_padded
        seqs = [x[starts[b] : starts[b] + cu[b + 1] - cu[b]] for b in range(len(cu) - 1)]
    if cu is not None and fmt != "thd":
        seqs = [s[: cu[b + 1] - cu[b]] for b, s in enumerate(seqs)]
    return seqs


def _visible(cfg: Config, lq: int, lkv: int, mask_b):
    """[lq, lkv] boolean visibility of one (batch, head) of in-sequence positions."""
    i = np.arange(lq)[:, None]
    j = np.arange(lkv)[None, :]
    m = cfg.attn_mask_type.replace("padding_", "").replace("padding", "no_mask")
    vis = np.ones((lq, lkv), dtype=bool)
    if m == "causal":
        vis &= j <= i
    elif m == "causal_bottom_right":
        vis &= j <= i + lkv - lq
    elif m == "arbitrary":
        vis &= ~mask_b[:lq, :lkv]
    diag = 0 if m == "causal" else lkv - lq
    left, right = cfg.window
    if left >= 0:
        vis &= j >= i + diag - left
    if right >= 0:
        vis &= j <= i + diag + right
    return vis


def _logits(cfg, q, k, bias_bh, slope, lq, lkv):
    s = q @ k.T
    if cfg.attn_bias_type == "pre_scale_bias":
        return cfg.scale * (s + bias_bh[:lq, :lkv])
    s = cfg.scale * s
    if cfg.attn_bias_type == "post_scale_bias":
        s = s + bias_bh[:lq, :lkv]
    elif cfg.attn_bias_type == "alibi":
        i = np.arange(lq)[:, None]
        j = np.arange(lkv)[None, :]
        s = s - slope * np.abs(i + lkv - lq - j)
    return s


def _sink(cfg, softmax_offset, h):
    if cfg.softmax_type == "off_by_one":
        return 0.0
    if cfg.softmax_type == "learnable":
        return float(softmax_offset[h])
    return None


class _Head(NamedTuple):
    p: np.ndarray  # [lq, lkv] softmax probabilities (0 where masked)
    keep: np.ndarray  # [lq, lkv] keep / (1 - p)
    lse: np.ndarray  # [lq]
    live: np.ndarray  # [lq] rows with a visible key
    p_sink: np.ndarray  # [lq] the sink's probability (0 for vanilla)


def _head(cfg, q, k, vis, bias_bh, slope, sink, keep):
    lq, lkv = vis.shape
    s = np.where(vis, _logits(cfg, q, k, bias_bh, slope, lq, lkv), -np.inf)
    live = vis.any(axis=1)
    m = np.where(live, s.max(axis=1, initial=-np.inf), 0.0)
    if sink is not None:
        m = np.maximum(m, sink)
    e = np.where(vis, np.exp(s - m[:, None]), 0.0)
    denom = e.sum(axis=1) + (np.exp(sink - m) if sink is not None else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(live[:, None], e / denom[:, None], 0.0)
        lse = np.where(live, m + np.log(denom), -np.inf)
        p_sink = np.where(live, np.exp(sink - m) / denom, 0.0) if sink is not None else np.zeros(lq)
    return _Head(p, keep, lse, live, p_sink)


class Problem(NamedTuple):
    cfg: Config
    q: list
    k: list
    v: list
    bias: np.ndarray | None
    slopes: np.ndarray | None
    mask: np.ndarray | None
    softmax_offset: np.ndarray | None
    sq: int
    skv: int
    n_heads: int
    group: int


def make_problem(cfg: Config, q, k, v, *, cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
                 cu_seqlens_kv_padded=None, max_seqlen_q=None, max_seqlen_kv=None, bias=None, alibi_slopes=None,
                 attn_mask=None, softmax_offset=None) -> Problem:  # fmt: skip
    fmt = cfg.qkv_format
    qs = _sequences(q, fmt, cu_seqlens_q, cu_seqlens_q_padded, max_seqlen_q)
    ks = _sequences(k, fmt, cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_kv)
    vs = _sequences(v, fmt, cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_kv)
    if fmt == "thd":
        sq, skv = int(max_seqlen_q), int(max_seqlen_kv)
    else:
        sq, skv = (q.shape[1], k.shape[1]) if fmt == "bshd" else (q.shape[0], k.shape[0])
    n_heads, n_kv = np.shape(q)[-2], np.shape(k)[-2]
    slopes = None
    if cfg.attn_bias_type == "alibi":
        slopes = default_alibi_slopes(n_heads) if alibi_slopes is None else np.asarray(alibi_slopes, np.float64)
        slopes = np.broadcast_to(slopes, (len(qs), n_heads))
    as64 = lambda a: None if a is None else np.asarray(a, dtype=np.float64)  # noqa: E731
    mask = None if attn_mask is None else np.asarray(attn_mask).astype(bool)
    return Problem(cfg, qs, ks, vs, as64(bias), slopes, mask, as64(softmax_offset), sq, skv, n_heads, n_heads // n_kv)


def _heads(pr: Problem, b: int, h: int) -> _Head:
    cfg = pr.cfg
    q, k = pr.q[b][:, h], pr.k[b][:, h // pr.group]
    lq, lkv = q.shape[0], k.shape[0]
    mask_b = None if pr.mask is None else pr.mask[min(b, pr.mask.shape[0] - 1), min(h, pr.mask.shape[1] - 1)]
    bias_bh = None if pr.bias is None else pr.bias[min(b, pr.bias.shape[0] - 1), min(h, pr.bias.shape[1] - 1)]
    slope = None if pr.slopes is None else pr.slopes[b, h]
    keep = np.ones((lq, lkv))
    if cfg.dropout > 0:
        kept = dropout_keep(cfg.dropout, cfg.seed, cfg.offset, b, h, pr.n_heads, pr.sq, pr.skv, lq, lkv)
        keep = kept / (1.0 - float(np.float32(cfg.dropout)))
    vis = _visible(cfg, lq, lkv, mask_b)
    return _head(cfg, q, k, vis, bias_bh, slope, _sink(cfg, pr.softmax_offset, h), keep)


def forward(pr: Problem):
    """Per-sequence outputs: o[b] [lq, H, Dv], lse[b] [H, lq] (float64)."""
    o, lse = [], []
    for b in range(len(pr.q)):
        lq, dv = pr.q[b].shape[0], pr.v[b].shape[-1]
        ob, lb = np.zeros((lq, pr.n_heads, dv)), np.full((pr.n_heads, lq), -np.inf)
        for h in range(pr.n_heads):
            hd = _heads(pr, b, h)
            ob[:, h] = (hd.p * hd.keep) @ pr.v[b][:, h // pr.group]
            lb[h] = hd.lse
        o.append(ob)
        lse.append(lb)
    return o, lse


def backward(pr: Problem, d_o: list):
    """Analytic float64 gradients of sum(O * dO): per-sequence dq, dk, dv, then dbias, dsoftmax_offset."""
    cfg = pr.cfg
    dq = [np.zeros_like(x) for x in pr.q]
    dk = [np.zeros_like(x) for x in pr.k]
    dv = [np.zeros_like(x) for x in pr.v]
    dbias = None if pr.bias is None else np.zeros_like(pr.bias)
    dalpha = np.zeros(pr.n_heads)
    for b in range(len(pr.q)):
        for h in range(pr.n_heads):
            hk = h // pr.group
            hd = _heads(pr, b, h)
            g = d_o[b][:, h]
            pd = hd.p * hd.keep
            dv[b][:, hk] += pd.T @ g
            dp = (g @ pr.v[b][:, hk].T) * hd.keep
            row = (hd.p * dp).sum(axis=1)
            ds = hd.p * (dp - row[:, None])
            dq[b][:, h] += cfg.scale * ds @ pr.k[b][:, hk]
            dk[b][:, hk] += cfg.scale * ds.T @ pr.q[b][:, h]
            dalpha[h] -= (hd.p_sink * row).sum()
            if dbias is not None:
                f = cfg.scale if cfg.attn_bias_type == "pre_scale_bias" else 1.0
                lq, lkv = ds.shape
                dbias[min(b, dbias.shape[0] - 1), min(h, dbias.shape[1] - 1), :lq, :lkv] += f * ds
    return dq, dk, dv, dbias, dalpha


def to_layout(seqs: list, fmt: str, like_shape, cu=None, cu_padded=None, fill=0.0):
    """Per-sequence [len, H, X] arrays back into a layout array of like_shape (rows outside sequences: fill)."""
    out = np.full(like_shape, fill, dtype=np.float64)
    for b, s in enumerate(seqs):
        n = s.shape[0]
        if fmt == "bshd":
            out[b, :n] = s
        elif fmt == "sbhd":
            out[:n, b] = s
        else:
            start = (cu if cu_padded is None else cu_padded)[b]
            out[start : start + n] = s
    return out
