"""torch.ops.te.* against the NumPy + ml_dtypes oracle of te-core.

Quantization is bit-exact (bytes, scale, scale_inv, amax); GEMMs and norms
are within derived bounds of float64 references. Every test runs on the CPU
and, marked gpu, on CUDA. The registered ops are checked with
torch.library.opcheck (schema, fake kernels, tracing).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from pt_helpers import (
    FP8_MAX,
    accumulation_u,
    assert_within,
    cuda_ready,
    fp8_error,
    hostile,
    matmul_bound,
)

from transformer_engine.core import reference
from transformer_engine.core.testing.shapes import SHAPES
from transformer_engine.core.testing.tolerances import unit_roundoff
from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels.gemm import GemmOptions

pytest_plugins = ["pt_fixtures"]
pytestmark = [
    pytest.mark.usefixtures("te_state"),
    pytest.mark.cast,
    pytest.mark.gemm,
    pytest.mark.norm,
    pytest.mark.transpose,
    pytest.mark.recipe,
]

CODE = {"e4m3": 7, "e5m2": 8}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.cpu().numpy()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("pow2, eps", [(False, 0.0), (True, 0.0), (False, 1e-3)])
def test_current_scaling_matches_oracle(device, shape, dtype, fmt, pow2, eps):
    x = hostile(shape, dtype, device, fmt)
    row, col, stats = kernels.quantize_fp8_current_scaling(x, CODE[fmt], True, True, pow2, eps)
    amax = reference.amax(_np(x))
    # Fused current scaling turns an infinite scale into the input type's max.
    scale = reference.scale_from_amax(amax, fmt, pow2, eps, value_for_inf=torch.finfo(dtype).max)
    q = reference.quantize_fp8(_np(x), scale, fmt)
    np.testing.assert_array_equal(_bytes(row), q)
    np.testing.assert_array_equal(_bytes(col), reference.columnwise(q))
    expected = np.array([scale, np.float32(1) / scale, amax], np.float32)
    np.testing.assert_array_equal(_np(stats), expected)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_delayed_quantize_matches_oracle(device, shape, dtype, fmt):
    x = hostile(shape, dtype, device, fmt)
    scale_value = float(np.float32(2.0 ** np.random.uniform(-8, 8)))
    scale = torch.tensor([scale_value], device=device)
    start = float(np.random.choice([0.0, 5.0, 1e9]))
    amax = torch.tensor([start], device=device)
    row, col, scale_inv = kernels.quantize_fp8(x, scale, amax, CODE[fmt], True, True)
    q = reference.quantize_fp8(_np(x), scale_value, fmt)
    np.testing.assert_array_equal(_bytes(row), q)
    np.testing.assert_array_equal(_bytes(col), reference.columnwise(q))
    assert _np(scale_inv)[0] == np.float32(1) / np.float32(scale_value)
    assert _np(amax)[0] == max(np.float32(start), reference.amax(_np(x)))
    # Rowwise only / columnwise only give the same bytes.
    only_col = kernels.quantize_fp8(x, scale, None, CODE[fmt], False, True)
    assert only_col[0] is None and torch.equal(only_col[1], col)


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_dequantize_matches_oracle(device, out_dtype, fmt):
    data = torch.randint(0, 256, (37, 48), dtype=torch.uint8, device=device)
    scale_inv = torch.tensor([float(np.float32(np.random.uniform(1e-3, 10)))], device=device)
    out = kernels.dequantize_fp8(data, scale_inv, CODE[fmt], out_dtype)
    ref_dtype = {torch.float32: np.float32, torch.float16: np.float16}.get(out_dtype, np.float32)
    expected = reference.dequantize_fp8(_bytes(data), _np(scale_inv)[0], fmt, ref_dtype)
    if out_dtype == torch.bfloat16:
        expected = torch.from_numpy(expected).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(_np(out), np.asarray(expected, np.float32))


# (8, 24, 40): none a multiple of 16, te_gemm runs it zero-padded (kernels/gemm.py).
@pytest.mark.parametrize("m, n, k", [(16, 32, 48), (48, 16, 160), (128, 64, 32), (8, 24, 40)])
@pytest.mark.parametrize("a_fmt, b_fmt", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_fp8_gemm_tn(device, m, n, k, a_fmt, b_fmt, out_dtype):
    """y = a b^T from current-scaled FP8 operands (the Linear forward's form)."""
    a = torch.randn(m, k, device=device)
    b = torch.randn(n, k, device=device) * 0.05
    bias = torch.randn(n, device=device)
    qa = kernels.quantize_fp8_current_scaling(a, CODE[a_fmt], True, False)
    qb = kernels.quantize_fp8_current_scaling(b, CODE[b_fmt], True, False)
    y, _, _ = kernels.gemm(
        qa[0],
        qb[0],
        a_dtype=CODE[a_fmt],
        a_scale_inv=qa[2][1:2],
        b_dtype=CODE[b_fmt],
        b_scale_inv=qb[2][1:2],
        transb=True,
        out_dtype=out_dtype,
        bias=bias,
    )
    # Exact operands: the dequantized FP8 values; FP32 accumulation and output rounding only.
    a_hat = kernels.dequantize_fp8(qa[0], qa[2][1:2], CODE[a_fmt]).double()
    b_hat = kernels.dequantize_fp8(qb[0], qb[2][1:2], CODE[b_fmt]).double()
    zero_a, zero_b = torch.zeros_like(a_hat), torch.zeros_like(b_hat)
    expected = a_hat @ b_hat.T + bias.double()
    bound = matmul_bound(a_hat, b_hat, zero_a, zero_b, out_dtype, accumulation_u(device, True))
    bound += unit_roundoff(out_dtype) * bias.double().abs()
    assert_within(y, expected, bound, "FP8 GEMM vs dequantized operands")
    # Against the unquantized operands: the per-format bound of pt_helpers.fp8_error.
    scale_a = FP8_MAX[a_fmt] / a.abs().max().item()
    scale_b = FP8_MAX[b_fmt] / b.abs().max().item()
    bound = matmul_bound(a, b, fp8_error(a, a_fmt, scale_a), fp8_error(b, b_fmt, scale_b), out_dtype)
    bound += 2.0**-8 * bias.double().abs()
    assert_within(y, a.double() @ b.double().T + bias.double(), bound, "FP8 GEMM vs float64")


@pytest.mark.parametrize("transa, transb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_high_precision_gemm_layouts(device, transa, transb, dtype):
    m, n, k = 19, 23, 37
    a = torch.randn((k, m) if transa else (m, k), device=device).to(dtype)
    b = torch.randn((n, k) if transb else (k, n), device=device).to(dtype)
    y, _, grad = kernels.gemm(a, b, transa=transa, transb=transb, out_dtype=torch.float32, bias_grad=True)
    op_a = (a.T if transa else a).double()
    op_b = (b.T if transb else b).double()
    bound = matmul_bound(op_a, op_b.T, torch.zeros_like(op_a), torch.zeros_like(op_b.T), torch.float32)
    assert_within(y, op_a @ op_b, bound, "GEMM")
    torch.testing.assert_close(grad.double(), op_a.sum(dim=1), rtol=k * 2.0**-23, atol=1e-5)


def test_gemm_accumulate_into_fp32(device):
    a = torch.randn(32, 16, device=device)
    b = torch.randn(32, 48, device=device)
    out = torch.randn(16, 48, device=device)
    start = out.clone()
    kernels.gemm_accumulate(a, b, out, beta=1.0, transa=True)
    torch.testing.assert_close(out, start + a.T @ b, rtol=1e-5, atol=1e-4)
    kernels.gemm_accumulate(a, b, out, beta=0.0, transa=True)
    torch.testing.assert_close(out, a.T @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("layernorm", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered_gamma", [False, True])
def test_norm_fwd_bwd(device, layernorm, dtype, zero_centered_gamma):
    x = (torch.randn(37, 96, device=device) * 3 + 1).to(dtype)
    gamma = torch.randn(96, device=device) * 0.5
    beta = torch.randn(96, device=device) if layernorm else None
    if layernorm:
        y, mu, rsigma, _ = kernels.layernorm_fwd(x, gamma, beta, 1e-5, zero_centered_gamma)
    else:
        y, mu, rsigma, _ = kernels.rmsnorm_fwd(x, gamma, 1e-5, zero_centered_gamma)
    assert (mu is not None) == layernorm and y.dtype == dtype
    xd = x.double().requires_grad_()
    g = gamma.double().requires_grad_()
    w = g + 1 if zero_centered_gamma else g
    if layernorm:
        bd = beta.double().requires_grad_()
        ref = torch.nn.functional.layer_norm(xd, (96,), w, bd, 1e-5)
    else:
        ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    u = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]
    torch.testing.assert_close(y.double(), ref, rtol=u, atol=u * 4)
    dz = torch.randn_like(x)
    if layernorm:
        dx, dgamma, dbeta = kernels.layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)
    else:
        dx, dgamma = kernels.rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma)
    ref.backward(dz.double())
    torch.testing.assert_close(dx.double(), xd.grad, rtol=u * 4, atol=u * 8)
    torch.testing.assert_close(dgamma.double(), g.grad, rtol=1e-4, atol=1e-3)
    if layernorm:
        torch.testing.assert_close(dbeta.double(), bd.grad, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_norm_fused_fp8_output_is_quantize_of_fp32_y(device, fmt):
    x = torch.randn(40, 64, device=device)
    gamma, beta = torch.randn(64, device=device), torch.randn(64, device=device)
    scale = torch.tensor([3.5], device=device)
    amax = torch.zeros(1, device=device)
    y8, _, _, scale_inv = kernels.layernorm_fwd(x, gamma, beta, 1e-5, fp8_dtype=CODE[fmt], scale=scale, amax=amax)
    y32, _, _, _ = kernels.layernorm_fwd(x, gamma, beta, 1e-5)
    q, _, q_inv = kernels.quantize_fp8(y32, scale, None, CODE[fmt])
    assert torch.equal(y8, q) and torch.equal(scale_inv, q_inv)
    assert amax.item() == y32.abs().max().item()


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("reduce", [False, True])
def test_delayed_scaling_update_matches_oracle(device, algo, fmt, reduce):
    tiny = FP8_MAX[fmt] / 3e38 / 4
    pool = torch.tensor([0.0, tiny, 1.5, 300.0, float("inf"), float("nan"), 2e-3, 7.0])
    histories, scales, buffers = [], [], []
    for n, length in ((3, 5), (2, 5), (4, 5)):
        h = pool[torch.randint(0, len(pool), (length, n))].clone()
        histories.append(h.to(device))
        scales.append((torch.rand(n) * 4 + 0.5).to(device))
        buffers.append(pool[torch.randint(0, len(pool), (n,))])
    buffer = torch.cat(buffers).to(device) if reduce else None
    expected, offset = [], 0
    for h, s, b in zip(histories, scales, buffers):
        expected.append(
            reference.delayed_scaling_update(
                _np(h), _np(s), fmt, margin=1.0, algo=algo, reduced_amax=b.numpy() if reduce else None
            )
        )
        offset += h.shape[1]
    kernels.delayed_scaling_update(buffer, histories, scales, algo=algo, fp8_dtype=CODE[fmt], margin=1.0)
    for h, s, (eh, es) in zip(histories, scales, expected):
        np.testing.assert_array_equal(_np(h), eh)
        np.testing.assert_array_equal(_np(s), es)


def test_registered_ops_match_direct_calls():
    x = torch.randn(32, 48)
    w = torch.randn(16, 48)
    direct = kernels.quantize_fp8_current_scaling(x, 7, True, True)
    op = torch.ops.te.quantize_fp8_current_scaling(x, 7, True, True, False, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(direct, op))
    assert torch.equal(
        kernels.gemm(x, w, transb=True)[0],
        torch.ops.te.gemm(x, w, torch.float32, None, False, 1.0, -1, None, -1, None, False, True, False, True)[0],
    )


def test_errors_name_the_argument():
    x = torch.randn(16, 32)
    with pytest.raises(TypeError, match="argument 'x' must be float32, bfloat16 or float16"):
        kernels.quantize_fp8_current_scaling(x.double(), 7)
    with pytest.raises(TypeError, match="fp8_dtype must be DType.kFloat8E4M3"):
        kernels.quantize_fp8_current_scaling(x, 4)
    with pytest.raises(ValueError, match="at least one of 'rowwise' and 'columnwise'"):
        kernels.quantize_fp8_current_scaling(x, 7, False, False)
    with pytest.raises(TypeError, match="argument 'a' must be"):
        kernels.gemm(x.double(), x, transb=True)
    with pytest.raises(TypeError, match="argument 'data' must hold FP8 bytes"):
        kernels.dequantize_fp8(x, torch.ones(1), 7)


def test_shared_keywords_are_listed_and_checked():
    """gemm's and gemm_accumulate's common keywords (GemmOptions, a te_op keyword
    group) are keyword-only parameters of both signatures; an unknown one is refused."""
    for fn in (kernels.gemm, kernels.gemm_accumulate):
        params = inspect.signature(fn).parameters
        assert [params[f].default for f in GemmOptions._fields] == list(GemmOptions())
        assert all(params[f].kind is inspect.Parameter.KEYWORD_ONLY for f in GemmOptions._fields)
    x = torch.randn(16, 16)
    with pytest.raises(TypeError, match="transB"):
        kernels.gemm(x, x, transB=True)
    with pytest.raises(TypeError, match="gelu"):
        kernels.gemm_accumulate(x, x, torch.zeros(16, 16), gelu=True)


@pytest.mark.gpu
def test_device_mismatch_is_named():
    if not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    with pytest.raises(ValueError, match="device"):
        kernels.gemm(torch.randn(16, 16, device="cuda"), torch.randn(16, 16), transb=True)


@pytest.mark.parametrize("shape", [(1, 1), (5, 160), (217, 256), (64, 33)])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_transpose_equals_torch(device, shape, dtype):
    x = (torch.rand(shape, device=device) * 200).to(dtype)
    out = kernels.transpose(x)
    assert out.is_contiguous() and out.dtype == dtype and out.shape == (shape[1], shape[0])
    assert torch.equal(
        out.view(torch.uint8) if dtype.itemsize == 1 else out,
        (x.t().view(torch.uint8) if dtype.itemsize == 1 else x.t()),
    )
    with pytest.raises(ValueError, match="argument 'x' must be 2-D"):
        kernels.transpose(x.reshape(-1))
