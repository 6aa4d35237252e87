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


# ------------------------------------------------------------------ versions and the checksum


def test_saved_state_is_version_2_with_a_checksum(saved):
    extra = saved["_extra_state"]
    assert extra["version"] == 2 and isinstance(extra["checksum"], int) and 0 <= extra["checksum"] < 2**32


@pytest.mark.parametrize("what", ["scale_fwd", "amax_history_bwd", "margin"])
def test_a_change_that_passes_validation_fails_the_checksum(saved, what):
    extra = saved["_extra_state"]
    if what == "margin":
        extra["recipe"]["margin"] = extra["recipe"]["margin"] + 1  # a valid recipe, not the saved one
    else:
        extra[what] = extra[what].clone()
        flat = extra[what].view(-1)
        flat[0] = float(torch.nextafter(flat[0], torch.tensor(float("inf"))))  # one ulp: still valid
    fresh = te.Linear(16, 16, device="cpu")
    with pytest.raises(ValueError, match=r"key _extra_state: .*'checksum' 0x[0-9a-f]{8} does not match"):
        fresh.load_state_dict(saved)
    assert fresh.fp8_meta["recipe"] is None  # nothing was installed


def test_version_1_without_checksum_still_loads(saved):
    extra = saved["_extra_state"]
    del extra["checksum"]
    extra["version"] = 1
    fresh = _load(saved)
    for key in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"):
        meta = fresh.fp8_meta[f"scaling_{key[-3:]}"]
        assert torch.equal(getattr(meta, key[:-4]), extra[key]), key
    assert fresh.state_dict()["_extra_state"]["version"] == 2  # saved again in the current format


def test_version_2_needs_its_checksum(saved):
    del saved["_extra_state"]["checksum"]
    with pytest.raises(ValueError, match="no 'checksum' entry"):
        _load(saved)


@pytest.mark.parametrize("version", [3, 0, "2", True])
def test_unknown_versions_are_named(saved, version):
    saved["_extra_state"]["version"] = version
    with pytest.raises(ValueError, match=rf"unknown 'version' {version!r}; this te-pytorch reads versions 1, 2"):
        _load(saved)


def test_error_names_the_state_dict_key_of_a_nested_module():
    model = torch.nn.Sequential(torch.nn.Identity(), te.LayerNormMLP(16, 32, device="cpu"))
    with te.autocast(recipe=recipe.DelayedScaling()):
        model(torch.randn(8, 16))
    state = model.state_dict()
    state["1._extra_state"]["scale_fwd"][0] = 0.0
    with pytest.raises(ValueError, match=r"LayerNormMLP: state_dict key 1\._extra_state: .*scale_fwd must be finite"):
        model.load_state_dict(state)


# ------------------------------------------------------------------ files: what torch.load does


def test_file_round_trip_and_what_torch_does_with_a_damaged_file(saved, tmp_path):
    """Our code never opens checkpoint files: torch.load reads them before any
    TE code runs. A good file round-trips (weights_only=True); an empty or
    truncated one raises in torch.load itself (docs/checkpoints: torch's
    message, not ours)."""
    path = tmp_path / "ckpt.pt"
    torch.save(saved, path)
    fresh = _load(torch.load(path, weights_only=True))
    assert torch.equal(fresh.fp8_meta["scaling_fwd"].amax_history, saved["_extra_state"]["amax_history_fwd"])
    data = path.read_bytes()
    for damaged in (b"", data[: len(data) // 2]):
        path.write_bytes(damaged)
        with pytest.raises((RuntimeError, EOFError, OSError, ValueError)):
            torch.load(path, weights_only=True)


# ------------------------------------------------------------------ a checkpoint from another recipe


def test_what_a_different_recipe_resets_after_loading(saved):
    """The loaded DelayedScaling state is installed as saved. Another
    DelayedScaling keeps the scales and the newest history rows (warning);
    a stateless recipe drops them (warning)."""
    fresh = _load(saved)
    loaded = {k: v.clone() for k, v in saved["_extra_state"].items() if isinstance(v, torch.Tensor)}
    assert fresh.fp8_meta["recipe"] == recipe.DelayedScaling(amax_history_len=4)
    with pytest.warns(UserWarning, match="Quantizer is being updated"):
        with torch.no_grad(), te.autocast(recipe=recipe.DelayedScaling(amax_history_len=2)):
            fresh(torch.randn(16, 16))  # (no_grad: no update, the state is as adopted)
    state = fresh.fp8_meta["scaling_fwd"]
    assert torch.equal(state.scale, loaded["scale_fwd"])
    assert torch.equal(state.amax_history[1:], loaded["amax_history_fwd"][-1:])
    with pytest.warns(UserWarning, match="Recipe type changed from DelayedScaling to Float8CurrentScaling"):
        with te.autocast(recipe=recipe.Float8CurrentScaling()):
            fresh(torch.randn(16, 16))
    assert not fresh.fp8_meta["scaling_fwd"].delayed
    extra = fresh.state_dict()["_extra_state"]
    assert isinstance(extra, torch.Tensor) and extra.numel() == 0  # the delayed state is gone
