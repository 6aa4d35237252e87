"""te.DotProductAttention on a te-core built with cuDNN attention (TE_WITH_CUDNN=ON):
the backend selection prefers te-core's fused op when the core runs the call on
cuDNN (backends.py), and the result equals the float64 oracle, forward and
backward, within the bound test_attention_flash_gpu.py derives (cuDNN, like
FlashAttention, rounds P and dS to BF16 before its tensor-core products).

Opt-in as te-core's cuDNN tests are: TE_TEST_CUDNN=1 with such a build (ci/gpu.sh's
cudnn stage sets it after one guarded call)."""

from __future__ import annotations

import os

import pytest
import torch
from pt_attention_ref import attention as oracle
from pt_attention_ref import bf16_exact as _bf16_exact
from pt_attention_ref import check_bf16_kernel
from pt_helpers import cuda_ready

import transformer_engine.pytorch as te
from transformer_engine.pytorch.attention.dot_product_attention import fused

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.attention, pytest.mark.module, pytest.mark.gpu, pytest.mark.usefixtures("te_state")]


@pytest.fixture(autouse=True)
def _cudnn_build():
    if not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    if os.environ.get("TE_TEST_CUDNN") != "1":
        pytest.skip("the cuDNN attention backend is opt-in: build with TE_WITH_CUDNN=ON and set TE_TEST_CUDNN=1")


@pytest.mark.parametrize("mask_type", ["no_mask", "causal"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_cudnn_is_preferred_and_matches_the_oracle(monkeypatch, fmt, mask_type):
    monkeypatch.delenv("NVTE_FUSED_ATTN", raising=False)
    monkeypatch.delenv("NVTE_FLASH_ATTN", raising=False)
    torch.manual_seed(5)
    b, s, h, hk, d = 2, 129, 8, 2, 64
    assert fused.cudnn_built(torch.device("cuda"))
    q, k, v = _bf16_exact(b, s, h, d), _bf16_exact(b, s, hk, d), _bf16_exact(b, s, hk, d)
    g = _bf16_exact(b, s, h * d)
    perm = (lambda t: t) if fmt == "bshd" else (lambda t: t.transpose(0, 1))
    ts = [perm(t).cuda().bfloat16().contiguous().requires_grad_() for t in (q, k, v)]
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hk, attn_mask_type=mask_type, qkv_format=fmt)
    out = dpa(*ts)
    assert dpa.last_backend == "fused"
    out.backward(perm(g).cuda().bfloat16())
    got = [perm(out.detach()).reshape(b, s, -1)] + [perm(t.grad) for t in ts]
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    lens = torch.full((b,), s)
    o = oracle(qs, ks, vs, lens, lens, mask_type=mask_type, bottom_right=False).reshape(b, s, -1)
    o.backward(g)
    check_bf16_kernel(got, [o.detach(), qs.grad, ks.grad, vs.grad], f"{fmt}/{mask_type}")
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")  # (the switch still turns it off)
    dpa(*ts)
    assert dpa.last_backend == "flash"
