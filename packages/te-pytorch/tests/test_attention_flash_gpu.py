"""te.DotProductAttention's flash backend on CUDA in BF16: torch SDPA for
bshd/sbhd and torch's FlashAttention-2 varlen kernel for thd, against the
float64 oracle on the same (BF16-exact) inputs, forward and backward.

Bound: FlashAttention rounds P (forward) and dS (backward) to BF16 before its
tensor-core products, with FP32 accumulation, and rounds each result once; with
unit roundoff u = 2^-8 every element is within a few u of the magnitude of its
terms. The terms are bounded by the largest |want| of the tensor times the
sequence-length-free factor the softmax's convexity gives (P sums to 1), so
    max|got - want| <= 8 u max(|want|, 1)
per tensor: two roundings per term, a factor 4 of slack for the products and
the result's own rounding. Rows past cu_seqlens[-1] give zero outputs and
zero gradients.
"""

from __future__ import annotations

import pytest
import torch
from pt_attention_ref import attention as oracle
from pt_attention_ref import bf16_exact as _bf16_exact
from pt_attention_ref import check_bf16_kernel as _check
from pt_helpers import cuda_ready

import transformer_engine.pytorch as te

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.attention, pytest.mark.module, pytest.mark.gpu, pytest.mark.usefixtures("te_state")]


@pytest.fixture(autouse=True)
def _flash_on_cuda(monkeypatch):
    if not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")


@pytest.mark.parametrize("mask_type", ["no_mask", "causal"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_sdpa_bshd_sbhd(fmt, mask_type):
    torch.manual_seed(7)
    b, s, h, hk, d = 2, 129, 8, 2, 64
    q, k, v = _bf16_exact(b, s, h, d), _bf16_exact(b, s, hk, d), _bf16_exact(b, s, hk, d)
    g = _bf16_exact(b, s, h * d)
    perm = (lambda t: t) if fmt == "bshd" else (lambda t: t.transpose(0, 1))
    ts = [perm(t).cuda().bfloat16().contiguous().requires_grad_() for t in (q, k, v)]
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hk, attn_mask_type=mask_type, qkv_format=fmt)
    out = dpa(*ts)
    assert dpa.last_backend == "flash"
    out.backward(perm(g).cuda().bfloat16())
    got = [perm(out.detach())] + [perm(t.grad) for t in ts]
    got[0] = got[0].reshape(b, s, -1)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    lens = torch.full((b,), s)
    o = oracle(qs, ks, vs, lens, lens, mask_type=mask_type, bottom_right=False).reshape(b, s, -1)
    o.backward(g)
    _check(got, [o.detach(), qs.grad, ks.grad, vs.grad], f"{fmt}/{mask_type}")


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right"])
def test_varlen_thd(mask_type):
    torch.manual_seed(11)
    lens = torch.tensor([5, 130, 1, 64])
    b, s, h, hk, d, spare = len(lens), int(lens.max()), 8, 4, 64, 3  # (3 rows past the last sequence)
    cu = torch.cat((torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)))
    total = int(cu[-1]) + spare
    q, k, v = _bf16_exact(total, h, d), _bf16_exact(total, hk, d), _bf16_exact(total, hk, d)
    g = _bf16_exact(total, h * d)
    ts = [t.cuda().bfloat16().requires_grad_() for t in (q, k, v)]
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hk, attn_mask_type=mask_type, qkv_format="thd")
    cu_cuda = cu.cuda()
    out = dpa(*ts, cu_seqlens_q=cu_cuda, cu_seqlens_kv=cu_cuda, max_seqlen_q=s, max_seqlen_kv=s)
    assert dpa.last_backend == "flash"
    out.backward(g.cuda().bfloat16())

    def padded(x):  # [total, ...] -> [b, s, ...] with zeros past each length
        rows = torch.zeros(b, s, *x.shape[1:], dtype=torch.float64)
        for i in range(b):
            rows[i, : int(lens[i])] = x[int(cu[i]) : int(cu[i + 1])].double().cpu()
        return rows

    qs, ks, vs = (padded(t).requires_grad_() for t in (q, k, v))
    gp = padded(g)
    o = oracle(qs, ks, vs, lens, lens, mask_type=mask_type, bottom_right=mask_type != "padding_causal")
    o = o.reshape(b, s, -1)
    o.backward(gp)
    got = [padded(out.detach()), padded(ts[0].grad), padded(ts[1].grad), padded(ts[2].grad)]
    _check(got, [o.detach(), qs.grad, ks.grad, vs.grad], f"thd/{mask_type}")
    tail = slice(int(cu[-1]), total)  # rows of no sequence: zero output and zero gradients
    for t in (out.detach(), ts[0].grad, ts[1].grad, ts[2].grad):
        assert torch.all(t[tail] == 0)
