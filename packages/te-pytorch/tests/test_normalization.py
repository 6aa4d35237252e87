"""te.LayerNorm and te.RMSNorm against float64 torch.

Tolerances: FP32 math in the core, so FP32 results are within 1e-5 (relative
to the output scale); BF16 outputs and gradients add one BF16 rounding
(2^-8 relative, asserted with 2^-7 for the FP32-math error on top).
"""

from __future__ import annotations

import pytest
import torch

import transformer_engine.pytorch as te

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.norm, pytest.mark.module]

TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2.0**-7, "atol": 2.0**-7}}


def _reference(layernorm: bool, x, weight, bias, eps, zero_centered_gamma, dims):
    g = weight + 1 if zero_centered_gamma else weight
    reduce = tuple(range(-dims, 0))
    if layernorm:
        mu = x.mean(reduce, keepdim=True)
        var = ((x - mu) ** 2).mean(reduce, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * g + bias
    return x / torch.sqrt((x * x).mean(reduce, keepdim=True) + eps) * g


@pytest.mark.parametrize("layernorm", [True, False], ids=["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [1e-1, 1e-3, 1e-5, 1e-7])
@pytest.mark.parametrize("zero_centered_gamma", [False, True])
@pytest.mark.parametrize("normalized_shape", [96, (4, 24)])
def test_matches_float64(device, layernorm, dtype, eps, zero_centered_gamma, normalized_shape):
    cls = te.LayerNorm if layernorm else te.RMSNorm
    norm = cls(normalized_shape, eps=eps, zero_centered_gamma=zero_centered_gamma, device=device, dtype=dtype)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    shape = (3, 7) + ((96,) if normalized_shape == 96 else normalized_shape)
    x = (torch.randn(shape, device=device) * 2 + 0.5).to(dtype).requires_grad_()
    dy = torch.randn(shape, device=device).to(dtype)
    y = norm(x)
    y.backward(dy)
    assert y.dtype == dtype and y.shape == x.shape
    dims = 1 if normalized_shape == 96 else 2
    xd = x.detach().double().requires_grad_()
    wd = norm.weight.detach().double().requires_grad_()
    bd = norm.bias.detach().double().requires_grad_() if layernorm else None
    ref = _reference(layernorm, xd, wd, bd, eps, zero_centered_gamma, dims)
    ref.backward(dy.double())
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])
    scale = xd.grad.abs().max().item()
    tol = TOL[dtype]
    torch.testing.assert_close(x.grad.double(), xd.grad, rtol=tol["rtol"], atol=tol["atol"] * scale)
    rows = 21
    grad_tol = {"rtol": tol["rtol"] + rows * 2.0**-23, "atol": tol["atol"] * rows}
    torch.testing.assert_close(norm.weight.grad.double(), wd.grad, **grad_tol)
    if layernorm:
        torch.testing.assert_close(norm.bias.grad.double(), bd.grad, **grad_tol)


def test_parameters_and_init(device):
    ln = te.LayerNorm(32, device=device)
    assert [n for n, _ in ln.named_parameters()] == ["weight", "bias"]
    assert torch.equal(ln.weight, torch.ones(32, device=device))
    assert torch.equal(ln.bias, torch.zeros(32, device=device))
    rms = te.RMSNorm(32, zero_centered_gamma=True, device=device)
    assert [n for n, _ in rms.named_parameters()] == ["weight"]
    assert torch.equal(rms.weight, torch.zeros(32, device=device))
    assert ln.weight.dtype == torch.get_default_dtype()


def test_deprecated_aliases_and_meta_init():
    with pytest.warns(DeprecationWarning, match="hidden_size is deprecated"):
        ln = te.LayerNorm(hidden_size=16, device="cpu")
    assert ln.normalized_shape == (16,)
    with pytest.warns(DeprecationWarning, match="params_dtype is deprecated"):
        rms = te.RMSNorm(16, params_dtype=torch.bfloat16, device="cpu", sequence_parallel=True)
    assert rms.weight.dtype == torch.bfloat16 and rms.weight.sequence_parallel
    meta = te.LayerNorm(16, device="meta", sm_margin=4)
    assert meta.weight.device.type == "meta"
    meta.reset_parameters()
    assert meta.weight.device.type != "meta" and torch.equal(meta.weight.cpu(), torch.ones(16))


def test_error_messages():
    ln = te.LayerNorm(16, device="cpu")
    with pytest.raises(ValueError, match=r"does not end with normalized_shape \(16,\)"):
        ln(torch.randn(4, 8))
    with pytest.raises(TypeError, match="input dtype torch.float64 is not supported"):
        ln(torch.randn(4, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match="normalized_shape is required"):
        te.RMSNorm(device="cpu")
