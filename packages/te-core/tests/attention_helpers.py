"""Shared pieces of the attention tests: inputs, the float64 oracle in the
core's layouts, and error bounds derived from FP32 arithmetic.

Bounds (u = 2^-24, FP32's unit roundoff; u_out that of the output type):
  logits: a D-term FP32 dot product, scaled, plus a bias:
      dS <= (D + 4) u scale max(|q| |k|^T) + 4 u max|S|
  softmax: each P_ij has relative error <= 2 dS + (2 n + 16) u (n keys: the
      exp, the running rescaling and the n-term denominator) =: chain
  O_i = sum_j P'_ij v_j: error <= chain (P'|V|)_i + (n + 4) u (P'|V|)_i,
      then the rounding to the output type: u_out |O|.
  Backward: dP = dO V^T (Dv terms), D_i = dO_i . O_i with the STORED (rounded)
      O: u_out |dO_i| . |O_i| more; dS = P (dP - D). Each gradient is a sum of
      dS times q, k (or P' times dO) whose element errors the above bound, plus
      the sums' own (terms + 4) u, plus u_out of the result (and half the
      smallest subnormal of the output type: FP16 gradients can be subnormal).
Each bound is taken twice (a factor 2 of slack for the constants above).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import transformer_engine.core as tec
from transformer_engine.core import reference_attention as ref

SUB32 = 2.0**-149  # twice the largest rounding error of an FP32 subnormal (2^-150)
U32 = 2.0**-24
DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
U_OUT = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
# Half the smallest subnormal: the absolute rounding error of a tiny output.
TINY_OUT = {2.0**-24: 2.0**-150, 2.0**-8: 2.0**-134, 2.0**-11: 2.0**-25}


def rand(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(DTYPES[dtype])


def layout_shape(fmt, b, s, h, d, tokens=None):
    return {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "thd": (tokens, h, d)}[fmt]


def oracle_config(opts: dict, d: int) -> ref.Config:
    scale = opts.get("attn_scale") or 1.0 / np.sqrt(d)
    seed, offset = opts.get("rng_state", (0, 0))
    return ref.Config(
        qkv_format=opts.get("qkv_format", "bshd"),
        attn_mask_type=opts.get("attn_mask_type", "no_mask"),
        attn_bias_type=opts.get("attn_bias_type", "no_bias"),
        softmax_type=opts.get("softmax_type", "vanilla"),
        scale=float(np.float32(scale)),
        dropout=opts.get("dropout", 0.0),
        window=tuple(opts.get("window_size") or (-1, -1)),
        seed=int(seed),
        offset=int(offset),
    )


def oracle_problem(q, k, v, opts):
    cfg = oracle_config(opts, q.shape[-1])
    names = ["cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "max_seqlen_q"]
    names += ["max_seqlen_kv", "alibi_slopes", "attn_mask", "softmax_offset"]
    extra = {n: opts.get(n) for n in names}
    return ref.make_problem(cfg, q, k, v, bias=opts.get("attn_bias"), **extra)


class Oracle:
    """The oracle's forward and backward, back in the core's layouts, with error bounds."""

    def __init__(self, q, k, v, d_o, opts):
        self.opts, self.fmt = opts, opts.get("qkv_format", "bshd")
        pr = self.pr = oracle_problem(q, k, v, opts)
        o, lse = ref.forward(pr)
        self.cu_q, self.cu_q_pad = opts.get("cu_seqlens_q"), opts.get("cu_seqlens_q_padded")
        self.cu_kv, self.cu_kv_pad = opts.get("cu_seqlens_kv"), opts.get("cu_seqlens_kv_padded")
        self.o = self._q_layout(o, (*q.shape[:-1], v.shape[-1]))
        self.lse = self._lse_layout(lse, q)
        dos = ref._sequences(d_o, self.fmt, self.cu_q, self.cu_q_pad, None)
        dq, dk, dv, self.dbias, self.dalpha = ref.backward(pr, dos)
        self.dq = self._q_layout(dq, q.shape)
        self.dk = ref.to_layout(dk, self.fmt, k.shape, self.cu_kv, self.cu_kv_pad)
        self.dv = ref.to_layout(dv, self.fmt, v.shape, self.cu_kv, self.cu_kv_pad)
        self._bounds(pr, dos, o)

    def _q_layout(self, seqs, shape):
        return ref.to_layout(seqs, self.fmt, shape, self.cu_q, self.cu_q_pad)

    def _lse_layout(self, lse, q):
        if self.fmt == "thd":
            return ref.to_layout([x.T[:, :, None] for x in lse], "thd", (q.shape[0], q.shape[1], 1), self.cu_q,
                                 self.cu_q_pad, -np.inf)[..., 0]  # fmt: skip
        b = q.shape[0] if self.fmt == "bshd" else q.shape[1]
        out = np.full((b, q.shape[-2], self.pr.sq), -np.inf)
        for i, x in enumerate(lse):
            out[i, :, : x.shape[1]] = x
        return out

    def _bounds(self, pr, dos, o):
        """Per-element error bounds of o, lse, dq, dk, dv, dbias (see the module docstring)."""
        cfg, n = pr.cfg, pr.skv
        d, dvd = pr.q[0].shape[-1], pr.v[0].shape[-1]
        smax, qk = 0.0, 0.0
        eo = [np.zeros_like(x) for x in o]
        edq = [np.zeros_like(x) for x in pr.q]
        edk = [np.zeros_like(x) for x in pr.k]
        edv = [np.zeros_like(x) for x in pr.v]
        edb = None if pr.bias is None else np.zeros_like(pr.bias)
        self.e_alpha = np.zeros(pr.n_heads)
        heads = [(b, h, ref._heads(pr, b, h)) for b in range(len(pr.q)) for h in range(pr.n_heads)]
        for b, h, _ in heads:
            qk = max(qk, (np.abs(pr.q[b][:, h]) @ np.abs(pr.k[b][:, h // pr.group]).T).max(initial=0))
        if pr.bias is not None:
            smax = abs(cfg.scale) * qk + np.abs(pr.bias).max() * (abs(cfg.scale) + 1)
        slope = 0.0 if pr.slopes is None else np.abs(pr.slopes).max() * (pr.sq + pr.skv)
        ds_err = (d + 4) * U32 * abs(cfg.scale) * qk + 4 * U32 * max(smax, abs(cfg.scale) * qk + slope)
        chain = 2 * ds_err + (2 * n + 16) * U32
        for b, h, hd in heads:
            hk = h // pr.group
            av, ak, aq = np.abs(pr.v[b][:, hk]), np.abs(pr.k[b][:, hk]), np.abs(pr.q[b][:, h])
            pd = hd.p * hd.keep
            ado = np.abs(dos[b][:, h])
            eo[b][:, h] = (chain + (n + 4) * U32) * (pd @ av)
            adp = (ado @ av.T) * hd.keep
            drow = np.abs((hd.p * (dos[b][:, h] @ pr.v[b][:, hk].T) * hd.keep).sum(axis=1))
            mag = hd.p * (adp + drow[:, None])
            u_out = U_OUT[self.opts["_dtype"]]
            d_round = u_out * (ado * np.abs(o[b][:, h])).sum(axis=1)
            err = chain * mag + hd.p * ((dvd + 4) * U32 * adp + d_round[:, None])
            # Underflow: P and dS are FP32 values that may be subnormal (large logits
            # give P = exp(S - lse) below 2^-126), where rounding has an absolute
            # error of up to 2^-150 instead of a relative one; two roundings (P, and
            # dS = P (dP - D)) each at most 2^-150 of the factors they multiply.
            under = SUB32 * (1.0 + adp + drow[:, None]) * (hd.p > 0)
            err = err + under
            eo[b][:, h] += SUB32 * ((hd.p > 0) @ av)
            edv[b][:, hk] += SUB32 * ((hd.p > 0).T @ ado)
            s = abs(cfg.scale)
            self.e_alpha[h] += (
                (chain + u_out + (dvd + 4) * U32) * hd.p_sink * (ado * np.abs(o[b][:, h])).sum(axis=1)
            ).sum()
            edq[b][:, h] += s * (err @ ak) + (n + 4) * U32 * s * (mag @ ak)
            edk[b][:, hk] += s * (err.T @ aq) + (pr.sq + 4) * U32 * s * (mag.T @ aq)
            edv[b][:, hk] += (chain + (pr.sq + 4) * U32) * (pd.T @ ado)
            if edb is not None:
                f = s if cfg.attn_bias_type == "pre_scale_bias" else 1.0
                lq, lkv = err.shape
                edb[min(b, edb.shape[0] - 1), min(h, edb.shape[1] - 1), :lq, :lkv] += f * (err + U32 * mag)
        self.e_o = self._q_layout(eo, self.o.shape)
        self.e_lse = 2 * (ds_err + (n + 4) * U32 * (1 + np.abs(np.where(np.isfinite(self.lse), self.lse, 0))))
        self.e_dq = self._q_layout(edq, self.dq.shape)
        self.e_dk = ref.to_layout(edk, self.fmt, self.dk.shape, self.cu_kv, self.cu_kv_pad)
        self.e_dv = ref.to_layout(edv, self.fmt, self.dv.shape, self.cu_kv, self.cu_kv_pad)
        self.e_db = edb


def assert_close(name, got, want, err, u_out):
    got = np.asarray(got, dtype=np.float64)
    bound = 2 * (np.asarray(err) + u_out * np.abs(want) + TINY_OUT.get(u_out, 2.0**-150))
    bad = ~(np.abs(got - want) <= bound)
    if bad.any():
        idx = np.argwhere(bad)[0]
        raise AssertionError(
            f"{name}: {bad.sum()} of {bad.size} elements outside the bound; first at {tuple(idx)}: "
            f"got {got[tuple(idx)]!r}, want {want[tuple(idx)]!r}, bound {bound[tuple(idx)]!r}"
        )


def core_run(q, k, v, d_o, opts):
    kw = {n: x for n, x in opts.items() if not n.startswith("_")}
    fwd = tec.attention_fwd(q, k, v, **kw)
    grad = tec.attention_bwd(q, k, v, fwd.o, d_o, fwd.softmax_lse, **kw)
    return fwd, grad


def check_against_oracle(q, k, v, d_o, opts, dtype):
    """Core forward and backward vs the float64 oracle within the derived bounds."""
    opts = {**opts, "_dtype": dtype}
    fwd, grad = core_run(q, k, v, d_o, opts)
    orc = Oracle(q, k, v, d_o, opts)
    u = U_OUT[dtype]
    lse_inf = np.isneginf(orc.lse)
    assert np.array_equal(np.isneginf(fwd.softmax_lse), lse_inf), "lse: -inf rows differ"
    assert_close("o", fwd.o, orc.o, orc.e_o, u)
    assert_close("lse", np.where(lse_inf, 0, fwd.softmax_lse), np.where(lse_inf, 0, orc.lse), orc.e_lse, 0.0)
    assert_close("dq", grad.dq, orc.dq, orc.e_dq, u)
    assert_close("dk", grad.dk, orc.dk, orc.e_dk, u)
    assert_close("dv", grad.dv, orc.dv, orc.e_dv, u)
    if orc.dbias is not None:
        assert_close("dbias", grad.dbias, orc.dbias, orc.e_db, u)
    if opts.get("softmax_type") == "learnable":
        assert_close("dsoftmax_offset", grad.dsoftmax_offset, orc.dalpha, orc.e_alpha, U32)
    return fwd, grad, orc
