"""te.ops.BasicLinear / Bias / Linear against float64 torch, and under every recipe.

High precision: elementwise bounds of pt_helpers.matmul_bound (exact operands,
FP32 accumulation, one rounding to the output dtype). Under a recipe the op
runs te.Linear's GEMMs (module/_linear_fn.linear_forward / linear_backward),
so its output and gradients must equal te.Linear's bytes for the same weight,
input and gradient (test_linear.py / test_block_linear.py bound those against
float64 elementwise); a normwise check against float64 guards the wiring.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from pt_helpers import assert_within, matmul_bound

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core.testing.tolerances import unit_roundoffs

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]

U = unit_roundoffs(torch.float32, torch.bfloat16)
RECIPES = {
    "delayed": (recipe.DelayedScaling, 0.15),
    "current": (recipe.Float8CurrentScaling, 0.15),
    "mxfp8": (recipe.MXFP8BlockScaling, 0.15),
    "fp8_block": (recipe.Float8BlockScaling, 0.15),
    "nvfp4": (recipe.NVFP4BlockScaling, 0.5),
}


def _run(model, x, dy, fp8_recipe=None, *extra):
    x = x.detach().clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        y = model(x, *extra)
    y.backward(dy)
    return y, x.grad


def _normwise(actual, expected, tol, what):
    err = (actual.double() - expected).norm() / expected.norm()
    assert err <= tol, f"{what}: normwise relative error {err:.3g} > {tol}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_high_precision_matches_float64(device, dtype, bias):
    model = te.ops.Linear(19, 13, bias=bias, device=device, dtype=dtype)
    if bias:
        with torch.no_grad():
            model.bias.normal_()
    x = torch.randn(3, 5, 19, device=device).to(dtype)
    dy = torch.randn(3, 5, 13, device=device).to(dtype)
    y, dx = _run(model, x, dy)
    x2, w, dy2 = x.reshape(-1, 19).double(), model.weight.double(), dy.reshape(-1, 13).double()
    zero = torch.zeros_like
    b = model.bias.double() if bias else torch.zeros(13, dtype=torch.float64, device=device)
    y_bound = matmul_bound(x2, w, zero(x2), zero(w), dtype) + 2 * U[dtype] * b.abs()
    assert y.dtype == dtype and y.shape == (3, 5, 13)
    assert_within(y.reshape(-1, 13), x2 @ w.T + b, y_bound, "y")
    assert_within(dx.reshape(-1, 19), dy2 @ w, matmul_bound(dy2, w.T, zero(dy2), zero(w.T), dtype), "dx")
    dw_bound = matmul_bound(dy2.T, x2.T, zero(dy2.T), zero(x2.T), dtype)
    assert_within(model.weight.grad, dy2.T @ x2, dw_bound, "dW")
    if bias:
        db_bound = 15 * 2.0**-24 * dy2.abs().sum(0) + U[dtype] * dy2.sum(0).abs()
        assert_within(model.bias.grad, dy2.sum(0), db_bound, "db")


@pytest.mark.parametrize("name", list(RECIPES))
def test_basic_linear_and_bias_equal_te_linear_under_each_recipe(device, name):
    make, tol = RECIPES[name]
    k, n = 64, 32
    ops_model = te.ops.Sequential(te.ops.BasicLinear(k, n, device=device), te.ops.Bias(n, device=device))
    module = te.Linear(k, n, device=device)
    with torch.no_grad():
        ops_model[1].bias.normal_()
        module.weight.copy_(ops_model[0].weight)
        module.bias.copy_(ops_model[1].bias)
    x = torch.randn(2, 16, k, device=device) * 2
    dy = torch.randn(2, 16, n, device=device)
    for step in range(2):  # (delayed scaling: the second step runs on updated scales)
        torch.manual_seed(1234 + step)  # (NVFP4's stochastic rounding draws the same bits)
        y_ops, dx_ops = _run(ops_model, x, dy, make())
        torch.manual_seed(1234 + step)
        y_mod, dx_mod = _run(module, x, dy, make())
        torch.testing.assert_close(y_ops, y_mod, rtol=0, atol=0)
        torch.testing.assert_close(dx_ops, dx_mod, rtol=0, atol=0)
        torch.testing.assert_close(ops_model[0].weight.grad, module.weight.grad, rtol=0, atol=0)
        torch.testing.assert_close(ops_model[1].bias.grad, module.bias.grad, rtol=0, atol=0)
    x2, w, dy2 = x.reshape(-1, k).double(), module.weight.double(), dy.reshape(-1, n).double()
    _normwise(y_ops.reshape(-1, n), x2 @ w.T + module.bias.double(), tol, "y")
    _normwise(dx_ops.reshape(-1, k), dy2 @ w, tol, "dx")
    _normwise(ops_model[0].weight.grad, dy2.T @ x2, tol, "dW")


def test_delayed_scaling_state_is_updated_and_checkpointed(device):
    layer = te.ops.BasicLinear(32, 16, device=device)
    x, dy = torch.randn(16, 32, device=device) * 4, torch.randn(16, 16, device=device)
    _run(layer, x, dy, recipe.DelayedScaling())
    meta = layer.fp8_meta
    assert meta["scaling_fwd"].scale.shape == (2,) and meta["scaling_bwd"].scale.shape == (1,)
    # The autocast exit and the end of backward updated the scales from the amaxes.
    assert (meta["scaling_fwd"].scale != 1).all() and (meta["scaling_bwd"].scale != 1).all()
    state = layer.state_dict()
    assert set(state) == {"weight", "_extra_state"}
    fresh = te.ops.BasicLinear(32, 16, device=device)
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.fp8_meta["scaling_fwd"].scale, meta["scaling_fwd"].scale)
    torch.testing.assert_close(fresh.fp8_meta["scaling_bwd"].amax_history, meta["scaling_bwd"].amax_history)
    torch.testing.assert_close(fresh.weight, layer.weight)


def test_linear_state_dict_keys_and_fusion(device):
    model = te.ops.Sequential(te.ops.Linear(8, 4, device=device), te.ops.Linear(4, 2, bias=False, device=device))
    keys = {k for k in model.state_dict() if not k.endswith("_extra_state")}
    assert keys == {"0.basic_ops.0.weight", "0.basic_ops.1.bias", "1.basic_ops.0.weight"}
    assert model[0].weight is model[0].basic_ops[0].weight
    loaded = te.ops.Sequential(te.ops.Linear(8, 4, device=device), te.ops.Linear(4, 2, bias=False, device=device))
    loaded.load_state_dict(model.state_dict())
    torch.testing.assert_close(loaded[0].weight, model[0].weight)
    x = torch.randn(3, 8, device=device, requires_grad=True)
    model(x).sum().backward()
    fuser = model._module_groups[0]
    assert [type(op).__name__ for op, _ in fuser._forward_ops] == ["ForwardLinearBiasActivation", "BasicLinear"]
    assert [type(op).__name__ for op, _ in fuser._backward_ops] == ["BasicLinear", "Bias", "BasicLinear"]


def test_frozen_input_and_weight_gradients(device):
    layer = te.ops.Linear(16, 8, device=device)
    layer.weight.requires_grad_(False)
    x = torch.randn(4, 16, device=device)  # no input gradient either: only the bias learns
    layer(x).sum().backward()
    assert layer.weight.grad is None
    torch.testing.assert_close(layer.bias.grad, torch.full((8,), 4.0, device=device))
    with torch.no_grad():
        y = layer(x)
    assert not y.requires_grad


def test_accumulate_into_main_grad(device):
    layer = te.ops.BasicLinear(16, 8, device=device, accumulate_into_main_grad=True)
    layer.weight.main_grad = torch.ones(8, 16, device=device)
    x = torch.randn(4, 16, device=device)
    dy = torch.randn(4, 8, device=device)
    _run(layer, x, dy)
    torch.testing.assert_close(layer.weight.main_grad, 1 + dy.T @ x, rtol=1e-5, atol=1e-5)
    assert layer.weight.grad is None and layer.weight.grad_added_to_main_grad


def test_meta_device_is_materialized_at_first_forward(device):
    layer = te.ops.Linear(16, 8, device="meta")
    assert layer.weight.device.type == "meta"
    if device.type == "cpu" and torch.cuda.is_available():
        pytest.skip("the default device is CUDA here")
    with warnings.catch_warnings():  # ("CUDA is not available" is warned once per process: not asserted here)
        warnings.simplefilter("ignore", UserWarning)
        y = layer(torch.randn(2, 16, device=device))
    assert y.shape == (2, 8) and layer.weight.device.type == device.type
    assert layer.basic_ops[0].weight is layer.weight and layer.bias is layer.basic_ops[1].bias


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_not_yet_supported_arguments_and_errors():
    with pytest.raises(NotImplementedError, match="tensor parallelism"):
        te.ops.BasicLinear(8, 8, device="cpu", tensor_parallel_mode="column")
    with pytest.raises(NotImplementedError, match="userbuffers_options"):
        te.ops.BasicLinear(8, 8, device="cpu", userbuffers_options={})
    with pytest.raises(NotImplementedError, match="not yet supported"):
        te.ops.GroupedLinear(2, 8, 8)
    assert te.ops.is_op_fuser_grouped_tensor_path_supported() is False
    layer = te.ops.BasicLinear(8, 4, device="cpu")
    with pytest.raises(ValueError, match="in_features=8"):
        layer(torch.randn(2, 7))
    with pytest.raises(ValueError, match="divisible by 32"), te.autocast(recipe=recipe.MXFP8BlockScaling()):
        layer(torch.randn(2, 8))
