"""A checkpoint's FP8 state (_extra_state) is validated on load: a missing key,
an unknown format name, a recipe that is not a dict, a bad scale or history
raise a ValueError naming the key and the rule, before any state changes."""

from __future__ import annotations

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.module, pytest.mark.usefixtures("te_state")]


@pytest.fixture
def saved():
    """A Linear's state_dict after two DelayedScaling steps (history length 4)."""
    layer = te.Linear(16, 16, device="cpu")
    for _ in range(2):
        with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=4)):
            y = layer(torch.randn(16, 16))
        y.backward(torch.randn(16, 16))
    state = layer.state_dict()
    assert isinstance(state["_extra_state"], dict)
    return state


def _load(state):
    fresh = te.Linear(16, 16, device="cpu")
    fresh.load_state_dict(state)
    return fresh


def test_valid_state_loads(saved):
    fresh = _load(saved)
    assert torch.equal(fresh.fp8_meta["scaling_fwd"].scale, saved["_extra_state"]["scale_fwd"])


@pytest.mark.parametrize("key", ["recipe", "scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"])
def test_missing_key_is_named(saved, key):
    del saved["_extra_state"][key]
    with pytest.raises(ValueError, match=rf"no '{key}' entry"):
        _load(saved)


@pytest.mark.parametrize("key", ["type", "fp8_format", "margin", "amax_history_len", "amax_compute_algo"])
def test_missing_recipe_field_is_named(saved, key):
    del saved["_extra_state"]["recipe"][key]
    with pytest.raises(ValueError, match=rf"\['recipe'\] has no '{key}' entry"):
        _load(saved)


def test_unknown_fp8_format_lists_valid_names(saved):
    saved["_extra_state"]["recipe"]["fp8_format"] = "FOO"
    with pytest.raises(ValueError, match=r"unknown fp8_format 'FOO'; valid names: .*HYBRID"):
        _load(saved)


def test_recipe_stored_as_string(saved):
    saved["_extra_state"]["recipe"] = "DelayedScaling()"
    with pytest.raises(ValueError, match="'recipe' must be a dict"):
        _load(saved)


def test_unknown_recipe_type(saved):
    saved["_extra_state"]["recipe"]["type"] = "MXFP8BlockScaling"
    with pytest.raises(ValueError, match="unknown recipe type"):
        _load(saved)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
@pytest.mark.parametrize("key", ["scale_fwd", "scale_bwd"])
def test_bad_scale_is_rejected(saved, key, bad):
    saved["_extra_state"][key] = saved["_extra_state"][key].clone()
    saved["_extra_state"][key][1] = bad
    with pytest.raises(ValueError, match=rf"{key} must be finite and > 0"):
        _load(saved)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize("key", ["amax_history_fwd", "amax_history_bwd"])
def test_bad_amax_history_is_rejected(saved, key, bad):
    saved["_extra_state"][key] = saved["_extra_state"][key].clone()
    saved["_extra_state"][key][0, 0] = bad
    with pytest.raises(ValueError, match=rf"{key} must be finite and >= 0"):
        _load(saved)


def test_history_length_must_match_the_recipe(saved):
    saved["_extra_state"]["recipe"]["amax_history_len"] = 8
    with pytest.raises(ValueError, match="amax_history_fwd has 4 rows but the stored recipe's amax_history_len is 8"):
        _load(saved)


@pytest.mark.parametrize("key", ["scale_fwd", "amax_history_bwd"])
def test_non_tensor_or_integer_state_is_rejected(saved, key):
    saved["_extra_state"][key] = saved["_extra_state"][key].tolist()
    with pytest.raises(ValueError, match=rf"{key} must be a floating-point tensor"):
        _load(saved)


def test_inconsistent_shapes_are_rejected(saved):
    saved["_extra_state"]["scale_fwd"] = saved["_extra_state"]["scale_fwd"][:2].clone()
    with pytest.raises(ValueError, match=r"scale_fwd must be \[n\] and amax_history_fwd"):
        _load(saved)


def test_failed_load_leaves_the_fp8_state_unchanged(saved):
    saved["_extra_state"]["scale_fwd"] = torch.zeros_like(saved["_extra_state"]["scale_fwd"])
    fresh = te.Linear(16, 16, device="cpu")
    with pytest.raises(ValueError):
        fresh.load_state_dict(saved)
    assert fresh.fp8_meta["recipe"] is None


def test_state_of_another_module_is_rejected_by_shape(saved):
    mlp = te.LayerNormMLP(16, 32, device="cpu")  # two GEMMs: 6 forward scales, not 3
    with pytest.raises(ValueError, match=r"scale_fwd has shape \(3,\), expected \(6,\)"):
        mlp.set_extra_state(saved["_extra_state"])
