"""te.LayerNormMLP's fused act recompute (module/_operand.FUSE_ACT_RECOMPUTE).

Under per-tensor FP8 the backward needs act(h) quantized columnwise with the
scale forward used (fc2's wgrad operand; forward does not keep it). With the
switch on, the activation backward writes it in its own pass over h
(kernels.activation_bwd_fwd_columnwise); off, a separate pass recomputes it.
The bytes are the same either way, so two training steps (the second from the
first one's recipe state) must give bit-identical outputs, gradients of the
input and every parameter, and quantizer state.
"""

from __future__ import annotations

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.module import _operand

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]

RECIPES = pytest.mark.parametrize(
    "fp8_recipe",
    [recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.Float8CurrentScaling(use_power_2_scales=True)],
    ids=["delayed", "current", "current-pow2"],
)


def _make(activation, dtype, device, bias=True):
    layer = te.LayerNormMLP(64, 96, activation=activation, params_dtype=dtype, device=device, bias=bias)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            mean = 1.0 if name == "layer_norm_weight" else 0.0
            p.copy_((torch.randn(p.shape, generator=gen) * 0.4 + mean).to(p.dtype))
    return layer


def _input(shape, dtype, device, seed):
    """Rows of very different magnitudes (an amax far above most values)."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.tensor([1e-3, 1.0, 30.0, 1e3]).repeat(shape[0] // 4 + 1)[: shape[0], None]
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


def _steps(layer, x, dy, fp8_recipe, fused, monkeypatch, calls, x_grad=True):
    """(tensors of two steps, number of fused activation-backward calls)."""
    monkeypatch.setattr(_operand, "FUSE_ACT_RECOMPUTE", fused)
    calls.clear()
    results = []
    for step in range(2):
        xi = (x * (1 + step)).detach().clone().requires_grad_(x_grad)
        layer.zero_grad(set_to_none=True)
        with te.autocast(enabled=True, recipe=fp8_recipe):
            y = layer(xi)
        y.backward(dy)
        quantizers = [q for role in ("scaling_fwd", "scaling_bwd") for q in layer.quantizers[role]]
        state = [
            t.clone()
            for q in quantizers
            for t in (getattr(q, "scale", None), getattr(q, "amax", None))
            if t is not None
        ]
        grads = {name: p.grad for name, p in layer.named_parameters()}
        results.append(
            {"y": y.detach().clone(), "dx": xi.grad, **grads, **{f"state{i}": t for i, t in enumerate(state)}}
        )
    return results, len(calls)


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of the fused activation backward."""
    seen = []
    original = kernels.activation_bwd_fwd_columnwise

    def counted(*args, **kwargs):
        seen.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, "activation_bwd_fwd_columnwise", counted)
    return seen


# CUDA's reductions behind these (torch's sum for fc2's bias, the norm backward)
# may differ in the last FP32 bits from run to run of the same model (see
# test_layernorm_mlp_memory): on CUDA they are compared to 2^-19 of their
# magnitude, every other tensor (and all of them on the CPU) bit for bit.
_RUN_TO_RUN = ("dx", "layer_norm_weight", "layer_norm_bias", "fc2_bias")


def _assert_bit_identical(got, want):
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.keys() == b.keys()
        for name, u in a.items():
            v = b[name]
            if u is None or v is None:
                assert u is None and v is None, (step, name)
                continue
            assert u.dtype == v.dtype and u.shape == v.shape, (step, name)
            if u.is_cuda and name in _RUN_TO_RUN:
                assert (u.float() - v.float()).abs().max() <= 2.0**-19 * v.float().abs().max(), (step, name)
                continue
            assert torch.equal(u.view(torch.uint8), v.view(torch.uint8)), f"step {step}: {name} differs"


@RECIPES
@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_fused_recompute_is_bit_identical(device, fp8_recipe, activation, dtype, monkeypatch, calls):
    x = _input((48, 64), dtype, device, 3)
    dy = _input((48, 64), dtype, device, 4)
    fused, n_fused = _steps(_make(activation, dtype, device), x, dy, fp8_recipe, True, monkeypatch, calls)
    separate, n_separate = _steps(_make(activation, dtype, device), x, dy, fp8_recipe, False, monkeypatch, calls)
    assert (n_fused, n_separate) == (2, 0)  # the fused path ran (once per step), and only with the switch on
    _assert_bit_identical(fused, separate)


@pytest.mark.parametrize("fp8_recipe", [recipe.DelayedScaling(), recipe.Float8CurrentScaling()], ids=["delayed", "cur"])
def test_without_bias_and_input_gradient(device, fp8_recipe, monkeypatch, calls):
    """No fc1 bias gradient and no input gradient: the activation backward still
    runs (for fc1's wgrad) and writes fc2's operand."""
    x = _input((48, 64), torch.bfloat16, device, 5)
    dy = _input((48, 64), torch.bfloat16, device, 6)
    layers = [_make("swiglu", torch.bfloat16, device, bias=False) for _ in range(2)]
    for layer in layers:
        for p in layer.layer_norm_weight, layer.layer_norm_bias:
            p.requires_grad_(False)
    fused, n_fused = _steps(layers[0], x, dy, fp8_recipe, True, monkeypatch, calls, x_grad=False)
    separate, _ = _steps(layers[1], x, dy, fp8_recipe, False, monkeypatch, calls, x_grad=False)
    assert n_fused == 2
    _assert_bit_identical(fused, separate)


def test_block_recipes_keep_the_separate_pass(device, monkeypatch, calls):
    """MXFP8 / FP8 block / NVFP4 quantize act per block: the separate recompute stays."""
    layer = _make("swiglu", torch.float32, device)
    x = _input((32, 64), torch.float32, device, 7)
    _, n = _steps(layer, x, torch.ones(32, 64, device=device), recipe.MXFP8BlockScaling(), True, monkeypatch, calls)
    assert n == 0
