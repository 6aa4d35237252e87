"""FP8 GEMMs whose M, N or K is not a multiple of 16 (te_gemm's FP8 rule) run
on zero-padded copies in kernels/gemm.py; the result must be the unpadded
GEMM's. Oracle: float64 matmul of the dequantized FP8 operands (the values the
GEMM multiplies exactly), FP32 accumulation and output rounding bounds only."""

from __future__ import annotations

import pytest
import torch
from pt_helpers import accumulation_u, assert_within, matmul_bound

from transformer_engine.pytorch import kernels

pytest_plugins = ["pt_fixtures"]
pytestmark = pytest.mark.usefixtures("te_state")

E4M3 = 7


def _fp8(rows: int, cols: int, device):
    """(bytes, scale_inv, dequantized float64) of a current-scaled E4M3 [rows, cols] tensor."""
    q = kernels.quantize_fp8_current_scaling(torch.randn(rows, cols, device=device), E4M3, True, False)
    data, scale_inv = q[0], q[2][1:2]
    return data, scale_inv, kernels.dequantize_fp8(data, scale_inv, E4M3).double()


def _bound(a_hat, b_hat, device):
    """The bound of a_hat @ b_hat.T (b_hat is [N, K])."""
    zero_a, zero_b = torch.zeros_like(a_hat), torch.zeros_like(b_hat)
    return matmul_bound(a_hat, b_hat, zero_a, zero_b, torch.float32, accumulation_u(device, True))


@pytest.mark.parametrize("m, n, k", [(8, 24, 40), (24, 8, 16), (16, 16, 8), (40, 56, 72)])
@pytest.mark.parametrize("transa, transb", [(False, True), (True, False), (False, False), (True, True)])
def test_padded_fp8_gemm_layouts(device, m, n, k, transa, transb):
    a, sa, a_hat = _fp8(*((k, m) if transa else (m, k)), device)
    b, sb, b_hat = _fp8(*((n, k) if transb else (k, n)), device)
    op_a = a_hat.T if transa else a_hat
    op_b = b_hat.T if transb else b_hat
    y, _, grad = kernels.gemm(
        a, b, a_dtype=E4M3, a_scale_inv=sa, b_dtype=E4M3, b_scale_inv=sb, transa=transa, transb=transb
    )
    assert y.shape == (m, n) and grad is None
    assert_within(y, op_a @ op_b, _bound(op_a, op_b.T, device), f"padded FP8 GEMM {m}x{n}x{k}")


def test_padded_fp8_gemm_bias_and_bias_grad(device):
    m, n, k = 24, 40, 8  # a wgrad-like GEMM of 8 tokens: K = 8
    a, sa, a_hat = _fp8(m, k, device)
    b, sb, b_hat = _fp8(n, k, device)
    bias = torch.randn(n, device=device)
    y, _, grad = kernels.gemm(
        a, b, a_dtype=E4M3, a_scale_inv=sa, b_dtype=E4M3, b_scale_inv=sb, transb=True, bias=bias, bias_grad=True
    )
    expected = a_hat @ b_hat.T + bias.double()
    assert_within(y, expected, _bound(a_hat, b_hat, device) + 2.0**-24 * bias.double().abs(), "y + bias")
    assert grad.shape == (m,)
    sums = a_hat.sum(1)
    assert_within(grad, sums, 16 * 2.0**-24 * a_hat.abs().sum(1) + 2.0**-24 * sums.abs(), "bias_grad")


def test_padded_fp8_gemm_accumulate(device):
    m, n, k = 40, 24, 8
    a, sa, a_hat = _fp8(m, k, device)
    b, sb, b_hat = _fp8(n, k, device)
    out = torch.randn(m, n, device=device)
    start = out.double().clone()
    kernels.gemm_accumulate(
        a, b, out, beta=1.0, a_dtype=E4M3, a_scale_inv=sa, b_dtype=E4M3, b_scale_inv=sb, transb=True
    )
    bound = _bound(a_hat, b_hat, device) + 2.0**-23 * (start.abs() + (a_hat @ b_hat.T).abs())
    assert_within(out, start + a_hat @ b_hat.T, bound, "accumulated padded FP8 GEMM")
