"""Attention: dropout (the Philox keep rule, reproducibility, keep rate, the
oracle with the same keep mask), hostile values, lse semantics, the oracle's
own backward against finite differences, and a 4096-token sequence in
bounded memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from attention_helpers import check_against_oracle, rand
from test_attention import make, mask_opts

import transformer_engine.core as tec
from transformer_engine.core import reference_attention as ref


def test_oracle_philox_known_answers():
    # The Random123 known-answer vectors of Philox4x32-10.
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for ctr, key, want in cases:
        got = ref.philox4x32_10(np.array([ctr], dtype=np.uint64), key)[0]
        assert tuple(int(x) for x in got) == want


def keep_mask_of_core(p, seed, offset, b=2, h=3, sq=5, skv=16):
    """The core's keep mask, read back: q = 0 makes P uniform (1/skv) and v = I
    makes O = P', so O * skv * (1 - p) is the keep mask."""
    q = np.zeros((b, sq, h, 4), np.float32)
    k = np.ones((b, skv, 1, 4), np.float32)
    v = np.broadcast_to(np.eye(skv, dtype=np.float32)[None, :, None, :], (b, skv, 1, skv)).copy()
    o, _ = tec.attention_fwd(q, k, v, dropout=p, rng_state=(seed, offset))
    return np.transpose(o, (0, 2, 1, 3)) * (skv * (1 - np.float32(p)))  # [b, h, sq, skv]


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keep_rule_matches_the_oracle(p):
    seed, offset = 0x1234_5678_9ABC, 77
    got = keep_mask_of_core(p, seed, offset)
    want = np.stack(
        [np.stack([ref.dropout_keep(p, seed, offset, b, h, 3, 5, 16, 5, 16) for h in range(3)]) for b in range(2)]
    )
    assert np.allclose(got, want, atol=1e-5)


def test_dropout_reproducible_and_keyed(rng):
    q, k, v, _ = make(rng, "fp32")
    run = lambda seed, off: tec.attention_fwd(q, k, v, dropout=0.4, rng_state=(seed, off)).o  # noqa: E731
    assert np.array_equal(run(5, 9), run(5, 9))
    assert not np.array_equal(run(5, 9), run(6, 9))
    assert not np.array_equal(run(5, 9), run(5, 10))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.75])
def test_dropout_keep_rate(p):
    keep = keep_mask_of_core(p, 2024, 0, b=4, h=4, sq=64, skv=64) > 0.5
    n = keep.size
    sigma = np.sqrt(n * p * (1 - p))
    assert abs(keep.sum() - n * (1 - p)) < 5 * sigma  # a binomial count, 5 standard deviations


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding"])
def test_dropout_against_oracle(rng, dtype, mask):
    q, k, v, d_o = make(rng, dtype)
    opts = {"dropout": 0.3, "rng_state": (int(rng.integers(1 << 62)), 3), **mask_opts(rng, mask, 2, 4, 7, 9)}
    check_against_oracle(q, k, v, d_o, opts, dtype)


def test_dropout_thd_against_oracle(rng):
    from test_attention import thd_case

    q, k, v, d_o, opts = thd_case(rng, "fp32", [3, 6], [5, 2], [1, 2], [0, 3])
    opts.update(dropout=0.25, rng_state=(99, 1), attn_mask_type="padding_causal_bottom_right")
    check_against_oracle(q, k, v, d_o, opts, "fp32")


def test_large_logits(rng):
    q, k, v, d_o = make(rng, "fp32", d=16)
    q *= 40.0  # logits of several thousand: exp() overflows without the running maximum
    check_against_oracle(q, k, v, d_o, {"attn_scale": 1.0, "attn_mask_type": "causal"}, "fp32")


@pytest.mark.parametrize("softmax", ["vanilla", "off_by_one", "learnable"])
def test_rows_without_visible_keys(rng, softmax):
    q, k, v, d_o = make(rng, "fp32", sq=9, skv=4)
    mask = np.zeros((2, 4, 9, 4), bool)
    mask[:, :, 2] = True  # row 2 of every head fully masked
    mask[1, 3, 5] = True
    opts = {"attn_mask_type": "arbitrary", "attn_mask": mask, "softmax_type": softmax}
    if softmax == "learnable":
        opts["softmax_offset"] = np.array([0.5, -1, 2, 0], np.float32)
    fwd, grad, _ = check_against_oracle(q, k, v, d_o, opts, "fp32")
    assert np.isneginf(fwd.softmax_lse[:, :, 2]).all() and np.isneginf(fwd.softmax_lse[1, 3, 5])
    assert not fwd.o[:, 2].any() and not grad.dq[:, 2].any() and not fwd.o[1, 5, 3].any()
    assert np.isfinite(grad.dk).all() and np.isfinite(grad.dv).all()


def test_causal_bottom_right_with_more_queries_than_keys(rng):
    q, k, v, d_o = make(rng, "fp32", sq=9, skv=4)
    fwd, _, _ = check_against_oracle(q, k, v, d_o, {"attn_mask_type": "causal_bottom_right"}, "fp32")
    # Query i sees keys j <= i - 5: the first five rows see none.
    assert np.isneginf(fwd.softmax_lse[:, :, :5]).all() and np.isfinite(fwd.softmax_lse[:, :, 5:]).all()


@pytest.mark.parametrize("softmax", ["vanilla", "off_by_one", "learnable"])
def test_lse_is_the_log_of_the_denominator(rng, softmax):
    q, k, v, _ = make(rng, "fp32", b=1, h=2, hk=2)
    alpha = np.array([0.3, -0.7], np.float32)
    kw = {"softmax_type": softmax, "softmax_offset": alpha if softmax == "learnable" else None}
    _, lse = tec.attention_fwd(q, k, v, **kw)
    s = np.einsum("ihd,jhd->hij", q[0].astype(np.float64), k[0].astype(np.float64)) / np.sqrt(8)
    sink = {"vanilla": 0.0, "off_by_one": 1.0, "learnable": np.exp(alpha.astype(np.float64))[:, None]}[softmax]
    want = np.log(np.exp(s).sum(axis=-1) + sink)
    np.testing.assert_allclose(lse[0], want, rtol=0, atol=1e-5)


def test_oracle_backward_against_finite_differences(rng):
    q, k, v = rng.standard_normal((1, 3, 2, 3)), rng.standard_normal((1, 4, 1, 3)), rng.standard_normal((1, 4, 1, 2))
    bias, alpha = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal(2)
    d_o = rng.standard_normal((3, 2, 2))
    cfg = ref.Config(attn_mask_type="causal_bottom_right", attn_bias_type="pre_scale_bias", softmax_type="learnable",
                     scale=0.7, window=(1, -1))  # fmt: skip

    def loss(q, k, v, bias, alpha):
        pr = ref.make_problem(cfg, q, k, v, bias=bias, softmax_offset=alpha)
        return float((ref.forward(pr)[0][0] * d_o).sum())

    pr = ref.make_problem(cfg, q, k, v, bias=bias, softmax_offset=alpha)
    dq, dk, dv, dbias, dalpha = ref.backward(pr, [d_o])
    analytic = [dq[0][None], dk[0][None], dv[0][None], dbias, dalpha]
    args = [q, k, v, bias, alpha]
    for n, (x, g) in enumerate(zip(args, analytic)):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            hi, lo = [a.copy() for a in args], [a.copy() for a in args]
            hi[n][idx] += 1e-6
            lo[n][idx] -= 1e-6
            num[idx] = (loss(*hi) - loss(*lo)) / 2e-6
        np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-7)


_LONG = textwrap.dedent(
    """
    import resource, numpy as np, transformer_engine.core as tec
    rng = np.random.default_rng(1)
    s, d = 4096, 8
    q, k, v, d_o = (rng.standard_normal((1, s, 1, d)).astype(np.float32) for _ in range(4))
    # Resident now (not the peak so far, which imports may have raised), in KiB.
    before = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
    o, lse = tec.attention_fwd(q, k, v, attn_mask_type="causal")
    g = tec.attention_bwd(q, k, v, o, d_o, lse, attn_mask_type="causal")
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    # One full S matrix would be s * s * 4 bytes = 64 MiB.
    assert grown < 24 * 1024, f"peak memory grew by {grown} KiB"
    for i in (0, 1, 2047, 4095):  # rows against float64, straight from the definition
        sc = (k[0, : i + 1, 0].astype(np.float64) @ q[0, i, 0]) / np.sqrt(d)
        p = np.exp(sc - sc.max()); p /= p.sum()
        assert np.allclose(o[0, i, 0], p @ v[0, : i + 1, 0], atol=2e-5)
        assert abs(lse[0, 0, i] - (sc.max() + np.log(np.exp(sc - sc.max()).sum()))) < 1e-4
    assert np.isfinite(g.dq).all() and np.isfinite(g.dk).all() and np.isfinite(g.dv).all()
    print("ok")
    """
)


def test_long_sequence_in_bounded_memory():
    out = subprocess.run([sys.executable, "-c", _LONG], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
