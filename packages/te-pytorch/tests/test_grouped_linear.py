"""te.GroupedLinear and te.Fp8Padding / te.Fp8Unpadding.

High precision: each row block against its own float64 x W_i^T + b_i, forward
and backward (splits of 0 rows included). FP8: each row block equals a te.Linear
holding the same weights under the same recipe, bit for bit, outputs,
gradients and (delayed scaling) the FP8 states after the step -- te.Linear's
FP8 numerics are tested against float64 oracles in test_linear.py / test_fp8_module.py.
"""

from __future__ import annotations

import pytest
import torch
from pt_helpers import cuda_ready

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.module, pytest.mark.usefixtures("te_state")]


def _model(n, k, m, bias=True, dtype=torch.float32, device="cpu"):
    torch.manual_seed(3)
    return te.GroupedLinear(n, k, m, bias=bias, params_dtype=dtype, device=device)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("bias", [True, False])
def test_high_precision_against_float64(bias):
    n, k, m = 4, 24, 20
    model = _model(n, k, m, bias)
    if bias:
        with torch.no_grad():
            for i in range(n):
                getattr(model, f"bias{i}").normal_()
    splits = [5, 0, 11, 3]
    x = torch.randn(1, sum(splits), k, dtype=torch.float64)
    g = torch.randn(1, sum(splits), m, dtype=torch.float64)
    xs = x.float().requires_grad_()
    y = model(xs, splits)
    y.backward(g.float())
    start = 0
    for i, rows in enumerate(splits):
        w = getattr(model, f"weight{i}").detach().double().requires_grad_()
        b = getattr(model, f"bias{i}").detach().double().requires_grad_() if bias else None
        xi = x[0, start : start + rows].clone().requires_grad_()
        want = xi @ w.T + (b if bias else 0)
        want.backward(g[0, start : start + rows])
        if rows:
            assert (y[0, start : start + rows].double() - want).abs().max() < 1e-5
            assert (xs.grad[0, start : start + rows].double() - xi.grad).abs().max() < 1e-5
        wg = getattr(model, f"weight{i}").grad
        assert torch.equal(wg, torch.zeros_like(wg)) if rows == 0 else (wg.double() - w.grad).abs().max() < 1e-5
        if bias and rows:
            assert (getattr(model, f"bias{i}").grad.double() - b.grad).abs().max() < 1e-5
        start += rows


RECIPES = {
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=3),
    "current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", list(RECIPES))
def test_fp8_equals_separate_linears(kind, device):
    if device == "cuda" and not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    n, k, m = 3, 64, 32
    splits = [32, 0, 64] if kind == "mxfp8" else [16, 0, 40]
    model = _model(n, k, m, device=device)
    singles = []
    for i in range(n):
        lin = te.Linear(k, m, device=device)
        with torch.no_grad():
            lin.weight.copy_(getattr(model, f"weight{i}"))
            lin.bias.copy_(getattr(model, f"bias{i}"))
        singles.append(lin)
    rec = RECIPES[kind]()
    for step in range(2):
        x = (torch.randn(sum(splits), k) * (step + 1)).to(device)
        g = torch.randn(sum(splits), m).to(device)
        xg = x.clone().requires_grad_()
        with te.autocast(recipe=rec):
            y = model(xg, splits)
        y.backward(g)
        start = 0
        for i, rows in enumerate(splits):
            if rows == 0:
                assert torch.equal(getattr(model, f"weight{i}").grad, torch.zeros(m, k, device=device))
                continue
            xi = x[start : start + rows].clone().requires_grad_()
            lin = singles[i]
            lin.zero_grad()
            with te.autocast(recipe=rec):
                yi = lin(xi)
            yi.backward(g[start : start + rows])
            assert torch.equal(y[start : start + rows], yi), (kind, step, i)
            assert torch.equal(xg.grad[start : start + rows], xi.grad)
            assert torch.equal(getattr(model, f"weight{i}").grad, lin.weight.grad)
            assert torch.equal(getattr(model, f"bias{i}").grad, lin.bias.grad)
            if kind == "delayed":  # the states of GEMM i: forward slots 3i, 3i+1, backward slot 2i
                fwd, bwd = model.fp8_meta["scaling_fwd"], model.fp8_meta["scaling_bwd"]
                one_f, one_b = lin.fp8_meta["scaling_fwd"], lin.fp8_meta["scaling_bwd"]
                assert torch.equal(fwd.scale[3 * i : 3 * i + 2], one_f.scale[:2])
                assert torch.equal(fwd.amax_history[:, 3 * i : 3 * i + 2], one_f.amax_history[:, :2])
                assert torch.equal(bwd.scale[2 * i], one_b.scale[0])
                assert torch.equal(bwd.amax_history[:, 2 * i], one_b.amax_history[:, 0])
            start += rows
        model.zero_grad()


def test_state_dict_names_and_errors():
    model = _model(2, 16, 8)
    assert set(model.state_dict()) == {"weight0", "weight1", "bias0", "bias1", "_extra_state"}
    x = torch.randn(6, 16)
    with pytest.raises(ValueError, match="sum to the 6 rows"):
        model(x, [2, 3])
    with pytest.raises(ValueError, match="m_splits must be 2 non-negative ints"):
        model(x, [6])
    with pytest.raises(ValueError, match="m_splits must be 2 non-negative ints"):
        model(x, [7, -1])
    with pytest.raises(ValueError, match=r"inp must be \[\.\.\., 16\]"):
        model(torch.randn(6, 15), [3, 3])
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        model(x.numpy(), [3, 3])
    with pytest.raises(NotImplementedError, match="single_grouped_weight"):
        te.GroupedLinear(2, 16, 8, single_grouped_weight=True, device="cpu")
    with pytest.raises(NotImplementedError, match="out= and dgrad_out="):
        model(x, [3, 3], out=torch.empty(6, 8))


@pytest.mark.parametrize(
    "kind, align", [(None, 16), ("mxfp8", 32), ("nvfp4", 128), ("given", 8)], ids=["default", "mxfp8", "nvfp4", "given"]
)
def test_fp8_padding_round_trip(kind, align):
    rec = {None: None, "mxfp8": recipe.MXFP8BlockScaling(), "nvfp4": recipe.NVFP4BlockScaling(), "given": None}[kind]
    pad = te.Fp8Padding(3, align_size=8 if kind == "given" else None)
    unpad = te.Fp8Unpadding(3, align_size=8 if kind == "given" else None)
    splits = [5, 0, align]
    x = torch.randn(sum(splits), 4, requires_grad=True)
    with te.autocast(enabled=rec is not None, recipe=rec):
        padded, sizes = pad(x, splits)
        back = unpad(padded, splits)
    assert sizes == [align, 0, align]
    assert padded.shape == (2 * align, 4)
    assert torch.equal(padded[:5], x[:5].detach()) and torch.all(padded[5:align] == 0)
    assert torch.equal(padded[align:], x[5:].detach())
    assert torch.equal(back, x.detach())
    back.backward(torch.ones_like(back))
    assert torch.equal(x.grad, torch.ones_like(x))
    with pytest.raises(ValueError, match="align_size"):
        te.Fp8Padding(2, align_size=0)
    with pytest.raises(ValueError, match="m_splits sum"):
        pad(x, [1, 1, 1])
