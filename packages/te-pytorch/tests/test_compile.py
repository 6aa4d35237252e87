"""torch.compile(fullgraph=True) through the torch.ops.te operators.

The compiled model runs the same te-core kernels as eager mode, so outputs and
gradients are bit-identical with backend="aot_eager". One test uses the
default inductor backend (it compiles C++ on the CPU: slow, so the model is
small). Linear, LayerNormLinear and LayerNormMLP compile under
Float8CurrentScaling and every block recipe (NVFP4's stochastic rounding of
the gradients draws from torch's generator, seeded alike for both runs).
DelayedScaling refuses torch.compile with a clear message, as the reference
does: its state is updated outside the graph.
"""

from __future__ import annotations

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(device):
    return torch.nn.Sequential(
        te.LayerNorm(32, device=device),
        te.Linear(32, 64, device=device),
        torch.nn.GELU(),
        te.Linear(64, 32, device=device),
        te.RMSNorm(32, device=device),
    )


def _norm_model(device):
    return torch.nn.Sequential(
        te.LayerNormLinear(64, 64, device=device),
        torch.nn.GELU(),
        te.Linear(64, 64, device=device),
        te.LayerNormMLP(64, 64, normalization="RMSNorm", activation="swiglu", device=device),
    )


def _step(model, x, fp8_recipe):
    x = x.detach().clone().requires_grad_()
    for p in model.parameters():
        p.grad = None
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        y = model(x)
    y.square().sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize(
    "fp8_recipe",
    [None, recipe.Float8CurrentScaling(), recipe.Float8CurrentScaling(use_power_2_scales=True)],
    ids=["high_precision", "current", "current_pow2"],
)
def test_fullgraph_matches_eager(device, fp8_recipe):
    model = _model(device)
    x = torch.randn(2, 16, 32, device=device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for _ in range(2):  # the first call traces, the second runs the cached graph
        got = _step(compiled, x, fp8_recipe)
        expected = _step(model, x, fp8_recipe)
        for a, b in zip(got, expected):
            assert torch.equal(a, b)


def test_autocast_inside_the_compiled_function():
    model = _model("cpu")
    fp8_recipe = recipe.Float8CurrentScaling()

    def forward(x):
        with te.autocast(recipe=fp8_recipe):
            return model(x)

    x = torch.randn(16, 32)
    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), forward(x))
    assert te.FP8GlobalStateManager.autocast_depth == 0


def test_inductor_backend():
    layer = te.Linear(32, 16, device="cpu")
    x = torch.randn(16, 32)
    compiled = torch.compile(layer, fullgraph=True)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        got = compiled(x)
        expected = layer(x)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("make", [_model, _norm_model], ids=["linear", "norm_modules"])
def test_delayed_scaling_is_refused_with_a_clear_message(make):
    model = make("cpu")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    width = model[0].in_features if hasattr(model[0], "in_features") else 32
    with (
        pytest.raises(RuntimeError, match="DelayedScaling cannot run under torch.compile"),
        te.autocast(recipe=recipe.DelayedScaling()),
    ):
        compiled(torch.randn(16, width))


def test_recipe_change_recompiles():
    model = _model("cpu")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(16, 32)
    for fp8_recipe in (recipe.Float8CurrentScaling(), recipe.Float8CurrentScaling(use_power_2_scales=True)):
        with te.autocast(recipe=fp8_recipe):
            got = compiled(x)
        assert model[1].fp8_meta["recipe"] == fp8_recipe
        with te.autocast(recipe=fp8_recipe):
            assert torch.equal(got, model(x))


def _seeded_step(model, x, fp8_recipe):
    torch.manual_seed(5)  # (NVFP4 rounds the gradients stochastically)
    return _step(model, x, fp8_recipe)


@pytest.mark.filterwarnings("ignore:.*emulated:UserWarning")
@pytest.mark.parametrize(
    "fp8_recipe",
    [
        None,
        recipe.Float8CurrentScaling(),
        recipe.MXFP8BlockScaling(),
        recipe.Float8BlockScaling(),
        recipe.NVFP4BlockScaling(),
    ],
    ids=["high_precision", "current", "mxfp8", "fp8_block", "nvfp4"],
)
def test_norm_modules_fullgraph_match_eager(device, fp8_recipe):
    """Linear, LayerNormLinear and LayerNormMLP under every recipe torch.compile supports."""
    model = _norm_model(device)
    x = torch.randn(2, 32, 64, device=device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        got = _seeded_step(compiled, x, fp8_recipe)
        expected = _seeded_step(model, x, fp8_recipe)
        for a, b in zip(got, expected):
            assert torch.equal(a, b)


def test_kernel_functions_return_none_for_absent_outputs_when_compiled():
    """The te_op placeholders (outputs not produced) come back as None from the
    public functions under torch.compile, as in eager mode; the block GEMM's
    path (eager-only information) is None there."""
    from transformer_engine.pytorch import kernels

    x, gamma = torch.randn(5, 32), torch.randn(32)
    w = kernels.quantize_mxfp8(torch.randn(16, 32), 7, True, False)
    q = kernels.quantize_mxfp8(x.repeat(7, 1)[:32], 7, True, False)

    def f(x):
        norm = kernels.rmsnorm_fwd(x, gamma, 1e-5)
        act = kernels.activation_fwd(norm[0], "gelu")
        block = kernels.gemm_block((q[0], 4, 7, q[1], None, False), (w[0], 4, 7, w[1], None, False))
        return norm, act, block

    eager = f(x)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    assert eager[2][1] == "emulated" and compiled[2][1] is None
    for got, expected in zip((*compiled[0], *compiled[1], compiled[2][0]), (*eager[0], *eager[1], eager[2][0])):
        assert (got is None) == (expected is None)
        assert got is None or torch.equal(got, expected)
