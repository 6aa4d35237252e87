"""te.ops activations against float64 torch formulas, forward and backward.

The kernels compute in FP32 and round once to the compute dtype, so each
value is within u(dtype) |ref| plus a few FP32 roundings of the intermediate
terms (the FP32 floor below, scaled by the operands' magnitude). Gated ops
gate the first half of the last dim (the opposite of torch's glu).
"""

from __future__ import annotations

import math

import pytest
import torch
from pt_helpers import assert_within

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core.testing.tolerances import unit_roundoff

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.activation]


def _gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _qgelu(x):
    return x * torch.sigmoid(1.702 * x)


def _srelu(x):
    return torch.relu(x) ** 2


def _clamped(a, b, limit=7.0, alpha=1.702, offset=1.0):
    c = a.clamp(max=limit)
    return c * torch.sigmoid(alpha * c) * (b.clamp(-limit, limit) + offset)


def _gated(f):
    return lambda x: f(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1]


REFERENCE = {
    "GELU": _gelu,
    "ReLU": torch.relu,
    "SiLU": torch.nn.functional.silu,
    "QGELU": _qgelu,
    "SReLU": _srelu,
    "GEGLU": _gated(_gelu),
    "ReGLU": _gated(torch.relu),
    "SwiGLU": _gated(torch.nn.functional.silu),
    "QGEGLU": _gated(_qgelu),
    "SReGLU": _gated(_srelu),
    "GLU": _gated(torch.sigmoid),
    "ClampedSwiGLU": lambda x: _clamped(*x.chunk(2, -1)),
}


def _bound(ref, dtype, scale):
    """u(dtype) |ref| + an FP32 floor of a few roundings of terms of size `scale`."""
    return 2 * unit_roundoff(dtype) * ref.abs() + 64 * 2.0**-24 * (scale + ref.abs())


def _check(op, fn, x, dtype, what):
    """op(x) and its input gradient against fn (float64, autograd) at the same x."""
    x = x.to(dtype).requires_grad_()
    y = op(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    y64 = fn(x64)
    y64.backward(dy.double())
    mag = x64.detach().abs() ** 2 + 1
    assert y.dtype == dtype and y.shape == y64.shape
    assert_within(y, y64.detach(), _bound(y64.detach(), dtype, mag.max()), f"{what} y")
    dmag = (dy.double().abs().max() * mag.max()).item()
    assert_within(x.grad, x64.grad, _bound(x64.grad, dtype, dmag), f"{what} dx")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(REFERENCE))
def test_activation_matches_float64(device, name, dtype):
    op = getattr(te.ops, name)()
    x = torch.randn(3, 7, 22, device=device) * 3
    _check(op, REFERENCE[name], x, dtype, name)


def test_clamped_swiglu_parameters(device):
    op = te.ops.ClampedSwiGLU(limit=1.5, alpha=0.8, glu_linear_offset=0.25)
    x = torch.randn(5, 18, device=device) * 3
    _check(op, lambda t: _clamped(*t.chunk(2, -1), limit=1.5, alpha=0.8, offset=0.25), x, torch.float32, "clamped")


def test_glu_interleave_size(device):
    size = 3
    op = te.ops.SwiGLU(glu_interleave_size=size)

    def interleaved_swiglu(x):
        blocks = x.reshape(*x.shape[:-1], -1, 2, size)
        a, b = blocks[..., 0, :].flatten(-2), blocks[..., 1, :].flatten(-2)
        return torch.nn.functional.silu(a) * b

    _check(op, interleaved_swiglu, torch.randn(4, 12, device=device), torch.float32, "interleaved")


def test_cache_quantized_input_differentiates_at_the_fp8_values(device):
    op = te.ops.GELU(cache_quantized_input=True)
    x = torch.randn(6, 16, device=device).requires_grad_()
    y = op(x)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(y, te.ops.GELU()(x.detach()), rtol=0, atol=0)  # the forward is exact
    q = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, device, columnwise=False)
    x_fp8 = q(x.detach()).dequantize().double().requires_grad_()
    _gelu(x_fp8).sum().backward()
    torch.testing.assert_close(x.grad.double(), x_fp8.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name, fn, kwargs",
    [
        ("ScaledSwiGLU", _gated(torch.nn.functional.silu), {}),
        ("ScaledSReLU", _srelu, {}),
        ("ScaledClampedQGeGLU", lambda x: _clamped(*x.chunk(2, -1), limit=2.0), {"limit": 2.0}),
    ],
)
def test_scaled_activations(device, name, fn, kwargs):
    op = getattr(te.ops, name)(**kwargs)
    x = (torch.randn(5, 3, 10, device=device) * 2).requires_grad_()
    width = fn(x.detach()).shape[-1]
    scales = torch.rand(5, 3, device=device).requires_grad_()
    y = op(x, scales)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64, s64 = x.detach().double().requires_grad_(), scales.detach().double().requires_grad_()
    y64 = fn(x64) * s64.unsqueeze(-1)
    y64.backward(dy.double())
    assert y.shape == (5, 3, width)
    for actual, expected, what in ((y, y64, "y"), (x.grad, x64.grad, "dx"), (scales.grad, s64.grad, "dscales")):
        expected = expected.detach()
        assert_within(actual, expected, 1e-5 * (1 + expected.abs()), f"{name} {what}")


def test_bias_activation_backward_fusion_equals_unfused(device):
    """Sequential(Bias, act) runs the fused backward (one kernel pass with the
    bias gradient); its gradients equal the ops run one by one."""
    bias, act = te.ops.Bias(16, device=device), te.ops.GEGLU()
    with torch.no_grad():
        bias.bias.normal_()
    model = te.ops.Sequential(bias, act)
    x = torch.randn(4, 3, 16, device=device, requires_grad=True)
    dy = torch.randn(4, 3, 8, device=device)
    model(x).backward(dy)
    fuser = model._module_groups[0]
    assert [type(op).__name__ for op, _ in fuser._backward_ops] == ["BackwardActivationBias"]
    fused_dx, fused_db = x.grad.clone(), bias.bias.grad.clone()
    x.grad = bias.bias.grad = None
    act(bias(x)).backward(dy)  # two one-op fusers: unfused
    torch.testing.assert_close(fused_dx, x.grad, rtol=0, atol=0)
    torch.testing.assert_close(fused_db, bias.bias.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", [recipe.DelayedScaling, recipe.MXFP8BlockScaling])
def test_mlp_of_ops_under_a_recipe(device, make):
    """LayerNorm -> Linear -> SwiGLU -> Linear trains under a recipe; the
    activation output is quantized by the next linear."""
    model = te.ops.Sequential(
        te.ops.LayerNorm(64, device=device),
        te.ops.Linear(64, 128, device=device),
        te.ops.SwiGLU(),
        te.ops.Linear(64, 64, device=device),
    )
    x = torch.randn(32, 64, device=device, requires_grad=True)
    with te.autocast(recipe=make()):
        y = model(x)
    y.sum().backward()
    with torch.no_grad():
        ref = model(x)  # high precision
    err = (y - ref).norm() / ref.norm()
    assert err < 0.2 and x.grad is not None and model[1].weight.grad is not None


def test_situ_variants_are_not_yet_supported():
    for name in ("SiTUGLU", "ScaledSiTUGLU", "ScaledTanhSReLU"):
        with pytest.raises(NotImplementedError, match="not yet supported"):
            getattr(te.ops, name)()
    with pytest.raises(NotImplementedError, match="activation_recompute_in_mlp"):
        te.ops.ScaledSwiGLU(activation_recompute_in_mlp=True)
    with pytest.raises(ValueError, match="even"):
        te.ops.SwiGLU()(torch.randn(2, 5))
