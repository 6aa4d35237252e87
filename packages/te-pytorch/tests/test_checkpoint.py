"""FP8 state in `_extra_state`: exact round-trips, and checkpoints without it."""

from __future__ import annotations

import io
import pickle
import warnings

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.module._extra_state import UNSAFE_PICKLE_EXTRA_STATE_ENV

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]


def _step(layer, x, dy, fp8_recipe):
    with te.autocast(recipe=fp8_recipe):
        y = layer(x)
    y.backward(dy)
    return y.detach()


def _roundtrip(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_delayed_scaling_state_roundtrips_exactly(device):
    fp8_recipe = recipe.DelayedScaling(margin=1, amax_history_len=7, amax_compute_algo="max")
    layer = te.Linear(32, 48, device=device)
    x = torch.randn(16, 32, device=device)
    dy = torch.randn(16, 48, device=device)
    for _ in range(3):
        _step(layer, x * torch.rand(1, device=device), dy, fp8_recipe)
    state = _roundtrip(layer.state_dict())
    assert set(state) == {"weight", "bias", "_extra_state"}
    restored = te.Linear(32, 48, device=device)
    restored.load_state_dict(state)
    assert restored.fp8_meta["recipe"] == fp8_recipe
    for key in ("scaling_fwd", "scaling_bwd"):
        assert torch.equal(restored.fp8_meta[key].scale, layer.fp8_meta[key].scale)
        assert torch.equal(restored.fp8_meta[key].amax_history, layer.fp8_meta[key].amax_history)
    # Training continues identically (and the equal recipe causes no warning).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            assert torch.equal(_step(layer, x, dy, fp8_recipe), _step(restored, x, dy, fp8_recipe))
    for key in ("scaling_fwd", "scaling_bwd"):
        assert torch.equal(restored.fp8_meta[key].amax_history, layer.fp8_meta[key].amax_history)


def test_stateless_modules_save_an_empty_extra_state():
    layer = te.Linear(16, 16, device="cpu")
    empty = layer.state_dict()["_extra_state"]
    assert isinstance(empty, torch.Tensor) and empty.numel() == 0 and empty.dtype == torch.uint8
    _step(layer, torch.randn(16, 16), torch.randn(16, 16), recipe.Float8CurrentScaling())
    assert layer.state_dict()["_extra_state"].numel() == 0
    fresh = te.Linear(16, 16, device="cpu")
    fresh.load_state_dict(_roundtrip(layer.state_dict()))
    assert fresh.fp8_meta["recipe"] is None and torch.equal(fresh.weight, layer.weight)


def test_checkpoint_without_fp8_state_loads():
    plain = torch.nn.Linear(16, 32)
    layer = te.Linear(16, 32, device="cpu")
    layer.load_state_dict(plain.state_dict())  # strict: no _extra_state key at all
    assert torch.equal(layer.weight, plain.weight) and torch.equal(layer.bias, plain.bias)
    with pytest.raises(RuntimeError, match="Missing key"):
        layer.load_state_dict({"weight": plain.weight})
    norm = te.LayerNorm(32, device="cpu")
    norm.load_state_dict(torch.nn.LayerNorm(32).state_dict())


def test_reference_pickled_extra_state_needs_opt_in(monkeypatch):
    source = te.Linear(16, 16, device="cpu")
    x, dy = torch.randn(16, 16), torch.randn(16, 16)
    _step(source, x, dy, recipe.DelayedScaling(amax_history_len=4))
    meta = source.fp8_meta
    payload = {
        "recipe": meta["recipe"],
        "scale_fwd": meta["scaling_fwd"].scale,
        "amax_history_fwd": meta["scaling_fwd"].amax_history,
        "scale_bwd": meta["scaling_bwd"].scale,
        "amax_history_bwd": meta["scaling_bwd"].amax_history,
        "extra_fp8_variables": {},
    }
    pickled = torch.frombuffer(bytearray(pickle.dumps(payload)), dtype=torch.uint8)
    state = {"weight": source.weight, "bias": source.bias, "_extra_state": pickled}
    target = te.Linear(16, 16, device="cpu")
    monkeypatch.delenv(UNSAFE_PICKLE_EXTRA_STATE_ENV, raising=False)
    with pytest.warns(UserWarning, match=UNSAFE_PICKLE_EXTRA_STATE_ENV):
        target.load_state_dict(state)
    assert target.fp8_meta["recipe"] is None
    monkeypatch.setenv(UNSAFE_PICKLE_EXTRA_STATE_ENV, "1")
    target.load_state_dict(state)
    assert torch.equal(target.fp8_meta["scaling_fwd"].amax_history, meta["scaling_fwd"].amax_history)


def test_unrecognised_extra_state_is_an_error():
    layer = te.Linear(16, 16, device="cpu")
    with pytest.raises(ValueError, match="unrecognised _extra_state"):
        layer.set_extra_state({"version": 99})
