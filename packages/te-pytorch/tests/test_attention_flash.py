"""te.DotProductAttention's flash backend (torch SDPA) against the float64 oracle.

On the CPU the backend runs only when NVTE_FLASH_ATTN=1 asks for it; on CUDA it
is the default for the combinations it supports. Forward and backward, bshd and
sbhd, no mask and causal (top-left, and bottom-right with equal lengths), GQA
and MQA, head sizes that differ between keys and values; combinations it cannot
run go to the next backend.
"""

from __future__ import annotations

import pytest
import torch
from test_dot_product_attention import _case, _close, _oracle, _run

import transformer_engine.pytorch as te

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.attention, pytest.mark.module, pytest.mark.usefixtures("te_state")]


@pytest.fixture
def flash_only(monkeypatch):
    monkeypatch.setenv("NVTE_FLASH_ATTN", "1")
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")


SHAPES = {"gqa2": (2, 5, 5, 4, 2, 8, 8), "mqa_dv": (3, 6, 6, 6, 1, 4, 6), "cross": (1, 3, 7, 2, 2, 8, 8)}
# (causal_bottom_right with unequal lengths runs on another backend: the test below)
CASES = [
    (m, s)
    for m in ("no_mask", "causal", "causal_bottom_right")
    for s in SHAPES
    if (m, s) != ("causal_bottom_right", "cross")
]


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("mask_type, shape_name", CASES)
def test_flash_against_the_oracle(flash_only, fmt, mask_type, shape_name):
    b, sq, skv, h, hk, d, dv = SHAPES[shape_name]
    q, k, v, lq, lkv = _case(b, sq, skv, h, hk, d, dv, False)
    g = torch.randn(b, sq, h * dv, dtype=torch.float64)
    dpa = te.DotProductAttention(h, (d, dv), num_gqa_groups=hk, attn_mask_type=mask_type, qkv_format=fmt)
    got = _run(dpa, q, k, v, fmt, g)
    want = _oracle(q, k, v, lq, lkv, g, mask_type=mask_type, bottom_right=mask_type != "causal")
    _close(got, want, f"flash {mask_type}/{fmt}")
    assert dpa.last_backend == "flash"


def test_unsupported_combinations_go_to_the_next_backend(monkeypatch):
    monkeypatch.setenv("NVTE_FLASH_ATTN", "1")
    q = torch.randn(2, 4, 2, 8)
    k = torch.randn(2, 6, 2, 8)
    plain = te.DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="no_mask")
    plain(q, k, k)
    assert plain.last_backend == "flash"
    others = ({"attn_mask_type": "causal_bottom_right"}, {"attn_mask_type": "no_mask", "softmax_type": "off-by-one"})
    for kwargs in others:
        other = te.DotProductAttention(2, 8, qkv_format="bshd", **kwargs)
        other(q, k, k)
        assert other.last_backend in ("fused", "unfused"), kwargs
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
    plain(q, k, k)
    assert plain.last_backend != "flash"


def test_cpu_default_is_not_flash(monkeypatch):
    monkeypatch.delenv("NVTE_FLASH_ATTN", raising=False)
    q = torch.randn(2, 4, 2, 8)
    dpa = te.DotProductAttention(2, 8, qkv_format="bshd")
    dpa(q, q, q)
    assert dpa.last_backend != "flash"
