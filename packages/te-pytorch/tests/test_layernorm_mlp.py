"""te.LayerNormMLP against a float64 torch composition (norm, fc1, activation, fc2).

Output bounds are elementwise, propagated stage by stage from the float64
intermediates: the normalized input's error (pt_norm_mlp_ref.fp8_ln_error or
its FP32/dtype rounding), fc1 by pt_helpers.matmul_bound, the activation by
its local Lipschitz constant (|f'| <= 1.13 + 2|h| over the inputs' error
interval covers every kind: gelu-tanh 1.13, silu, qgelu, relu, srelu 2|h|,
clamped_swiglu 1 + alpha|c|/4) plus its FP32 evaluation, rounding and E4M3
quantization, then fc2 by matmul_bound again. Gradients are checked
norm-wise: 2^-16 (FP32), 2^-5 (BF16; not for the kinked activations, see
the test), and under FP8 the path bound
pt_norm_mlp_ref.fp8_grad_bound with two E5M2 gradients and two E4M3 operands.
Under Float8CurrentScaling and the block recipes the module is shown to equal
te.LayerNorm/RMSNorm -> te.Linear -> activation -> te.Linear exactly (whose
accuracy per recipe test_linear.py and test_block_linear.py check against
float64).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from pt_helpers import accumulation_u, assert_within, fp8_error, matmul_bound
from pt_norm_mlp_ref import (
    U_OUT,
    act64,
    fp8_grad_bound,
    fp8_ln_error,
    layernorm_mlp64,
    params64,
    rel_norm_error,
    run_module,
)

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core.activation import ACTIVATIONS, GATED_ACTIVATIONS
from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.module._operand import quantize_operand

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]

RECIPES = pytest.mark.parametrize(
    "fp8_recipe", [recipe.Float8CurrentScaling(), recipe.DelayedScaling()], ids=["current", "delayed"]
)
HP_GRAD = {torch.float32: 2.0**-16, torch.bfloat16: 2.0**-5}
KINKED = ("relu", "reglu", "clamped_swiglu")
H, F = 48, 32


def _make(kind, normalization, dtype, device, **kw):
    layer = te.LayerNormMLP(H, F, normalization=normalization, activation=kind, params_dtype=dtype, device=device, **kw)
    with torch.no_grad():
        layer.layer_norm_weight.normal_(1.0, 0.3)
        if layer.layer_norm_bias is not None:
            layer.layer_norm_bias.normal_(0, 0.3)
        layer.fc1_weight.normal_(0, 0.2)
        layer.fc2_weight.normal_(0, 0.2)
        layer.fc1_bias.normal_(0, 0.3)
        layer.fc2_bias.normal_(0, 0.3)
    return layer


def _reference(layer, x, dy):
    p = params64(layer)
    x64 = x.detach().double().requires_grad_()
    out, ln, h, act = layernorm_mlp64(
        x64,
        p,
        eps=layer.eps,
        zero_centered_gamma=layer.zero_centered_gamma,
        rms=layer.normalization == "RMSNorm",
        kind=layer.activation,
        act_params=layer.activation_params,
    )
    out.backward(dy.double().reshape(out.shape))
    return [t.detach().reshape(-1, t.shape[-1]) for t in (out, ln, h, act)], x64.grad, p


def _act_error(kind, h, e_h, act_params):
    """Bound of |act(h + d) - act(h)| for |d| <= e_h, elementwise."""
    lip = 1.13 + 2 * (h.abs() + e_h)
    if kind not in GATED_ACTIVATIONS:
        return lip * e_h
    (a, b), (e_a, e_b), (l_a, _) = h.chunk(2, -1), e_h.chunk(2, -1), lip.chunk(2, -1)
    # |f(a)| (times lin(1) >= 1 for clamped_swiglu: an upper bound).
    f_a = act64(torch.cat([a, torch.ones_like(a)], -1), kind, **(act_params or {})).abs()
    return l_a * e_a * (b.abs() + 1 + e_b) + (f_a + l_a * e_a) * e_b


def _output_bound(layer, ln, h, act, dtype, device, scales=None):
    """Elementwise bound of |out - out64| (scales: FP8 scales of ln, W1, act, W2, or None)."""
    w1, w2 = layer.fc1_weight.double(), layer.fc2_weight.double()
    u = 2.0**-20 + U_OUT[dtype]
    if scales is None:
        e_ln, e_w1, e_w2, acc = u * ln.abs(), torch.zeros_like(w1), torch.zeros_like(w2), 2.0**-24
    else:
        e_ln = fp8_ln_error(ln, scales[0], dtype)
        e_w1, e_w2 = fp8_error(w1, "e4m3", scales[1]), fp8_error(w2, "e4m3", scales[3])
        acc = accumulation_u(device, False)
    e_h = matmul_bound(ln, w1, e_ln, e_w1, dtype, acc) + U_OUT[dtype] * layer.fc1_bias.double().abs()
    e_pre = _act_error(layer.activation, h, e_h, layer.activation_params)
    e_act = e_pre + u * (act.abs() + e_pre)
    if scales is not None:
        e_act = e_act + fp8_error(act.abs() + 2 * e_act, "e4m3", scales[2])
    return matmul_bound(act, w2, e_act, e_w2, dtype, acc) + U_OUT[dtype] * layer.fc2_bias.double().abs()


def _check_grads(layer, dx, ref_dx, p, bound):
    assert rel_norm_error(dx, ref_dx) <= bound, "dx"
    for name, param in layer.named_parameters():
        assert rel_norm_error(param.grad, p[name].grad) <= bound, name


@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_high_precision_matches_float64(device, kind, dtype):
    normalization = "RMSNorm" if ACTIVATIONS.index(kind) % 2 else "LayerNorm"
    kw = {"activation_params": {"limit": 1.5, "alpha": 1.2}} if kind == "clamped_swiglu" else {}
    layer = _make(kind, normalization, dtype, device, **kw)
    x = (torch.randn(3, 5, H, device=device) * 2 + 0.5).to(dtype)
    dy = torch.randn(3, 5, H, device=device).to(dtype)
    y, dx = run_module(layer, x, dy)
    assert y.dtype == dtype and y.shape == (3, 5, H)
    (out, ln, h, act), ref_dx, p = _reference(layer, x, dy)
    assert_within(y.reshape(-1, H), out, _output_bound(layer, ln, h, act, dtype, device), "y")
    if dtype == torch.bfloat16 and kind in KINKED:
        # Where fc1's output is within its BF16 error of a kink (0 for relu,
        # +-limit for clamped_swiglu), f' jumps between 0 and 1 against the
        # float64 reference: whole gradient terms differ, by no rounding
        # bound. The FP32 case checks these gradients.
        return
    _check_grads(layer, dx, ref_dx, p, HP_GRAD[dtype])


@RECIPES
@pytest.mark.parametrize("kind", ["gelu", "swiglu", "reglu", "qgeglu"])
def test_fp8_matches_float64_within_format_bounds(device, fp8_recipe, kind):
    dtype = torch.bfloat16
    layer = _make(kind, "RMSNorm" if kind in ("swiglu", "reglu") else "LayerNorm", dtype, device)
    x = (torch.randn(2, 24, H, device=device) * 3).to(dtype)
    dy = torch.randn(2, 24, H, device=device).to(dtype)
    if fp8_recipe.delayed():
        for _ in range(2):  # the history now holds these tensors' amaxes
            run_module(layer, x, dy, fp8_recipe)
    (out, ln, h, act), ref_dx, p = _reference(layer, x, dy)
    if fp8_recipe.delayed():
        scale = layer.fp8_meta["scaling_fwd"].scale
        scales = [scale[i].item() for i in (0, 1, 3, 4)]
    else:
        amaxes = (ln, layer.fc1_weight, act, layer.fc2_weight)
        scales = [448.0 / t.double().abs().max().item() for t in amaxes]
    y, dx = run_module(layer, x, dy, fp8_recipe)
    assert_within(y.reshape(-1, H), out, _output_bound(layer, ln, h, act, dtype, device, scales), "FP8 y")
    _check_grads(layer, dx, ref_dx, p, fp8_grad_bound(2, 2))


def _saved_bytes(layer, x, fp8_recipe):
    """Bytes saved for backward, less the parameters and the input (existing tensors)."""
    saved = []
    with (
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
        te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe),
    ):
        layer(x)
    existing = {p.data_ptr() for p in layer.parameters()} | {x.data_ptr()}
    new = [t for t in saved if t.data_ptr() not in existing]
    return sum(t.numel() * t.element_size() for t in new), new


def test_return_conventions_and_the_layernorm_output():
    layer = _make("gelu", "LayerNorm", torch.float32, "cpu", return_bias=True, return_layernorm_output=True)
    x = torch.randn(16, H, requires_grad=True)
    for fp8_recipe in (None, recipe.DelayedScaling()):
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            out, bias, ln_out = layer(x)
        assert bias is layer.fc2_bias and out.shape == (16, H) and ln_out.shape == (16, H)
        (ref_out, ref_ln, _, _), _, _ = _reference(layer, x, torch.zeros(16, H))
        torch.testing.assert_close(ln_out.double(), ref_ln, rtol=2e-6, atol=2e-6)
        # return_bias leaves fc2's bias out of the output.
        if fp8_recipe is None:
            torch.testing.assert_close(out.double() + layer.fc2_bias.double(), ref_out, rtol=1e-5, atol=1e-5)
    # The gradient of the returned layernorm output reaches x.
    x.grad = None
    layer(x)[2].sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert isinstance(te.LayerNormMLP(H, F, device="cpu")(x), torch.Tensor)
    assert len(te.LayerNormMLP(H, F, return_layernorm_output_gathered=True, device="cpu")(x)) == 2


def test_parameter_names_shapes_and_init():
    mlp = te.LayerNormMLP(32, 64, activation="swiglu", device="cpu")
    assert [(n, tuple(p.shape)) for n, p in mlp.named_parameters()] == [
        ("layer_norm_weight", (32,)),
        ("layer_norm_bias", (32,)),
        ("fc1_weight", (128, 32)),
        ("fc1_bias", (128,)),
        ("fc2_weight", (32, 64)),
        ("fc2_bias", (32,)),
    ]
    plain = te.LayerNormMLP(32, 64, normalization="RMSNorm", bias=False, zero_centered_gamma=True, device="cpu")
    assert [(n, tuple(p.shape)) for n, p in plain.named_parameters()] == [
        ("layer_norm_weight", (32,)),
        ("fc1_weight", (64, 32)),
        ("fc2_weight", (32, 64)),
    ]
    assert torch.all(plain.layer_norm_weight == 0)
    # Default init: normal(0, 0.023) for both weights.
    big = te.LayerNormMLP(256, 512, device="cpu")
    for w in (big.fc1_weight, big.fc2_weight):
        assert abs(w.std().item() - 0.023) < 0.002 and abs(w.mean().item()) < 0.002


def test_zero_centered_gamma_uses_one_plus_weight():
    layer = _make("relu", "RMSNorm", torch.float32, "cpu", zero_centered_gamma=True)
    x = torch.randn(16, H)
    (ref, *_), _, _ = _reference(layer, x, torch.zeros(16, H))
    torch.testing.assert_close(layer(x).double(), ref, rtol=1e-5, atol=1e-5)


# (Delayed scaling changes its scales between steps: the two accumulated steps would differ.)
@pytest.mark.parametrize("fp8_recipe", [None, recipe.Float8CurrentScaling()])
def test_fuse_wgrad_accumulation(device, fp8_recipe):
    layer = te.LayerNormMLP(32, 64, activation="swiglu", fuse_wgrad_accumulation=True, device=device)
    reference = te.LayerNormMLP(32, 64, activation="swiglu", device=device)
    reference.load_state_dict(layer.state_dict())
    for w in (layer.fc1_weight, layer.fc2_weight):
        w.main_grad = torch.zeros_like(w, dtype=torch.float32)
    x, dy = torch.randn(16, 32, device=device), torch.randn(16, 32, device=device)
    run_module(reference, x, dy, fp8_recipe)
    for _ in range(2):
        run_module(layer, x, dy, fp8_recipe)
    for name in ("fc1_weight", "fc2_weight"):
        w = getattr(layer, name)
        assert w.grad is None and w.grad_added_to_main_grad
        torch.testing.assert_close(w.main_grad, 2 * getattr(reference, name).grad, rtol=1e-5, atol=1e-5)


def test_checkpoint_roundtrip_and_meta_device():
    layer = te.LayerNormMLP(32, 64, normalization="RMSNorm", activation="swiglu", device="cpu")
    x = torch.randn(16, 32)
    for _ in range(2):
        with te.autocast(recipe=recipe.DelayedScaling()):
            layer(x).sum().backward()
    state = layer.state_dict()
    assert layer.fp8_meta["scaling_fwd"].scale.shape == (6,) and layer.fp8_meta["scaling_bwd"].scale.shape == (4,)
    fresh = te.LayerNormMLP(32, 64, normalization="RMSNorm", activation="swiglu", device="meta")
    assert all(p.device.type == "meta" for p in fresh.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the CPU fallback warning without CUDA)
        fresh.reset_parameters()
    fresh = fresh.to("cpu")
    fresh.load_state_dict(state)
    for key in ("scaling_fwd", "scaling_bwd"):
        assert torch.equal(fresh.fp8_meta[key].amax_history, layer.fp8_meta[key].amax_history)
    with torch.no_grad(), te.autocast(recipe=recipe.DelayedScaling()):
        assert torch.equal(fresh(x), layer(x))


def test_is_first_microbatch_caches_both_fp8_weights():
    layer = te.LayerNormMLP(32, 64, device="cpu")
    x = torch.randn(16, 32, requires_grad=True)
    with te.autocast(recipe=recipe.DelayedScaling()):
        first = layer(x, is_first_microbatch=True)
        with torch.no_grad():
            layer.fc1_weight.mul_(2)
            layer.fc2_weight.mul_(2)
        again = layer(x, is_first_microbatch=False)
    assert torch.equal(again, first)
    again.sum().backward()  # the backward reads the cached columnwise copies
    assert layer.fc1_weight.grad is not None


@pytest.mark.parametrize(
    "kwargs",
    [{"sequence_parallel": True}, {"set_parallel_mode": True}, {"ub_bulk_wgrad": True}],
)
def test_parallel_arguments_are_not_yet_supported(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(NotImplementedError, match=f"te.LayerNormMLP: {name}=True is not yet supported"):
        te.LayerNormMLP(32, 64, device="cpu", **kwargs)


def test_error_messages():
    with pytest.raises(ValueError, match="activation must be one of gelu, relu"):
        te.LayerNormMLP(32, 64, activation="tanh", device="cpu")
    with pytest.raises(ValueError, match="activation_params apply to clamped_swiglu only"):
        te.LayerNormMLP(32, 64, activation="gelu", activation_params={"limit": 1.0}, device="cpu")
    with pytest.raises(ValueError, match="unknown activation_params"):
        te.LayerNormMLP(32, 64, activation="clamped_swiglu", activation_params={"beta": 1.0}, device="cpu")
    with pytest.raises(ValueError, match="normalization must be 'LayerNorm' or 'RMSNorm'"):
        te.LayerNormMLP(32, 64, normalization="rms", device="cpu")
    layer = te.LayerNormMLP(32, 64, device="cpu")
    with pytest.raises(ValueError, match=r"te.LayerNormMLP: input must have shape \[..., in_features=32\]"):
        layer(torch.randn(4, 33))
    with pytest.raises(ValueError, match="te.LayerNormMLP under FP8 quantization: FP8 GEMMs need the number of tokens"):
        with te.autocast(recipe=recipe.Float8CurrentScaling()):
            layer(torch.randn(5, 32))
    with pytest.raises(ValueError, match="te.LayerNormMLP under MXFP8 quantization: MXFP8 has one scale per 32"):
        with te.autocast(recipe=recipe.MXFP8BlockScaling()):
            layer(torch.randn(16, 32))


@pytest.mark.parametrize("fp8_recipe", [None, recipe.Float8CurrentScaling(), recipe.DelayedScaling()])
def test_torch_autocast_output_dtype_bias_free_and_param_grads(fp8_recipe):
    # (LayerNormLinear alongside: the same conventions.)
    x = torch.randn(32, 64, requires_grad=True)
    for layer in (
        te.LayerNormMLP(64, 96, bias=False, activation="geglu", device="cpu"),
        te.LayerNormLinear(64, 48, bias=False, normalization="RMSNorm", device="cpu"),
    ):
        with (
            torch.autocast("cpu", dtype=torch.bfloat16),
            te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe),
        ):
            y = layer(x)
        assert y.dtype == torch.bfloat16
        y.float().sum().backward()
        for name, param in layer.named_parameters():
            assert param.grad is not None and param.grad.dtype == torch.float32, name


# --------------------------------------------------------------------------- every recipe

BLOCK_AND_CURRENT = pytest.mark.parametrize(
    "fp8_recipe",
    [
        recipe.Float8CurrentScaling(),
        recipe.MXFP8BlockScaling(),
        recipe.Float8BlockScaling(),
        recipe.NVFP4BlockScaling(),
    ],
    ids=["current", "mxfp8", "fp8_block", "nvfp4"],
)
ALL_RECIPES = pytest.mark.parametrize(
    "fp8_recipe",
    [
        recipe.DelayedScaling(),
        recipe.Float8CurrentScaling(),
        recipe.MXFP8BlockScaling(),
        recipe.Float8BlockScaling(),
        recipe.NVFP4BlockScaling(),
    ],
    ids=["delayed", "current", "mxfp8", "fp8_block", "nvfp4"],
)


class _Activation(torch.autograd.Function):
    """te-core's activation alone (high precision), for the composition below."""

    @staticmethod
    def forward(ctx, h, kind):
        ctx.save_for_backward(h)
        ctx.kind = kind
        return kernels.activation_fwd(h, kind)[0]

    @staticmethod
    def backward(ctx, dy):
        (h,) = ctx.saved_tensors
        return kernels.activation_bwd(dy, h, ctx.kind)[0], None


@BLOCK_AND_CURRENT
@pytest.mark.parametrize("kind, normalization", [("gelu", "LayerNorm"), ("swiglu", "RMSNorm")])
def test_recipes_equal_norm_linear_activation_linear(device, fp8_recipe, kind, normalization):
    """Without the delayed-scaling fusions LayerNormMLP is exactly te.LayerNorm /
    te.RMSNorm -> te.Linear(fc1) -> activation -> te.Linear(fc2) with the same
    parameters and recipe (te.Linear's accuracy under each recipe is tested
    against float64 in test_block_linear.py / test_linear.py). This holds only
    if the backward's recomputed activation and requantized weights have the
    bytes the Linear layers quantize in their forward."""
    hidden, ffn, tokens = 64, 64, 64
    layer = te.LayerNormMLP(hidden, ffn, normalization=normalization, activation=kind, device=device)
    norm = (te.LayerNorm if normalization == "LayerNorm" else te.RMSNorm)(hidden, eps=layer.eps, device=device)
    fc1 = te.Linear(hidden, layer.fc1_weight.shape[0], device=device)
    fc2 = te.Linear(ffn, hidden, device=device)
    pairs = [(norm.weight, layer.layer_norm_weight), (fc1.weight, layer.fc1_weight), (fc1.bias, layer.fc1_bias)]
    pairs += [(fc2.weight, layer.fc2_weight), (fc2.bias, layer.fc2_bias)]
    if normalization == "LayerNorm":
        pairs.append((norm.bias, layer.layer_norm_bias))
    with torch.no_grad():
        for theirs, ours in pairs:
            ours.normal_(0.5 if ours is layer.layer_norm_weight else 0.0, 0.3)
            theirs.copy_(ours)
    x = torch.randn(2, tokens // 2, hidden, device=device)
    dy = torch.randn(2, tokens // 2, hidden, device=device)
    results, d1 = [], []

    def composition(t):
        h = fc1(norm(t))
        h.register_hook(d1.append)  # dL/dh, for fc1's bias gradient below
        return fc2(_Activation.apply(h, kind))

    for run in (layer, composition):
        xi = x.clone().requires_grad_()
        with warnings.catch_warnings(), te.autocast(recipe=fp8_recipe):
            warnings.simplefilter("ignore")  # (emulated GEMMs)
            y = run(xi)
        torch.manual_seed(11)  # (NVFP4's stochastic rounding of the gradients)
        y.backward(dy)
        results.append((y.detach(), xi.grad))
    assert torch.equal(results[0][0], results[1][0]), "y"
    assert torch.equal(results[0][1], results[1][1]), "dx"
    for theirs, ours in pairs:
        if ours is layer.fc1_bias:
            # Summed by the activation kernel (vs torch's sum): the FP32 sums of one dL/dh agree within
            # tokens * 2^-24 * sum|dL/dh| of the exact sum.
            d1_64 = d1[0].reshape(tokens, -1).double()
            bound = tokens * 2.0**-24 * d1_64.abs().sum(0)
            assert_within(ours.grad, d1_64.sum(0), bound, "fc1 bias grad")
            assert_within(theirs.grad, d1_64.sum(0), bound, "fc1 bias grad (composition)")
        else:
            assert torch.equal(ours.grad, theirs.grad)


@ALL_RECIPES
def test_weight_requantization_reproduces_the_forward_bytes(device, fp8_recipe):
    """Backward quantizes each weight again (columnwise only) instead of saving a
    copy: for every recipe those bytes equal the columnwise copy of a forward
    quantization (both copies at once), and do not change from call to call."""
    layer = te.LayerNormMLP(64, 64, activation="swiglu", device=device)
    with warnings.catch_warnings(), te.autocast(recipe=fp8_recipe):
        warnings.simplefilter("ignore")
        layer(torch.randn(64, 64, device=device))  # (builds the quantizers)
    for slot, weight in ((1, layer.fc1_weight), (4, layer.fc2_weight)):
        q = layer.quantizers["scaling_fwd"][slot]
        both = quantize_operand(q, weight.detach(), rowwise=True, columnwise=True).drop(rowwise=True)
        for _ in range(2):
            again = quantize_operand(q, weight.detach(), rowwise=False, columnwise=True)
            for name, value in both.fields.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(again.fields[name], value), (slot, name)


def test_current_scaling_backward_reuses_the_forward_weight_scales(monkeypatch):
    """Under Float8CurrentScaling backward quantizes each weight columnwise with the
    scale forward computed from it (no second amax pass over the weight); the
    gradients equal those of a run that computes the scale again."""
    from transformer_engine.pytorch.module import _layernorm_mlp_fn
    from transformer_engine.pytorch.tensor import Float8CurrentScalingQuantizer

    torch.manual_seed(3)
    x, dy = torch.randn(64, 64), torch.randn(64, 64)
    layer = te.LayerNormMLP(64, 128, activation="swiglu", device="cpu")
    fp8 = recipe.Float8CurrentScaling()

    def step():
        xi = x.clone().requires_grad_()
        layer.zero_grad(set_to_none=True)
        with te.autocast(recipe=fp8):
            y = layer(xi)
        y.backward(dy)
        return [y.detach(), xi.grad, *(p.grad.clone() for p in layer.parameters())]

    step()  # (builds the quantizers)
    weights = {layer.fc1_weight.data_ptr(), layer.fc2_weight.data_ptr()}
    seen = []
    original = Float8CurrentScalingQuantizer.quantize_parts

    def recording(self, t, rowwise, columnwise):
        seen.append((t.data_ptr(), rowwise, columnwise))
        return original(self, t, rowwise, columnwise)

    monkeypatch.setattr(Float8CurrentScalingQuantizer, "quantize_parts", recording)
    reused = step()
    weight_calls = [(row, col) for ptr, row, col in seen if ptr in weights]
    assert weight_calls == [(True, False), (True, False)], "weights quantized once each, rowwise, in forward"
    # Without the kept scales backward recomputes them from the weights: same gradients.
    monkeypatch.setattr(_layernorm_mlp_fn.MLPArgs, "weight_scales", property(lambda self: {}, lambda self, v: None))
    seen.clear()
    again = step()
    assert [(row, col) for ptr, row, col in seen if ptr in weights].count((False, True)) == 2
    for ours, theirs in zip(reused, again):
        assert torch.equal(ours, theirs)


def test_a_stochastically_rounded_weight_keeps_its_forward_copy(monkeypatch):
    layer = te.LayerNormMLP(64, 64, device="cpu")
    x = torch.randn(64, 64, requires_grad=True)
    fp8_recipe = recipe.NVFP4BlockScaling()
    with warnings.catch_warnings(), te.autocast(recipe=fp8_recipe):
        warnings.simplefilter("ignore")
        layer(x)
        weight_qs = [layer.quantizers["scaling_fwd"][slot] for slot in (1, 4)]
        for q in weight_qs:
            q.stochastic_rounding = True  # (not the recipe's default for weights)
        y = layer(x)
    for q in weight_qs:  # another draw would give other bytes than the forward's
        monkeypatch.setattr(q, "quantize_fields", lambda *a, **k: pytest.fail("the weight was quantized again"))
    y.sum().backward()
    assert x.grad is not None and layer.fc1_weight.grad is not None


@ALL_RECIPES
def test_every_recipe_saves_fewer_bytes_than_bf16(fp8_recipe):
    layer = te.LayerNormMLP(
        64, 256, normalization="RMSNorm", activation="swiglu", params_dtype=torch.bfloat16, device="cpu"
    )
    x = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    bf16_bytes, _ = _saved_bytes(layer, x, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fp8_bytes, tensors = _saved_bytes(layer, x, fp8_recipe)
    # The only high-precision activation is fc1's output (the activation's
    # backward needs it); the normalized input is kept quantized (bytes and
    # small scales), the activation output and the weight copies not at all.
    assert [tuple(t.shape) for t in tensors if t.dtype == torch.bfloat16] == [(64, 512)]
    assert all(t.dtype in (torch.uint8, torch.float32) for t in tensors if t.dtype != torch.bfloat16)
    assert sum(t.numel() for t in tensors if t.dtype == torch.uint8) <= 64 * 64 * 1.2
    assert fp8_bytes <= 0.7 * bf16_bytes, (fp8_bytes, bf16_bytes)
