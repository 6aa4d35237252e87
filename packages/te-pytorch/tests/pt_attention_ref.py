"""A float64 attention oracle for the te-pytorch attention tests.

Independent of the code under test: it loops over batch entries and heads,
cuts each sequence to its real length (no padding masks), decides each
(query, key) pair's visibility with the rules written out element by
element, and applies the softmax variant per row.
"""

from __future__ import annotations

import math

import torch


def bf16_exact(*shape) -> torch.Tensor:
    """Float64 values that BF16 holds exactly (a CUDA kernel's BF16 inputs equal the oracle's)."""
    return torch.randn(*shape, dtype=torch.float64).bfloat16().double()


def check_bf16_kernel(got, want, name, u=2.0**-8) -> None:
    """Each BF16 result within 8 u max(|want|, 1) of the float64 oracle (the bound of a kernel
    that rounds P and dS to BF16 before FP32-accumulated products: test_attention_flash_gpu.py)."""
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, f"{name}[{i}]: shape {tuple(a.shape)} vs {tuple(b.shape)}"
        err = (a.double().cpu() - b).abs().max().item()
        bound = 8 * u * max(b.abs().max().item(), 1.0)
        assert err <= bound, f"{name}[{i}]: max error {err:.3g} > bound {bound:.3g}"


def alibi_slopes(h: int) -> list[float]:
    """The ALiBi paper's slopes (closest-power-of-two rule for other head counts)."""

    def geometric(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    m = 2 ** int(math.log2(h))
    return geometric(m) + geometric(2 * m)[0::2][: h - m]


def visible(i, j, lq, lkv, mask_type, window, bottom_right):
    """Whether query i may see key j (sequence lengths lq, lkv)."""
    if "causal" in mask_type:
        limit = i + (lkv - lq if "bottom_right" in mask_type else 0)
        if j > limit:
            return False
    off = lkv - lq if bottom_right else 0
    left, right = window
    if left >= 0 and j < i + off - left:
        return False
    if right >= 0 and "causal" not in mask_type and j > i + off + right:  # (causal: the mask's own diagonal)
        return False
    return True


def attention(
    q,
    k,
    v,
    lq,
    lkv,
    *,
    mask_type="no_mask",
    window=(-1, -1),
    bottom_right=True,
    scale=None,
    softmax_type="vanilla",
    sink=None,
    bias_type="no_bias",
    bias=None,
    slopes=None,
    arbitrary=None,
    softcap=0.0,
):
    """q [b, sq, h, d], k/v [b, skv, hk, d] (float64, padded bshd) with real
    lengths lq[b], lkv[b]; returns o [b, sq, h, dv] (padded rows 0).
    bias [1|b, 1|h, sq, skv]; slopes [h] or [b, h]; arbitrary [1|b, 1|h, sq, skv] True = masked;
    sink [h] (learnable alpha)."""
    b, sq, h, d = q.shape
    hk, dv = k.shape[2], v.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    rows = []
    for bi in range(b):
        heads = []
        for hi in range(h):
            kh = hi // (h // hk)
            nq, nk = int(lq[bi]), int(lkv[bi])
            out = torch.zeros(sq, dv, dtype=torch.float64)
            qq, kk, vv = q[bi, :nq, hi], k[bi, :nk, kh], v[bi, :nk, kh]
            raw = qq @ kk.T
            if bias_type == "pre_scale_bias":
                raw = raw + bias[bi % bias.shape[0], hi % bias.shape[1], :nq, :nk]
            s = raw * scale
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            if bias_type == "post_scale_bias":
                s = s + bias[bi % bias.shape[0], hi % bias.shape[1], :nq, :nk]
            for i in range(nq):
                keep = [
                    visible(i, j, nq, nk, mask_type, window, bottom_right)
                    and not (
                        arbitrary is not None
                        and bool(arbitrary[bi % arbitrary.shape[0], hi % arbitrary.shape[1], i, j])
                    )
                    for j in range(nk)
                ]
                logits = []
                for j in range(nk):
                    x = s[i, j]
                    if bias_type == "alibi":
                        slope = (
                            alibi_slopes(h)[hi]
                            if slopes is None
                            else float(slopes.reshape(-1, h)[bi % slopes.reshape(-1, h).shape[0], hi])
                        )
                        off = nk - nq if bottom_right else 0
                        x = x - slope * abs(i + off - j)
                    logits.append(x)
                terms = [torch.exp(logits[j]) for j in range(nk) if keep[j]]
                if softmax_type == "vanilla" and not terms:
                    continue
                denom = sum(terms) if terms else torch.zeros((), dtype=torch.float64)
                if softmax_type == "off-by-one":
                    denom = denom + 1.0
                elif softmax_type == "learnable":
                    denom = denom + torch.exp(sink[hi].double())
                acc = torch.zeros(dv, dtype=torch.float64)
                for j in range(nk):
                    if keep[j]:
                        acc = acc + torch.exp(logits[j]) / denom * vv[j]
                out = torch.cat((out[:i], acc[None], out[i + 1 :]))
            heads.append(out)
        rows.append(torch.stack(heads, dim=1))  # [sq, h, dv]
    return torch.stack(rows)
