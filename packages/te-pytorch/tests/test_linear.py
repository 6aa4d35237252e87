"""te.Linear against float64 torch, in high precision and under FP8 recipes.

Bounds (pt_helpers.matmul_bound, elementwise): FP32 accumulation K 2^-24 and
the output rounding (2^-24 FP32, 2^-8 BF16). Under FP8 each operand adds its
quantization error (pt_helpers.fp8_error): 2^-4 relative for E4M3 and 2^-3
for E5M2 (round to nearest even with 3 / 2 mantissa bits), plus half a
subnormal step divided by the scale. fprop is E4M3 x E4M3; dgrad and wgrad
use E5M2 gradients (Format.HYBRID).
"""

from __future__ import annotations

import pytest
import torch
from pt_helpers import (
    accumulation_u,
    assert_within,
    cuda_ready,
    fp8_error,
    matmul_bound,
)

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core.testing.tolerances import unit_roundoffs
from transformer_engine.pytorch.module import base

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]

U_OUT = unit_roundoffs(torch.float32, torch.bfloat16)


def _zero(t):
    return torch.zeros_like(t, dtype=torch.float64)


def _run(layer, x, dy, fp8_recipe=None, **kwargs):
    x = x.detach().clone().requires_grad_()
    layer.zero_grad(set_to_none=True)
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        out = layer(x, **kwargs)
    y = out[0] if isinstance(out, tuple) else out
    y.backward(dy)
    return out, x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_high_precision_matches_float64(device, dtype, bias):
    layer = te.Linear(37, 23, bias=bias, params_dtype=dtype, device=device)
    if bias:
        with torch.no_grad():
            layer.bias.normal_()
    x = torch.randn(3, 5, 37, device=device).to(dtype)
    dy = torch.randn(3, 5, 23, device=device).to(dtype)
    y, dx = _run(layer, x, dy)
    assert y.dtype == dtype and y.shape == (3, 5, 23)
    x2, w, dy2 = x.reshape(-1, 37).double(), layer.weight.double(), dy.reshape(-1, 23).double()
    b = layer.bias.double() if bias else torch.zeros(23, dtype=torch.float64, device=device)
    bound = matmul_bound(x2, w, _zero(x2), _zero(w), dtype) + U_OUT[dtype] * b.abs()
    assert_within(y.reshape(-1, 23), x2 @ w.T + b, bound, "y")
    assert_within(dx.reshape(-1, 37), dy2 @ w, matmul_bound(dy2, w.T, _zero(dy2), _zero(w.T), dtype), "dx")
    assert_within(layer.weight.grad, dy2.T @ x2, matmul_bound(dy2.T, x2.T, _zero(dy2.T), _zero(x2.T), dtype), "dW")
    if bias:
        db_bound = 15 * 2.0**-24 * dy2.abs().sum(0) + U_OUT[dtype] * dy2.sum(0).abs()
        assert_within(layer.bias.grad, dy2.sum(0), db_bound, "db")


def _fp8_scales(layer, fp8_recipe, x, w, dy):
    """(scale_x, scale_w, scale_dy) the next FP8 step quantizes with."""
    if fp8_recipe.delayed():
        fwd, bwd = layer.fp8_meta["scaling_fwd"].scale, layer.fp8_meta["scaling_bwd"].scale
        return fwd[0].item(), fwd[1].item(), bwd[0].item()
    return (448.0 / x.abs().max().item(), 448.0 / w.abs().max().item(), 57344.0 / dy.abs().max().item())


@pytest.mark.parametrize(
    "fp8_recipe", [recipe.Float8CurrentScaling(), recipe.DelayedScaling()], ids=["current", "delayed"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# The reference's rule (tokens and out_features by 8, in_features by 16): the
# second and third shapes break te_gemm's multiple-of-16 rule in M, N and K of
# the three GEMMs, so they run zero-padded (kernels/gemm.py) and must still
# meet the unpadded bounds.
@pytest.mark.parametrize(
    "lead, k, n", [((2, 24), 48, 64), ((1, 8), 48, 24), ((2, 4), 32, 40)], ids=["48tok", "8tok", "8tok-n40"]
)
def test_fp8_matches_float64_within_format_bounds(device, fp8_recipe, dtype, lead, k, n):
    layer = te.Linear(k, n, params_dtype=dtype, device=device)
    with torch.no_grad():
        layer.bias.normal_()
    x = (torch.randn(*lead, k, device=device) * 3).to(dtype)
    dy = torch.randn(*lead, n, device=device).to(dtype)
    if fp8_recipe.delayed():
        for _ in range(2):  # two steps: the history now holds these tensors' amaxes
            _run(layer, x, dy, fp8_recipe)
    x2, w, dy2 = x.reshape(-1, k).double(), layer.weight.double(), dy.reshape(-1, n).double()
    s_x, s_w, s_dy = _fp8_scales(layer, fp8_recipe, x2, w, dy2)
    y, dx = _run(layer, x, dy, fp8_recipe)
    e_x, e_w, e_dy = fp8_error(x2, "e4m3", s_x), fp8_error(w, "e4m3", s_w), fp8_error(dy2, "e5m2", s_dy)
    b = layer.bias.double()
    acc_u = accumulation_u(device, False)  # both recipes' fprop: split accumulator off
    assert_within(
        y.reshape(-1, n), x2 @ w.T + b, matmul_bound(x2, w, e_x, e_w, dtype, acc_u) + U_OUT[dtype] * b.abs(), "FP8 y"
    )
    assert_within(dx.reshape(-1, k), dy2 @ w, matmul_bound(dy2, w.T, e_dy, e_w.T, dtype), "FP8 dx")
    assert_within(layer.weight.grad, dy2.T @ x2, matmul_bound(dy2.T, x2.T, e_dy.T, e_x.T, dtype), "FP8 dW")
    # The bias gradient is summed from the high-precision dy.
    db_bound = 50 * 2.0**-24 * dy2.abs().sum(0) + U_OUT[dtype] * dy2.sum(0).abs()
    assert_within(layer.bias.grad, dy2.sum(0), db_bound, "db")


def test_backward_saves_fp8_bytes_not_the_input():
    layer = te.Linear(64, 32, device="cpu")
    x = torch.randn(16, 64, requires_grad=True)
    saved = []
    with (
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
        te.autocast(recipe=recipe.Float8CurrentScaling()),
    ):
        layer(x)
    assert saved, "nothing saved for backward"
    for t in saved:
        assert t.dtype == torch.uint8 or t.numel() == 1, (t.dtype, t.shape)
    # The columnwise (transposed) FP8 copies of x [16, 64] and W [32, 64].
    assert sorted(tuple(t.shape) for t in saved if t.dtype == torch.uint8) == [(64, 16), (64, 32)]


@pytest.mark.parametrize(
    "fp8_recipe", [recipe.Float8CurrentScaling(), recipe.DelayedScaling()], ids=["current", "delayed"]
)
def test_frozen_weight_and_bias_only_gradients(device, fp8_recipe):
    layer = te.Linear(32, 16, device=device)
    layer.weight.requires_grad_(False)
    dy = torch.randn(16, 16, device=device)
    for x_grad in (True, False):
        x = torch.randn(16, 32, device=device, requires_grad=x_grad)
        with te.autocast(recipe=fp8_recipe):
            y = layer(x)
        y.backward(dy)
        assert layer.weight.grad is None and (x.grad is not None) == x_grad
        torch.testing.assert_close(layer.bias.grad, dy.sum(0), rtol=1e-5, atol=1e-5)
        layer.bias.grad = None


def test_return_bias_and_no_bias(device):
    layer = te.Linear(16, 32, return_bias=True, device=device)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(4, 16, device=device)
    out, bias = layer(x)
    assert bias is layer.bias
    torch.testing.assert_close(out, x @ layer.weight.T, rtol=1e-5, atol=1e-5)
    no_bias = te.Linear(16, 32, bias=False, device=device)
    assert no_bias.bias is None and "bias" not in dict(no_bias.named_parameters())


@pytest.mark.parametrize("split", [("query_", "key_", "value_"), {"query": 24, "key": 16, "value": 8}])
def test_parameters_split(device, split):
    layer = te.Linear(16, 48, parameters_split=split, device=device)
    names = [n for n, _ in layer.named_parameters()]
    assert names == ["query_weight", "query_bias", "key_weight", "key_bias", "value_weight", "value_bias"]
    sizes = [p.shape[0] for n, p in layer.named_parameters() if n.endswith("weight")]
    assert sizes == ([16, 16, 16] if isinstance(split, tuple) else [24, 16, 8])
    weight = layer._weight_tensor()
    assert weight.data_ptr() == layer.query_weight.data_ptr()  # a view, not a copy
    plain = torch.nn.Linear(16, 48).to(device)
    with torch.no_grad():
        plain.weight.copy_(weight)
        plain.bias.copy_(layer._bias_tensor())
    x = torch.randn(8, 16, device=device)
    dy = torch.randn(8, 48, device=device)
    y = layer(x)
    y.backward(dy)
    torch.testing.assert_close(y, plain(x), rtol=1e-5, atol=1e-5)
    offset = 0
    for name, size in zip(("query", "key", "value"), sizes):
        torch.testing.assert_close(
            getattr(layer, f"{name}_weight").grad, dy[:, offset : offset + size].T @ x, rtol=1e-5, atol=1e-5
        )
        offset += size
    with pytest.raises(ValueError, match="must add up to out_features"):
        te.Linear(16, 64, parameters_split={"a": 10, "b": 10}, device=device)


@pytest.mark.parametrize("fp8_recipe", [None, recipe.Float8CurrentScaling()], ids=["hp", "fp8"])
def test_fuse_wgrad_accumulation(device, fp8_recipe):
    layer = te.Linear(32, 16, fuse_wgrad_accumulation=True, device=device)
    layer.weight.main_grad = torch.zeros(16, 32, device=device)
    x = torch.randn(16, 32, device=device)
    dy = torch.randn(16, 16, device=device)
    for _ in range(2):
        _run(layer, x, dy, fp8_recipe)
    assert layer.weight.grad is None and layer.weight.grad_added_to_main_grad
    reference = te.Linear(32, 16, device=device)
    reference.load_state_dict(layer.state_dict())
    _run(reference, x, dy, fp8_recipe)
    torch.testing.assert_close(layer.weight.main_grad, 2 * reference.weight.grad, rtol=1e-5, atol=1e-5)
    layer.weight.overwrite_main_grad = True
    _run(layer, x, dy, fp8_recipe)
    torch.testing.assert_close(layer.weight.main_grad, reference.weight.grad, rtol=1e-6, atol=1e-6)
    assert layer.bias.grad is not None


def test_meta_device_and_reset_parameters(monkeypatch):
    layer = te.Linear(512, 256, device="meta")
    assert layer.weight.device.type == "meta" and layer.bias.device.type == "meta"
    monkeypatch.setattr(base, "_WARNED_CPU_FALLBACK", True)
    layer.reset_parameters()
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert layer.weight.device.type == expected
    assert abs(layer.weight.mean().item()) < 1e-3
    assert abs(layer.weight.std().item() - 0.023) < 1e-3
    assert torch.equal(layer.bias, torch.zeros_like(layer.bias))


def test_default_device_falls_back_to_cpu_once(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the default device is cuda")
    monkeypatch.setattr(base, "_WARNED_CPU_FALLBACK", False)
    with pytest.warns(UserWarning, match="CUDA is not available"):
        layer = te.Linear(16, 16)
    assert layer.weight.device.type == "cpu" and layer.weight.dtype == torch.get_default_dtype()


def test_is_first_microbatch_caches_the_fp8_weight(device):
    layer = te.Linear(32, 32, device=device)
    x = torch.randn(16, 32, device=device)
    fp8_recipe = recipe.Float8CurrentScaling()
    with te.autocast(recipe=fp8_recipe):
        first = layer(x, is_first_microbatch=True)
        with torch.no_grad():
            layer.weight.mul_(2)
        cached = layer(x, is_first_microbatch=False)
        fresh = layer(x, is_first_microbatch=True)
    assert torch.equal(first, cached) and not torch.equal(first, fresh)


def test_torch_autocast_output_dtype_and_param_grads():
    layer = te.Linear(32, 16, device="cpu")
    x = torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and layer.bias.grad.dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sequence_parallel": True},
        {"tp_size": 2},
        {"ub_overlap_ag": True},
        {"delay_wgrad_compute": True},
        {"symmetric_ar_type": "one_shot"},
        {"save_original_input": True},
    ],
)
def test_parallel_and_overlap_arguments_are_not_yet_supported(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(NotImplementedError, match=f"{name}=.* is not yet supported"):
        te.Linear(16, 16, device="cpu", **kwargs)
    te.Linear(16, 16, device="cpu", parallel_mode="column", ub_name="qkv", name="proj", get_rng_state_tracker=None)
    with pytest.raises(ValueError, match="parallel_mode must be"):
        te.Linear(16, 16, device="cpu", parallel_mode="diagonal")


def test_error_messages():
    layer = te.Linear(48, 32, device="cpu")
    with (
        te.autocast(recipe=recipe.Float8CurrentScaling()),
        pytest.raises(ValueError, match=r"tokens .*divisible by 8.*got tokens=10.*Pad the sequence"),
    ):
        layer(torch.randn(2, 5, 48))
    with pytest.raises(TypeError, match="input dtype torch.float64 is not supported"):
        layer(torch.randn(4, 48, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"shape \[..., in_features=48\]"):
        layer(torch.randn(4, 40))
    with pytest.raises(NotImplementedError, match="fp8_output and fp8_grad are not yet supported"):
        layer(torch.randn(16, 48), fp8_output=True)
    with pytest.raises(ValueError, match="input is on meta but the weight is on cpu"):
        layer(torch.randn(16, 48, device="meta"))


def test_parameters_split_under_compile():
    torch._dynamo.reset()
    layer = te.Linear(16, 48, parameters_split=("q", "k", "v"), device="cpu")
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(16, 16)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        assert torch.equal(compiled(x), layer(x))
    torch._dynamo.reset()


@pytest.mark.gpu
def test_device_mismatch_is_named_and_state_follows_moves():
    if not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    layer = te.Linear(16, 16, device="cuda")
    with pytest.raises(ValueError, match="input is on cpu but the weight is on cuda"):
        layer(torch.randn(16, 16))
    # FP8 state built on the CPU follows the module to the GPU, values kept.
    moving = te.Linear(16, 16, device="cpu")
    x = torch.randn(16, 16)
    with te.autocast(recipe=recipe.DelayedScaling()):
        expected = moving(x)
    history = moving.fp8_meta["scaling_fwd"].amax_history.clone()
    moving.cuda()
    with te.autocast(recipe=recipe.DelayedScaling()):
        got = moving(x.cuda())
    assert moving.fp8_meta["scaling_fwd"].amax_history.device.type == "cuda"
    assert torch.equal(moving.fp8_meta["scaling_fwd"].amax_history[1:-1].cpu(), history[2:])
    assert got.device.type == "cuda" and expected.shape == got.shape
