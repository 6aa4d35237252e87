"""autocast and the delayed-scaling state machine (§3.3), step by step against
te-core's NumPy oracle of the update."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from pt_helpers import accumulation_u, assert_within, matmul_bound

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core import reference
from transformer_engine.pytorch import quantization

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.recipe]

FLT_MAX = np.finfo(np.float32).max


def _np(t):
    return t.detach().float().cpu().numpy()


def _oracle_quantized(x, scale, fmt):
    q = reference.quantize_fp8(_np(x), scale, fmt)
    return torch.from_numpy(reference.dequantize_fp8(q, np.float32(1) / np.float32(scale), fmt))


@pytest.mark.parametrize("history_len", [1, 5, 31])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("is_first_microbatch", [None, True, False])
def test_scale_update_with_linear_module(device, history_len, algo, is_first_microbatch):
    margin = 2
    fp8_recipe = recipe.DelayedScaling(margin=margin, amax_history_len=history_len, amax_compute_algo=algo)
    layer = te.Linear(32, 48, device=device)
    hist_f = np.zeros((history_len, 3), np.float32)
    scale_f = np.ones(3, np.float32)
    hist_b = np.zeros((history_len, 2), np.float32)
    scale_b = np.ones(2, np.float32)
    for step in range(6):
        x = (torch.randn(16, 32, device=device) * float(2.0 ** (step - 2))).requires_grad_()
        dy = torch.randn(16, 48, device=device) * float(3.0**-step)
        with te.autocast(recipe=fp8_recipe):
            y = layer(x, is_first_microbatch=is_first_microbatch)
        # The forward used the scales from before this step.
        x_hat = _oracle_quantized(x, scale_f[0], "e4m3").double()
        if step == 0 or is_first_microbatch is not False:  # else the cached FP8 weight
            w_hat = _oracle_quantized(layer.weight, scale_f[1], "e4m3").double()
        expected = x_hat @ w_hat.T + layer.bias.detach().double().cpu()
        # DelayedScaling's fprop uses fast accumulation (split accumulator off).
        bound = (
            matmul_bound(
                x_hat,
                w_hat,
                torch.zeros_like(x_hat),
                torch.zeros_like(w_hat),
                torch.float32,
                accumulation_u(device, False),
            )
            + 2.0**-24 * expected.abs()
        )
        assert_within(y.cpu(), expected, bound, f"step {step} output")
        y.backward(dy)
        # Forward staging: input and weight amaxes (the weight only when it was quantized).
        hist_f[0, 0] = max(hist_f[0, 0], reference.amax(_np(x)))
        if step == 0 or is_first_microbatch is not False:
            hist_f[0, 1] = max(hist_f[0, 1], reference.amax(_np(layer.weight)))
        hist_f, scale_f = reference.delayed_scaling_update(hist_f, scale_f, "e4m3", margin, algo)
        hist_b[0, 0] = reference.amax(_np(dy))
        hist_b, scale_b = reference.delayed_scaling_update(hist_b, scale_b, "e5m2", margin, algo)
        fwd, bwd = layer.fp8_meta["scaling_fwd"], layer.fp8_meta["scaling_bwd"]
        assert fwd.amax_history.shape == (history_len, 3) and fwd.scale.shape == (3,)
        np.testing.assert_array_equal(_np(fwd.amax_history), hist_f, err_msg=f"step {step}")
        np.testing.assert_array_equal(_np(fwd.scale), scale_f, err_msg=f"step {step}")
        np.testing.assert_array_equal(_np(bwd.amax_history), hist_b, err_msg=f"step {step}")
        np.testing.assert_array_equal(_np(bwd.scale), scale_b, err_msg=f"step {step}")


def test_update_timing(device):
    """Forward update at the outermost autocast exit (grad enabled only);
    backward update when the first module's backward has run."""
    model = torch.nn.Sequential(te.Linear(16, 32, device=device), te.Linear(32, 16, device=device))
    first = model[0]
    x = torch.randn(32, 16, device=device, requires_grad=True)
    with te.autocast(recipe=recipe.DelayedScaling()):
        with te.autocast(recipe=recipe.DelayedScaling()):
            y = model(x)
        assert first.fp8_meta["scaling_fwd"].amax_history[-1].abs().sum() == 0  # not yet
        assert first.fp8_meta["scaling_fwd"].amax_history[0, 0] > 0  # staged
    for layer in model:
        assert layer.fp8_meta["scaling_fwd"].amax_history[-1, :2].min() > 0  # rolled in
        assert layer.fp8_meta["scaling_fwd"].amax_history[0].abs().sum() == 0
        assert layer.fp8_meta["scaling_bwd"].amax_history.abs().sum() == 0
    y.sum().backward()
    for layer in model:
        assert layer.fp8_meta["scaling_bwd"].amax_history[-1, 0] > 0
        assert layer.fp8_meta["scaling_bwd"].scale[0] != 1.0
    with torch.no_grad(), te.autocast(recipe=recipe.DelayedScaling()):
        model(x)
    # No update without grad: the amaxes stay staged in row 0.
    assert first.fp8_meta["scaling_fwd"].amax_history[0, 0] > 0


def test_amax_reduction_runs_over_the_group(gloo_world, monkeypatch):
    calls = []
    real_all_reduce = torch.distributed.all_reduce

    def spy(tensor, op=None, group=None, **kwargs):
        calls.append((tensor.numel(), op, group))
        return real_all_reduce(tensor, op=op, group=group, **kwargs)

    monkeypatch.setattr(torch.distributed, "all_reduce", spy)
    # One process, but pretend the group is larger so that the reduction path runs.
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    layers = [te.Linear(16, 16, device="cpu") for _ in range(2)]
    plain = [te.Linear(16, 16, device="cpu") for _ in range(2)]
    for a, b in zip(layers, plain):
        b.load_state_dict(a.state_dict())
    x = torch.randn(16, 16, requires_grad=True)
    for model, group, fp8_recipe in (
        (layers, gloo_world, recipe.DelayedScaling()),
        (plain, None, recipe.DelayedScaling(reduce_amax=False)),
    ):
        for _ in range(2):
            with te.autocast(recipe=fp8_recipe, amax_reduction_group=group):
                y = model[1](model[0](x))
            y.sum().backward()
    # Per step: one forward reduction of 2 x 3 amaxes and one backward of 2 x 2.
    assert [(n, op) for n, op, _ in calls] == [
        (6, torch.distributed.ReduceOp.MAX),
        (4, torch.distributed.ReduceOp.MAX),
    ] * 2
    assert all(group is gloo_world for _, _, group in calls)
    for a, b in zip(layers, plain):
        for key in ("scaling_fwd", "scaling_bwd"):
            assert torch.equal(a.fp8_meta[key].amax_history, b.fp8_meta[key].amax_history)
            assert torch.equal(a.fp8_meta[key].scale, b.fp8_meta[key].scale)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("fmt", [recipe.Format.E4M3, recipe.Format.HYBRID])
def test_scale_update_numeric_scenarios(fused, fmt):
    """amax zero / inf / nan keep the scale, tiny gives FLT_MAX, normal fp8_max / amax."""
    scenarios = {"zero": 0.0, "tiny": 448.0 / FLT_MAX / 8, "normal": 3.25, "inf": float("inf"), "nan": float("nan")}
    algo = "max" if fused else (lambda history: history.max(dim=0).values)
    fp8_recipe = recipe.DelayedScaling(fp8_format=fmt, amax_history_len=1, amax_compute_algo=algo)
    state = te.recipe_state.RecipeState.create(fp8_recipe, mode="backward", num_quantizers=len(scenarios), device="cpu")
    state.amax_history[0] = torch.tensor(list(scenarios.values()))
    quantization._reduce_and_update(fp8_recipe, None, [state])
    fp8_max = 57344.0 if fmt is recipe.Format.HYBRID else 448.0
    expected = [1.0, FLT_MAX, np.float32(fp8_max) / np.float32(3.25), 1.0, 1.0]
    np.testing.assert_array_equal(_np(state.scale), np.array(expected, np.float32))


def test_callable_algorithms_use_the_unfused_path():
    seen = []

    def amax_algo(history):
        seen.append(history.clone())
        return history.mean(dim=0)

    def sf_algo(amax, scale, fp8_max, fp8_recipe):
        return torch.where(amax > 0, fp8_max / amax / 4, scale)

    fp8_recipe = recipe.DelayedScaling(
        amax_history_len=4, amax_compute_algo=amax_algo, scaling_factor_compute_algo=sf_algo
    )
    layer = te.Linear(16, 16, device="cpu")
    x = torch.randn(16, 16, requires_grad=True)
    with te.autocast(recipe=fp8_recipe):
        layer(x)
    history = layer.fp8_meta["scaling_fwd"].amax_history
    staged = seen[0][0]
    assert torch.equal(history[-1], staged) and history[:-1].abs().sum() == 0
    expected = torch.where(staged / 4 > 0, 448.0 / (staged / 4) / 4, torch.ones(3))
    torch.testing.assert_close(layer.fp8_meta["scaling_fwd"].scale, expected, rtol=0, atol=0)


def test_calibration_records_amaxes_in_high_precision():
    layer = te.Linear(16, 32, device="cpu")
    x = torch.randn(8, 16)
    plain = layer(x)
    with te.autocast(enabled=False, calibrating=True, recipe=recipe.DelayedScaling()):
        y = layer(x)
    assert torch.equal(y, plain)
    meta = layer.fp8_meta["scaling_fwd"]
    assert meta.amax_history[-1, 0] == x.abs().max() and meta.amax_history[-1, 1] == layer.weight.abs().max()
    assert meta.scale[0] == torch.tensor(448.0) / x.abs().max()


def test_recipe_change_warnings():
    layer = te.Linear(16, 16, device="cpu")
    x = torch.randn(16, 16)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        layer(x)
    with (
        pytest.warns(UserWarning, match="Recipe type changed"),
        te.autocast(recipe=recipe.DelayedScaling(amax_history_len=8)),
    ):
        layer(x)
    old_history = layer.fp8_meta["scaling_fwd"].amax_history.clone()
    with (
        pytest.warns(UserWarning, match="Quantizer is being updated, this may affect model"),
        te.autocast(recipe=recipe.DelayedScaling(amax_history_len=4)),
    ):
        layer(x)
    history = layer.fp8_meta["scaling_fwd"].amax_history
    assert history.shape == (4, 3)
    # The newest amaxes were kept (then rolled once by this step's update).
    assert torch.equal(history[1:3], old_history[-2:]) and history[-1, 0] == x.abs().max()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=4)):  # equal: no warning
            layer(x)


def test_autocast_api():
    fp8_recipe = recipe.Float8CurrentScaling()
    with pytest.warns(DeprecationWarning, match="fp8_autocast is deprecated"):
        ctx = te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe)
    with ctx:
        assert te.FP8GlobalStateManager.is_fp8_enabled()
        assert te.FP8GlobalStateManager.get_fp8_recipe() is fp8_recipe
        with pytest.raises(RuntimeError, match="already active"):
            ctx.__enter__()
        with te.autocast(enabled=False):
            assert not te.FP8GlobalStateManager.is_fp8_enabled()
        assert te.FP8GlobalStateManager.is_fp8_enabled()
    assert not te.FP8GlobalStateManager.is_fp8_enabled()
    assert te.FP8GlobalStateManager.autocast_depth == 0
    if not torch.cuda.is_available():
        assert isinstance(te.get_default_recipe(), recipe.DelayedScaling)
    with te.autocast() as default:
        assert default.recipe is None and te.FP8GlobalStateManager.fp8_recipe is not None


def test_custom_recipe_says_it_is_coming():
    with (
        pytest.raises(NotImplementedError, match="CustomRecipe is not supported .* coming"),
        te.autocast(recipe=recipe.CustomRecipe(qfactory=lambda role: None)),
    ):
        pass
    assert te.FP8GlobalStateManager.autocast_depth == 0


@pytest.mark.parametrize(
    "block_recipe", [recipe.MXFP8BlockScaling, recipe.Float8BlockScaling, recipe.NVFP4BlockScaling]
)
def test_block_recipe_options_not_yet_supported(block_recipe):
    with (
        pytest.raises(NotImplementedError, match="backward_override='high_precision' is not yet supported"),
        te.autocast(recipe=block_recipe(backward_override="high_precision")),
    ):
        pass
    assert te.FP8GlobalStateManager.autocast_depth == 0
    with (
        pytest.raises(TypeError, match="must be a transformer_engine.common.recipe.Recipe"),
        te.autocast(recipe="delayed"),
    ):
        pass


@pytest.mark.parametrize("make_recipe", [recipe.DelayedScaling, recipe.Float8CurrentScaling])
def test_state_built_for_a_device_without_index_is_kept(device, make_recipe):
    """init_fp8_metadata(recipe, "cuda") then a forward on "cuda:0" (the same
    device) keeps the quantizers and the state: they are not rebuilt. (They
    were, on the GPU: "cuda" != "cuda:0" looked like a moved module, and the
    new quantizers dropped what had been set on the old ones.)"""
    fp8_recipe = make_recipe()
    layer = te.Linear(32, 16, device=device)
    layer.init_fp8_metadata(fp8_recipe, device)
    quantizers = list(layer.quantizers["scaling_fwd"])
    state = layer.fp8_meta["scaling_fwd"]
    x = torch.randn(16, 32, device=device)
    assert x.device.index == (None if x.device.type == "cpu" else torch.cuda.current_device())
    with te.autocast(recipe=fp8_recipe):
        layer(x)
    assert layer.fp8_meta["scaling_fwd"] is state
    assert all(a is b for a, b in zip(layer.quantizers["scaling_fwd"], quantizers))
