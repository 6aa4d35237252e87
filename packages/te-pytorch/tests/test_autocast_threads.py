"""Threads: the autocast state is thread-local (as torch.autocast's is), and
one module called from several threads keeps a consistent FP8 state (its
forward runs under the module's lock)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core import reference
from transformer_engine.pytorch import FP8GlobalStateManager

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.recipe]

TIMEOUT = 30.0


def _run(target, *args):
    """target(*args) in a new thread; its exception (if any) is re-raised here."""
    errors = []

    def body():
        try:
            target(*args)
        except BaseException as err:  # noqa: BLE001 (handed to the test's thread)
            errors.append(err)

    thread = threading.Thread(target=body)
    thread.start()
    return thread, errors


def _join(thread, errors):
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "thread did not finish"
    if errors:
        raise errors[0]


def _fp32_oracle_close(y, x, layer) -> bool:
    exact = x.double() @ layer.weight.detach().double().T + layer.bias.detach().double()
    return bool(torch.allclose(y.double(), exact, rtol=1e-5, atol=1e-5))


def test_a_module_outside_autocast_ignores_another_threads_region(device):
    layer = te.Linear(32, 32, device=device)
    x = torch.randn(16, 32, device=device)
    inside, release = threading.Event(), threading.Event()
    seen = {}

    def other_thread():
        with te.autocast(recipe=recipe.DelayedScaling()):
            seen["other_enabled"] = FP8GlobalStateManager.is_fp8_enabled()
            seen["other_recipe"] = FP8GlobalStateManager.fp8_recipe
            inside.set()
            release.wait(TIMEOUT)

    thread, errors = _run(other_thread)
    assert inside.wait(TIMEOUT)
    try:
        assert not FP8GlobalStateManager.is_fp8_enabled() and FP8GlobalStateManager.fp8_recipe is None
        y = layer(x)  # high precision: FP8 (E4M3) would miss the FP32 oracle by ~1e-2
        assert _fp32_oracle_close(y, x, layer)
        assert layer.fp8_meta["recipe"] is None
    finally:
        release.set()
        _join(thread, errors)
    assert seen["other_enabled"] and isinstance(seen["other_recipe"], recipe.DelayedScaling)


def test_regions_in_two_threads_keep_their_own_recipes():
    """Thread A under current scaling, thread B under DelayedScaling, interleaved: each sees its recipe."""
    barrier = threading.Barrier(2, timeout=TIMEOUT)
    seen = {}

    def region(name, fp8_recipe):
        with te.autocast(recipe=fp8_recipe):
            barrier.wait()  # both regions are open now
            seen[name] = FP8GlobalStateManager.get_fp8_recipe()
            barrier.wait()
        seen[name + "_after"] = FP8GlobalStateManager.is_fp8_enabled()

    a = _run(region, "a", recipe.Float8CurrentScaling())
    b = _run(region, "b", recipe.DelayedScaling(margin=1))
    _join(*a)
    _join(*b)
    assert isinstance(seen["a"], recipe.Float8CurrentScaling) and seen["b"] == recipe.DelayedScaling(margin=1)
    assert seen["a_after"] is False and seen["b_after"] is False


def test_autocast_must_be_exited_in_its_thread():
    region = te.autocast(recipe=recipe.Float8CurrentScaling())
    region.__enter__()
    thread, errors = _run(region.__exit__, None, None, None)
    with pytest.raises(RuntimeError, match="exited in the thread that entered it"):
        _join(thread, errors)
    region.__exit__(None, None, None)
    assert not FP8GlobalStateManager.is_fp8_enabled()


def test_a_modules_forward_waits_for_its_lock():
    layer = te.Linear(16, 16, device="cpu")
    done = threading.Event()
    with layer._fp8_lock:
        thread, errors = _run(lambda: (layer(torch.randn(4, 16)), done.set()))
        assert not done.wait(0.3), "forward ran while another thread held the module's lock"
    _join(thread, errors)
    assert done.is_set()


def test_one_module_from_several_threads_under_delayed_scaling():
    """4 threads x 5 steps of one module, each input with amax exactly 2: the
    state ends as the oracle says (whatever the interleaving), and every
    output is the FP8 result with scale 1 (before the first update) or the
    updated scale."""
    margin, threads, steps = 1, 4, 5
    fp8_recipe = recipe.DelayedScaling(margin=margin, amax_history_len=3)
    layer = te.Linear(32, 32, bias=False, device="cpu")
    inputs = []
    for _ in range(threads * steps):
        x = torch.rand(8, 32) * 2 - 1
        x[0, 0] = 2.0
        inputs.append(x)
    w = layer.weight.detach()
    w_amax = reference.amax(w.numpy())
    outputs = [None] * len(inputs)

    def worker(t):
        for s in range(steps):
            k = t * steps + s
            with te.autocast(recipe=fp8_recipe):
                outputs[k] = layer(inputs[k]).detach()

    running = [_run(worker, t) for t in range(threads)]
    for thread, errors in running:
        _join(thread, errors)
    state = layer.fp8_meta["scaling_fwd"]
    scale_x = np.float32(448.0 / 2.0 / 2**margin)
    scale_w = np.float32(448.0) / np.float32(w_amax) / np.float32(2**margin)
    assert state.scale[0].item() == scale_x and state.scale[1].item() == scale_w
    np.testing.assert_array_equal(state.amax_history[1:, 0].numpy(), 2.0)
    np.testing.assert_array_equal(state.amax_history[0].numpy(), 0.0)  # (staging row cleared by the last update)

    def fp8_out(x, sx, sw):
        qx = reference.dequantize_fp8(reference.quantize_fp8(x.numpy(), sx, "e4m3"), 1 / np.float32(sx), "e4m3")
        qw = reference.dequantize_fp8(reference.quantize_fp8(w.numpy(), sw, "e4m3"), 1 / np.float32(sw), "e4m3")
        return torch.from_numpy(qx).double() @ torch.from_numpy(qw).double().T

    for k, (x, y) in enumerate(zip(inputs, outputs)):
        candidates = [fp8_out(x, np.float32(1), np.float32(1)), fp8_out(x, scale_x, scale_w)]
        assert any(torch.allclose(y.double(), c, rtol=1e-5, atol=1e-4) for c in candidates), k


def test_copies_of_a_module_get_their_own_lock():
    import copy

    layer = te.Linear(8, 8, device="cpu")
    clone = copy.deepcopy(layer)
    assert clone._fp8_lock is not layer._fp8_lock
    torch.testing.assert_close(clone(torch.ones(2, 8)), layer(torch.ones(2, 8)))
