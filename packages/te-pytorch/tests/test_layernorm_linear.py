"""te.LayerNormLinear against a float64 torch composition (norm then linear).

Output bounds are elementwise (pt_helpers.matmul_bound) with the normalized
input's error as the left operand's: its FP32 evaluation (2^-20 relative),
its rounding to the compute dtype, and under FP8 its E4M3 quantization
(pt_norm_mlp_ref.fp8_ln_error). Gradients are checked norm-wise: 2^-16 in
FP32, 2^-5 in BF16 (a few roundings of 2^-8 through the GEMM and the norm's
backward), and under FP8 the path bound of pt_norm_mlp_ref.fp8_grad_bound
(E5M2 dy and one E4M3 operand per GEMM).
"""

from __future__ import annotations

import pytest
import torch
from pt_helpers import accumulation_u, assert_within, matmul_bound
from pt_norm_mlp_ref import U_OUT, fp8_grad_bound, fp8_ln_error, norm64, params64, rel_norm_error, run_module

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]

RECIPES = pytest.mark.parametrize(
    "fp8_recipe", [recipe.Float8CurrentScaling(), recipe.DelayedScaling()], ids=["current", "delayed"]
)
HP_GRAD = {torch.float32: 2.0**-16, torch.bfloat16: 2.0**-5}


def _make(normalization, dtype, device, zcg=False, in_features=48, **kw):
    layer = te.LayerNormLinear(
        in_features, 64, normalization=normalization, zero_centered_gamma=zcg, params_dtype=dtype, device=device, **kw
    )
    with torch.no_grad():  # non-trivial norm parameters and bias
        layer.layer_norm_weight.normal_(0.0 if zcg else 1.0, 0.3)
        if layer.layer_norm_bias is not None:
            layer.layer_norm_bias.normal_(0, 0.3)
        if layer.bias is not None:
            layer.bias.normal_()
    return layer


def _reference(layer, x, dy):
    p = params64(layer)
    x64 = x.detach().double().requires_grad_()
    rms = layer.normalization == "RMSNorm"
    ln = norm64(x64, p["layer_norm_weight"], p.get("layer_norm_bias"), layer.eps, layer.zero_centered_gamma, rms)
    y = ln @ p["weight"].T + p["bias"]
    y.backward(dy.double())
    return y.detach(), ln.detach(), x64.grad, p


def _check_grads(layer, dx, ref_dx, p, bound):
    assert rel_norm_error(dx, ref_dx) <= bound
    for name, param in layer.named_parameters():
        assert rel_norm_error(param.grad, p[name].grad) <= bound, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("zcg", [False, True])
def test_high_precision_matches_float64(device, dtype, normalization, zcg):
    layer = _make(normalization, dtype, device, zcg)
    x = (torch.randn(3, 5, 48, device=device) * 2 + 0.5).to(dtype)
    dy = torch.randn(3, 5, 64, device=device).to(dtype)
    y, dx = run_module(layer, x, dy)
    assert y.dtype == dtype and y.shape == (3, 5, 64)
    ref_y, ln, ref_dx, p = _reference(layer, x, dy)
    w, b = layer.weight.double(), layer.bias.double()
    e_ln = (2.0**-20 + U_OUT[dtype]) * ln.abs()
    bound = matmul_bound(ln.reshape(-1, 48), w, e_ln.reshape(-1, 48), torch.zeros_like(w), dtype)
    assert_within(y.reshape(-1, 64), ref_y.reshape(-1, 64), bound + U_OUT[dtype] * b.abs(), "y")
    _check_grads(layer, dx, ref_dx, p, HP_GRAD[dtype])


@RECIPES
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_fp8_matches_float64_within_format_bounds(device, fp8_recipe, normalization):
    dtype = torch.bfloat16
    layer = _make(normalization, dtype, device)
    x = (torch.randn(2, 24, 48, device=device) * 3).to(dtype)
    dy = torch.randn(2, 24, 64, device=device).to(dtype)
    if fp8_recipe.delayed():
        for _ in range(2):  # the history now holds these tensors' amaxes
            run_module(layer, x, dy, fp8_recipe)
    ref_y, ln, ref_dx, p = _reference(layer, x, dy)
    ln2, w = ln.reshape(-1, 48), layer.weight.double()
    if fp8_recipe.delayed():
        s_ln, s_w = (v.item() for v in layer.fp8_meta["scaling_fwd"].scale[:2])
    else:
        s_ln, s_w = 448.0 / ln2.abs().max().item(), 448.0 / w.abs().max().item()
    y, dx = run_module(layer, x, dy, fp8_recipe)
    e_ln, e_w = fp8_ln_error(ln2, s_ln, dtype), fp8_ln_error(w, s_w, torch.float32)
    bound = matmul_bound(ln2, w, e_ln, e_w, dtype, accumulation_u(device, False))
    assert_within(y.reshape(-1, 64), ref_y.reshape(-1, 64), bound + U_OUT[dtype] * layer.bias.double().abs(), "y")
    _check_grads(layer, dx, ref_dx, p, fp8_grad_bound(1, 1))


def test_delayed_scaling_norm_writes_the_fp8_gemm_input():
    layer = te.LayerNormLinear(64, 32, device="cpu")
    x = torch.randn(16, 64, requires_grad=True)
    saved = []
    with (
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
        te.autocast(recipe=recipe.DelayedScaling()),
    ):
        layer(x)
    # The norm's FP8 output was written with slot 0's scale and recorded its amax
    # (moved to the history's last row by the update at the autocast exit).
    ref_ln = norm64(x, layer.layer_norm_weight, layer.layer_norm_bias, layer.eps, False, False)
    amax = layer.fp8_meta["scaling_fwd"].amax_history[-1, 0].item()
    assert amax == pytest.approx(ref_ln.abs().max().item(), rel=1e-5)
    params = {p.data_ptr() for p in layer.parameters()}
    high = [t for t in saved if t.is_floating_point() and t.numel() > 16 and t.data_ptr() not in params]
    assert [tuple(t.shape) for t in high] == [(16, 64)]  # only the input x, for the norm's backward
    assert sorted(tuple(t.shape) for t in saved if t.dtype == torch.uint8) == [(64, 16), (64, 32)]


@pytest.mark.parametrize("fp8_recipe", [None, recipe.Float8CurrentScaling(), recipe.DelayedScaling()])
def test_return_conventions_and_the_layernorm_output(fp8_recipe):
    layer = _make("LayerNorm", torch.float32, "cpu", return_bias=True, return_layernorm_output=True)
    x = torch.randn(16, 48, requires_grad=True)
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        out, bias, ln_out = layer(x)
    assert bias is layer.bias and out.shape == (16, 64) and ln_out.shape == (16, 48)
    ref_ln = norm64(x, layer.layer_norm_weight, layer.layer_norm_bias, layer.eps, False, False)
    torch.testing.assert_close(ln_out.double(), ref_ln, rtol=2e-6, atol=2e-6)
    # The returned normalized input is differentiable: its gradient reaches x.
    ln_out.sum().backward()
    x64 = x.detach().double().requires_grad_()
    norm64(
        x64, layer.layer_norm_weight.double(), layer.layer_norm_bias.double(), layer.eps, False, False
    ).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    gathered = te.LayerNormLinear(48, 64, return_layernorm_output_gathered=True, device="cpu")
    assert len(gathered(x)) == 2
    plain = te.LayerNormLinear(48, 64, device="cpu")
    assert isinstance(plain(x), torch.Tensor)


def test_parameter_names_shapes_and_init():
    ln = te.LayerNormLinear(32, 48, device="cpu")
    assert [(n, tuple(p.shape)) for n, p in ln.named_parameters()] == [
        ("layer_norm_weight", (32,)),
        ("layer_norm_bias", (32,)),
        ("weight", (48, 32)),
        ("bias", (48,)),
    ]
    assert torch.all(ln.layer_norm_weight == 1) and torch.all(ln.layer_norm_bias == 0)
    rms = te.LayerNormLinear(32, 48, normalization="RMSNorm", zero_centered_gamma=True, bias=False, device="cpu")
    assert [n for n, _ in rms.named_parameters()] == ["layer_norm_weight", "weight"]
    assert rms.layer_norm_bias is None and rms.bias is None and torch.all(rms.layer_norm_weight == 0)
    split = te.LayerNormLinear(32, 48, parameters_split=("query", "key", "value"), device="cpu")
    assert [n for n, _ in split.named_parameters()][:3] == ["layer_norm_weight", "layer_norm_bias", "query_weight"]


@pytest.mark.parametrize("fp8_recipe", [None, recipe.Float8CurrentScaling()])
def test_fuse_wgrad_accumulation(device, fp8_recipe):
    layer = te.LayerNormLinear(32, 48, fuse_wgrad_accumulation=True, device=device)
    reference = te.LayerNormLinear(32, 48, device=device)
    reference.load_state_dict(layer.state_dict())
    layer.weight.main_grad = torch.zeros_like(layer.weight, dtype=torch.float32)
    x, dy = torch.randn(16, 32, device=device), torch.randn(16, 48, device=device)
    for _ in range(2):
        run_module(layer, x, dy, fp8_recipe)
    run_module(reference, x, dy, fp8_recipe)
    assert layer.weight.grad is None and layer.weight.grad_added_to_main_grad
    torch.testing.assert_close(layer.weight.main_grad, 2 * reference.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.layer_norm_weight.grad, reference.layer_norm_weight.grad)


def test_checkpoint_roundtrip_and_meta_device():
    layer = te.LayerNormLinear(32, 48, normalization="RMSNorm", device="cpu")
    x = torch.randn(16, 32)
    for _ in range(2):
        with te.autocast(recipe=recipe.DelayedScaling()):
            layer(x).sum().backward()
    state = layer.state_dict()
    assert "_extra_state" in state
    fresh = te.LayerNormLinear(32, 48, normalization="RMSNorm", device="meta")
    assert fresh.weight.device.type == "meta" and fresh.layer_norm_weight.device.type == "meta"
    fresh.reset_parameters()
    assert torch.all(fresh.layer_norm_weight == 1)
    fresh.load_state_dict(state)
    for key in ("scaling_fwd", "scaling_bwd"):
        # (.cpu(): reset_parameters materializes a meta module on the default device, CUDA when present)
        assert torch.equal(fresh.fp8_meta[key].scale.cpu(), layer.fp8_meta[key].scale)
        assert torch.equal(fresh.fp8_meta[key].amax_history.cpu(), layer.fp8_meta[key].amax_history)
    with torch.no_grad(), te.autocast(recipe=recipe.DelayedScaling()):
        device = fresh.weight.device  # (the same device for both: CPU and CUDA GEMMs round differently)
        assert torch.equal(fresh(x.to(device)), layer.to(device)(x.to(device)))


def test_is_first_microbatch_caches_the_fp8_weight():
    layer = te.LayerNormLinear(32, 48, device="cpu")
    x = torch.randn(16, 32)
    with torch.no_grad(), te.autocast(recipe=recipe.Float8CurrentScaling()):
        first = layer(x, is_first_microbatch=True)
        layer.weight.mul_(2)  # not seen by the next microbatch: the cached FP8 weight is used
        assert torch.equal(layer(x, is_first_microbatch=False), first)
        assert not torch.equal(layer(x, is_first_microbatch=True), first)


@pytest.mark.parametrize(
    "kwargs",
    [{"sequence_parallel": True}, {"tp_size": 2}, {"ub_overlap_ag": True}, {"delay_wgrad_compute": True}],
)
def test_parallel_and_overlap_arguments_are_not_yet_supported(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(NotImplementedError, match=f"te.LayerNormLinear: {name}=.* is not yet supported"):
        te.LayerNormLinear(32, 48, device="cpu", **kwargs)


BLOCK_RECIPES = pytest.mark.parametrize(
    "fp8_recipe",
    [recipe.MXFP8BlockScaling(), recipe.Float8BlockScaling(), recipe.NVFP4BlockScaling()],
    ids=["mxfp8", "fp8_block", "nvfp4"],
)


@BLOCK_RECIPES
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_block_recipes_equal_norm_then_linear(device, fp8_recipe, normalization):
    """Under the block recipes the norm writes high precision and te.Linear's
    quantizers take it from there, so LayerNormLinear is exactly te.LayerNorm /
    te.RMSNorm followed by te.Linear with the same parameters (te.Linear's own
    accuracy under each recipe is tested in test_block_linear.py)."""
    torch.manual_seed(7)
    layer = _make(normalization, torch.float32, device, in_features=64)
    norm_cls = te.LayerNorm if normalization == "LayerNorm" else te.RMSNorm
    norm = norm_cls(64, eps=layer.eps, device=device)
    linear = te.Linear(64, 64, device=device)
    with torch.no_grad():
        norm.weight.copy_(layer.layer_norm_weight)
        if normalization == "LayerNorm":
            norm.bias.copy_(layer.layer_norm_bias)
        linear.weight.copy_(layer.weight)
        linear.bias.copy_(layer.bias)
    x = torch.randn(64, 64, device=device)
    dy = torch.randn(64, 64, device=device)
    outs, grads = [], []
    for run in (layer, lambda t: linear(norm(t))):
        xi = x.clone().requires_grad_()
        torch.manual_seed(11)  # (NVFP4's stochastic rounding draws from torch's generator)
        with te.autocast(recipe=fp8_recipe):
            y = run(xi)
        y.backward(dy)
        outs.append(y.detach())
        grads.append(xi.grad)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(grads[0], grads[1])
    assert torch.equal(layer.weight.grad, linear.weight.grad)
    assert torch.equal(layer.layer_norm_weight.grad, norm.weight.grad)


def test_error_messages():
    with pytest.raises(ValueError, match="normalization must be 'LayerNorm' or 'RMSNorm', got 'BatchNorm'"):
        te.LayerNormLinear(32, 48, normalization="BatchNorm", device="cpu")
    layer = te.LayerNormLinear(32, 48, device="cpu")
    with pytest.raises(ValueError, match=r"te.LayerNormLinear: input must have shape \[..., in_features=32\]"):
        layer(torch.randn(4, 31))
    with pytest.raises(TypeError, match="te.LayerNormLinear: input dtype torch.float64 is not supported"):
        layer(torch.randn(4, 32, dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="fp8_output and fp8_grad are not yet supported"):
        layer(torch.randn(4, 32), fp8_output=True)
    with pytest.raises(
        ValueError, match="te.LayerNormLinear under FP8 quantization: FP8 GEMMs need the number of tokens"
    ):
        with te.autocast(recipe=recipe.DelayedScaling()):
            layer(torch.randn(5, 32))
    with pytest.raises(ValueError, match="te.LayerNormLinear under MXFP8 quantization"):
        with te.autocast(recipe=recipe.MXFP8BlockScaling()):
            layer(torch.randn(16, 32))
