"""The `_extra_state` entry of a TE module's state_dict: its FP8 state.

Only DelayedScaling has state worth saving. It is stored as a plain dict of
tensors and numbers, which torch.save/torch.load(weights_only=True) and
distributed checkpointing handle without pickling any code:

    {"version": 1, "recipe": {"type": "DelayedScaling", "margin": ..., ...},
     "scale_fwd": [3n], "amax_history_fwd": [L, 3n],
     "scale_bwd": [2n], "amax_history_bwd": [L, 2n]}

A module without FP8 state saves an empty uint8 tensor, as the reference does.
On load, None or an empty tensor mean "no FP8 state". A non-empty uint8
tensor is the reference library's pickled format: it is only unpickled when
NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1 (unpickling runs arbitrary code), and
ignored with a warning otherwise.
"""

from __future__ import annotations

import os
import pickle
import warnings

import torch

from transformer_engine.common.recipe import DelayedScaling, Format

VERSION = 1
UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"
_RECIPE_FIELDS = ("margin", "amax_history_len", "reduce_amax", "fp8_dpa", "fp8_mha")


def _recipe_to_dict(recipe) -> dict:
    out = {"type": "DelayedScaling", "fp8_format": recipe.fp8_format.name}
    out.update({name: getattr(recipe, name) for name in _RECIPE_FIELDS})
    # A callable amax algorithm cannot be stored as data: the loaded recipe
    # uses "max", and the next autocast with the real recipe re-syncs it.
    algo = recipe.amax_compute_algo
    out["amax_compute_algo"] = algo if isinstance(algo, str) else "max"
    return out


def _recipe_from_dict(data: dict) -> DelayedScaling:
    if data.get("type") != "DelayedScaling":
        raise ValueError(f"unknown recipe type in a checkpoint's _extra_state: {data.get('type')!r}")
    kwargs = {name: data[name] for name in _RECIPE_FIELDS}
    return DelayedScaling(fp8_format=Format[data["fp8_format"]], amax_compute_algo=data["amax_compute_algo"], **kwargs)


def save_extra_state(fp8_meta: dict):
    recipe = fp8_meta["recipe"]
    if recipe is None or not fp8_meta["scaling_fwd"].delayed:  # (only delayed scaling has state)
        return torch.empty(0, dtype=torch.uint8)
    state = {"version": VERSION, "recipe": _recipe_to_dict(recipe)}
    for key, suffix in (("scaling_fwd", "fwd"), ("scaling_bwd", "bwd")):
        meta = fp8_meta[key]
        state[f"scale_{suffix}"] = meta.scale.detach().clone()
        state[f"amax_history_{suffix}"] = meta.amax_history.detach().clone()
    return state


def _load_reference_pickle(state: torch.Tensor):
    if os.environ.get(UNSAFE_PICKLE_EXTRA_STATE_ENV) != "1":
        warnings.warn(
            "ignoring a pickled _extra_state (the reference library's format): "
            f"set {UNSAFE_PICKLE_EXTRA_STATE_ENV}=1 to unpickle it if you trust the "
            "checkpoint",
            stacklevel=4,
        )
        return None
    data = pickle.loads(state.detach().cpu().numpy().tobytes())
    recipe = data.get("recipe")
    if not isinstance(recipe, DelayedScaling):
        return None
    return recipe, {k: data[k] for k in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")}


def load_extra_state(state):
    """(recipe, tensors) from a saved _extra_state, or None when it holds no FP8 state."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return None if state.numel() == 0 else _load_reference_pickle(state)
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise ValueError(
            "unrecognised _extra_state in a Transformer Engine checkpoint (expected "
            f"a dict with version {VERSION}, got {type(state).__name__})"
        )
    tensors = {k: state[k] for k in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")}
    return _recipe_from_dict(state["recipe"]), tensors
