"""Delayed scaling driven by a non-finite or absurd amax: a warning names the
tensor, the reference's rule still applies (checked step by step against
te-core's NumPy oracle of the update), and the scale recovers once the bad
amax leaves the amax-history window."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core import reference
from transformer_engine.pytorch import quantization

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.recipe]

HISTORY = 4
MARGIN = 1


def _np(t):
    return t.detach().float().cpu().numpy()


def _step(layer, fp8_recipe, x):
    """One training step's forward (the update runs at the autocast's exit); the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with te.autocast(recipe=fp8_recipe):
            y = layer(x)
    return y, [w for w in caught if issubclass(w.category, RuntimeWarning)]


def _relative_error(y, x, layer) -> float:
    exact = x.double() @ layer.weight.detach().double().T
    return float((y.detach().double() - exact).norm() / exact.norm())


@pytest.mark.parametrize(("outlier", "what"), [(3e38, "3e+38"), (float("inf"), "inf")])
def test_outlier_amax_warns_and_the_scale_recovers_after_the_window(device, outlier, what):
    fp8_recipe = recipe.DelayedScaling(margin=MARGIN, amax_history_len=HISTORY, amax_compute_algo="max")
    layer = te.Linear(32, 16, bias=False, device=device)
    hist = np.zeros((HISTORY, 3), np.float32)
    scale = np.ones(3, np.float32)
    clean_hist, clean_scale = hist.copy(), scale.copy()  # the same run without the outlier
    bad_step = 2
    # On CUDA the staged amaxes reach the host through an asynchronous copy: the warning
    # comes at the next update (docs/numerics.md); the synchronize makes "next" exact.
    warn_step = bad_step + (device.type == "cuda")
    for step in range(bad_step + HISTORY + 2):
        x = torch.randn(8, 32, device=device)
        clean_amax = reference.amax(_np(x))
        if step == bad_step:
            x[3, 5] = outlier
        y, caught = _step(layer, fp8_recipe, x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        expect_warning = step == warn_step
        assert (len(caught) == 1) == expect_warning, (step, [str(w.message) for w in caught])
        if expect_warning:
            message = str(caught[0].message)
            assert f"forward input of GEMM 0: {what}" in message and "recovers when the window passes" in message
        # The oracle of the update, with and without the outlier.
        w_amax = reference.amax(_np(layer.weight))
        hist[0, 0], hist[0, 1] = reference.amax(_np(x)), w_amax
        hist, scale = reference.delayed_scaling_update(hist, scale, "e4m3", MARGIN, "max")
        clean_hist[0, 0], clean_hist[0, 1] = clean_amax, w_amax
        clean_hist, clean_scale = reference.delayed_scaling_update(clean_hist, clean_scale, "e4m3", MARGIN, "max")
        state = layer.fp8_meta["scaling_fwd"]
        np.testing.assert_array_equal(_np(state.scale), scale, err_msg=f"step {step}")
        np.testing.assert_array_equal(_np(state.amax_history), hist, err_msg=f"step {step}")
        in_window = bad_step < step < bad_step + HISTORY  # (the outlier is in the amax window)
        if outlier == float("inf"):
            # inf keeps the old scale (the reference's rule): no damage after the bad step.
            assert scale[0] == clean_scale[0] or in_window or step == bad_step
        elif in_window:
            assert scale[0] < 1e-30 and _relative_error(y, x, layer) > 0.5, step  # garbage, as warned
    # The window has passed: the input scale is the one of the run without the outlier.
    assert scale[0] == clean_scale[0]
    x = torch.randn(8, 32, device=device)
    y, caught = _step(layer, fp8_recipe, x)
    assert not caught and _relative_error(y, x, layer) < 0.1


def test_absurd_amax_threshold_and_backward_naming():
    """A backward amax >= ABSURD_AMAX is named by its role; below it, no warning."""
    fp8_recipe = recipe.DelayedScaling(amax_history_len=2)
    layer = te.Linear(16, 16, device="cpu")
    for dy_peak, warned in ((quantization.ABSURD_AMAX / 2, False), (quantization.ABSURD_AMAX, True)):
        x = torch.randn(16, 16, requires_grad=True)
        with te.autocast(recipe=fp8_recipe):
            y = layer(x)
        dy = torch.zeros_like(y)
        dy[0, 0] = dy_peak
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y.backward(dy)
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert bool(messages) == warned, messages
        if warned:
            assert "backward grad_output of GEMM 0" in messages[0]
