"""Current scaling with the amax fused into the producing kernels.

Under Float8CurrentScaling, LayerNormLinear and LayerNormMLP take the amax of
the norm output, the activation output and the activation gradient from the
kernels that write them (module/_operand.fused_amax) instead of a separate
pass. The kernels' amax is that of the stored values, so the fused path must
equal the unfused one (FUSE_AMAX = False) bit for bit: outputs, every
gradient, and every quantizer's scale and amax after each step. The count of
full current-scaling quantizations (each with its own amax pass) shows the
separate passes are gone.
"""

from __future__ import annotations

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.module import _operand
from transformer_engine.pytorch.tensor import float8_tensor

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.norm, pytest.mark.module]

RECIPES = pytest.mark.parametrize(
    "fp8_recipe",
    [recipe.Float8CurrentScaling(), recipe.Float8CurrentScaling(use_power_2_scales=True)],
    ids=["current", "current-pow2"],
)


def _init(layer, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            mean = 1.0 if name == "layer_norm_weight" else 0.0
            p.copy_((torch.randn(p.shape, generator=gen) * 0.4 + mean).to(p.dtype))
    return layer


def _step(layer, x, dy, fp8_recipe, fused, monkeypatch, counter):
    """(outputs, grads, quantizer state, full current-scaling quantizations) of one step."""
    monkeypatch.setattr(_operand, "FUSE_AMAX", fused)
    counter.clear()
    x = x.detach().clone().requires_grad_()
    layer.zero_grad(set_to_none=True)
    with te.autocast(enabled=True, recipe=fp8_recipe):
        out = layer(x)
    outs = out if isinstance(out, tuple) else (out,)
    outs[0].backward(dy)
    grads = [x.grad] + [p.grad for _, p in layer.named_parameters()]
    state = [
        (q.scale.clone(), q.amax.clone()) for role in ("scaling_fwd", "scaling_bwd") for q in layer.quantizers[role]
    ]
    return [o.detach().clone() for o in outs], grads, state, len(counter)


@pytest.fixture
def counter(monkeypatch):
    """Counts the quantizer fast path's full current-scaling quantizations (amax pass included)."""
    calls = []
    original = float8_tensor.quantize_fp8_current_scaling_prepared

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(float8_tensor, "quantize_fp8_current_scaling_prepared", counted)
    return calls


def _assert_bit_identical(a, b, what):
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
        if u is None or v is None:
            assert u is None and v is None, f"{what}[{i}]"
            continue
        assert u.dtype == v.dtype and u.shape == v.shape, f"{what}[{i}]"
        assert torch.equal(u.view(torch.uint8), v.view(torch.uint8)), f"{what}[{i}] differs"


def _compare(make, x, dy, fp8_recipe, monkeypatch, counter, passes_saved):
    fused_layer, plain_layer = make(), make()
    for step in range(2):  # the second step starts from the first one's quantizer state
        xs = x * (1 + step)  # another amax per step
        f_out, f_grads, f_state, f_calls = _step(fused_layer, xs, dy, fp8_recipe, True, monkeypatch, counter)
        p_out, p_grads, p_state, p_calls = _step(plain_layer, xs, dy, fp8_recipe, False, monkeypatch, counter)
        _assert_bit_identical(f_out, p_out, f"step {step} outputs")
        _assert_bit_identical(f_grads, p_grads, f"step {step} gradients")
        _assert_bit_identical([t for s in f_state for t in s], [t for s in p_state for t in s], f"step {step} state")
        assert p_calls - f_calls == passes_saved, (p_calls, f_calls)


def _hostile_input(shape, dtype, device, seed):
    """Rows of very different magnitudes (an amax far above most values), exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    x = (
        torch.randn(shape, generator=gen)
        * torch.tensor([1e-3, 1.0, 30.0, 1e3]).repeat(shape[0] // 4 + 1)[: shape[0], None]
    )
    x[torch.rand(shape, generator=gen) < 0.05] = 0.0
    return x.to(dtype).to(device)


@RECIPES
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("return_ln", [False, True], ids=["", "return_ln"])
def test_layernorm_linear_fused_amax_is_bit_identical(
    device, fp8_recipe, dtype, normalization, return_ln, monkeypatch, counter
):
    hidden, out_features, tokens = 64, 48, 48

    def make():
        layer = te.LayerNormLinear(
            hidden,
            out_features,
            normalization=normalization,
            params_dtype=dtype,
            device=device,
            return_layernorm_output=return_ln,
        )
        return _init(layer, 7)

    x = _hostile_input((tokens, hidden), dtype, device, 1)
    dy = _hostile_input((tokens, out_features), dtype, device, 2)
    # The norm's amax pass (when the quantizer records its state: on its own device).
    _compare(make, x, dy, fp8_recipe, monkeypatch, counter, passes_saved=1)


@RECIPES
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("activation", ["swiglu", "gelu", "srelu"])
@pytest.mark.parametrize("fuse_recompute", [True, False], ids=["", "sep-recompute"])
def test_layernorm_mlp_fused_amax_is_bit_identical(
    device, fp8_recipe, dtype, activation, fuse_recompute, monkeypatch, counter
):
    hidden, ffn, tokens = 64, 96, 48
    monkeypatch.setattr(_operand, "FUSE_ACT_RECOMPUTE", fuse_recompute)

    def make():
        layer = te.LayerNormMLP(hidden, ffn, activation=activation, params_dtype=dtype, device=device)
        return _init(layer, 11)

    x = _hostile_input((tokens, hidden), dtype, device, 3)
    dy = _hostile_input((tokens, hidden), dtype, device, 4)
    # The norm output, the activation output (forward, and again for fc2's wgrad unless the
    # activation backward writes that operand: FUSE_ACT_RECOMPUTE) and its gradient.
    _compare(make, x, dy, fp8_recipe, monkeypatch, counter, passes_saved=3 if fuse_recompute else 4)


def test_other_quantizers_take_no_fused_amax(device):
    """Delayed scaling fuses its quantization into the kernels instead; the block formats
    quantize per block: neither asks the kernels for a whole-tensor amax."""
    x = torch.ones(4, 16, device=device)
    delayed = float8_tensor.Float8Quantizer(
        torch.ones(1, device=device), torch.zeros(1, device=device), te.DType.kFloat8E4M3
    )
    assert _operand.fused_amax(delayed, x) is None
    current = float8_tensor.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, device)
    current.amax.fill_(5.0)
    buf = _operand.fused_amax(current, x)
    assert buf is current.amax and buf.item() == 0.0  # zeroed: the kernel max-accumulates into it
    current.use_existing_amax = True
    assert _operand.fused_amax(current, x) is None
