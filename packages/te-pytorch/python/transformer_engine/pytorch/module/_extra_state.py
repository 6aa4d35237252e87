"""The `_extra_state` entry of a TE module's state_dict: its FP8 state.

Only DelayedScaling has state worth saving. It is stored as a plain dict of
tensors and numbers, which torch.save/torch.load(weights_only=True) and
distributed checkpointing handle without pickling any code:

    {"version": 2, "recipe": {"type": "DelayedScaling", "margin": ..., ...},
     "scale_fwd": [3n], "amax_history_fwd": [L, 3n],
     "scale_bwd": [2n], "amax_history_bwd": [L, 2n],
     "checksum": CRC-32 of the version, the recipe and the four tensors}

Versions: 1 is the same dict without "checksum" (checkpoints written before
version 2); it still loads, with every check below but the checksum. A
version this code does not know is an error.

A module without FP8 state saves an empty uint8 tensor, as the reference does.
On load, None or an empty tensor mean "no FP8 state" (the module keeps the
FP8 state it has). A non-empty uint8 tensor is the reference library's
pickled format: it is only unpickled when NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1
(unpickling runs arbitrary code), and ignored with a warning otherwise.

Loading validates the state (ValueError naming the key and the rule): every
key present, a known fp8_format name, a recipe stored as a dict, scales
finite and > 0, amax histories finite and >= 0 with amax_history_len rows,
then the checksum (a flipped bit that passes the other checks). The module's
_load_from_state_dict adds the state_dict key (e.g. "0.fc1._extra_state").

A checkpoint from another recipe: loading installs the checkpoint's
DelayedScaling state (its recipe, scales and histories) whatever the module
ran before. The first forward under a different recipe then warns and
rebuilds the state (TransformerEngineBaseModule.init_fp8_metadata): under
another DelayedScaling (other margin, format or amax_history_len) the
scales and the newest amax_history_len - 1 history rows are kept and the
staging row restarts at 0; under any other recipe (current scaling, MXFP8,
FP8 block, NVFP4), which keeps no state, the loaded scales and histories are
dropped.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
import zlib

import torch

from transformer_engine.common.recipe import DelayedScaling, Format

VERSION = 2
_KNOWN_VERSIONS = (1, 2)  # 1: no checksum
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


_TENSOR_KEYS = ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")
_WHERE = "a checkpoint's _extra_state"


def _require(data: dict, key: str, where: str):
    if key not in data:
        raise ValueError(f"{where} has no {key!r} entry (required)")
    return data[key]


def _recipe_from_dict(data) -> DelayedScaling:
    if not isinstance(data, dict):
        raise ValueError(
            f"{_WHERE}: 'recipe' must be a dict of the recipe's fields (as saved by get_extra_state), "
            f"got {type(data).__name__} {data!r}"
        )
    where = f"{_WHERE}['recipe']"
    if _require(data, "type", where) != "DelayedScaling":
        raise ValueError(f"unknown recipe type in {_WHERE}: {data.get('type')!r} (expected 'DelayedScaling')")
    name = _require(data, "fp8_format", where)
    valid = [f.name for f in Format]
    if name not in valid:
        raise ValueError(f"{where}: unknown fp8_format {name!r}; valid names: {', '.join(valid)}")
    kwargs = {key: _require(data, key, where) for key in (*_RECIPE_FIELDS, "amax_compute_algo")}
    try:
        return DelayedScaling(fp8_format=Format[name], **kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: invalid recipe fields: {err}") from err


def _check_tensors(tensors: dict, recipe: DelayedScaling) -> dict:
    """Scales finite and > 0, amax histories finite and >= 0, shapes consistent
    with each other and with the recipe's amax_history_len: a bad value would
    otherwise poison every later step."""
    for suffix in ("fwd", "bwd"):
        scale, history = tensors[f"scale_{suffix}"], tensors[f"amax_history_{suffix}"]
        for key, value in ((f"scale_{suffix}", scale), (f"amax_history_{suffix}", history)):
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                raise ValueError(f"{_WHERE}: {key} must be a floating-point tensor, got {type(value).__name__}")
        if scale.dim() != 1 or history.dim() != 2 or history.shape[1] != scale.shape[0]:
            raise ValueError(
                f"{_WHERE}: scale_{suffix} must be [n] and amax_history_{suffix} [amax_history_len, n], got "
                f"{tuple(scale.shape)} and {tuple(history.shape)}"
            )
        if history.shape[0] != recipe.amax_history_len:
            raise ValueError(
                f"{_WHERE}: amax_history_{suffix} has {history.shape[0]} rows but the stored recipe's "
                f"amax_history_len is {recipe.amax_history_len}"
            )
        if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
            raise ValueError(f"{_WHERE}: scale_{suffix} must be finite and > 0, got {scale.tolist()}")
        if not bool(torch.isfinite(history).all()) or not bool((history >= 0).all()):
            raise ValueError(f"{_WHERE}: amax_history_{suffix} must be finite and >= 0")
    return tensors


def _checksum(version, recipe: dict, tensors: dict) -> int:
    """CRC-32 over the version, the recipe's fields (as sorted JSON) and each
    tensor's shape and FP32 bytes (the dtype a state is kept in)."""
    crc = zlib.crc32(json.dumps([version, recipe], sort_keys=True).encode())
    for key in _TENSOR_KEYS:
        value = tensors[key].detach().to("cpu", torch.float32).contiguous()
        crc = zlib.crc32(repr(tuple(value.shape)).encode(), crc)
        crc = zlib.crc32(value.numpy().tobytes(), crc)
    return crc


def _check_checksum(state: dict, recipe: dict, tensors: dict) -> None:
    stored = _require(state, "checksum", _WHERE)
    if isinstance(stored, bool) or not isinstance(stored, int):
        raise ValueError(f"{_WHERE}: 'checksum' must be an int (CRC-32), got {type(stored).__name__}")
    actual = _checksum(state["version"], recipe, tensors)
    if stored != actual:
        raise ValueError(
            f"{_WHERE}: 'checksum' {stored:#010x} does not match the FP8 state's CRC-32 {actual:#010x}: "
            "the recipe, scales or amax histories were changed after saving (a corrupted checkpoint?)"
        )


def save_extra_state(fp8_meta: dict):
    recipe = fp8_meta["recipe"]
    if recipe is None or not fp8_meta["scaling_fwd"].delayed:  # (only delayed scaling has state)
        return torch.empty(0, dtype=torch.uint8)
    state = {"version": VERSION, "recipe": _recipe_to_dict(recipe)}
    for key, suffix in (("scaling_fwd", "fwd"), ("scaling_bwd", "bwd")):
        meta = fp8_meta[key]
        state[f"scale_{suffix}"] = meta.scale.detach().clone()
        state[f"amax_history_{suffix}"] = meta.amax_history.detach().clone()
    state["checksum"] = _checksum(VERSION, state["recipe"], state)
    return state


def copy_loaded_state(fp8_meta: dict, tensors: dict, owner: str) -> None:
    """Copies a loaded checkpoint's scales and amax histories (load_extra_state's
    tensors) into fp8_meta, every shape checked first: a checkpoint of another
    module must not leave a half-copied state."""
    pairs = []
    for key, suffix in (("scaling_fwd", "fwd"), ("scaling_bwd", "bwd")):
        meta = fp8_meta[key]
        pairs += [(f"scale_{suffix}", meta.scale), (f"amax_history_{suffix}", meta.amax_history)]
    for name, mine in pairs:
        if tensors[name].shape != mine.shape:
            raise ValueError(
                f"{owner}: the checkpoint's {name} has shape {tuple(tensors[name].shape)}, expected {tuple(mine.shape)}"
            )
    for name, mine in pairs:
        mine.copy_(tensors[name])


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
    tensors = {k: _require(data, k, "a pickled _extra_state") for k in _TENSOR_KEYS}
    return recipe, _check_tensors(tensors, recipe)


def load_extra_state(state):
    """(recipe, tensors) from a saved _extra_state, or None when it holds no FP8 state."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return None if state.numel() == 0 else _load_reference_pickle(state)
    if not isinstance(state, dict):
        raise ValueError(
            "unrecognised _extra_state in a Transformer Engine checkpoint (expected a dict with "
            f"'version' {' or '.join(map(str, _KNOWN_VERSIONS))}, got {type(state).__name__})"
        )
    version = _require(state, "version", _WHERE)
    if isinstance(version, bool) or version not in _KNOWN_VERSIONS:
        raise ValueError(
            f"unrecognised _extra_state in a Transformer Engine checkpoint: unknown 'version' {version!r}; "
            f"this te-pytorch reads versions "
            f"{', '.join(map(str, _KNOWN_VERSIONS))} (a checkpoint from a newer release?)"
        )
    stored_recipe = _require(state, "recipe", _WHERE)
    recipe = _recipe_from_dict(stored_recipe)
    tensors = _check_tensors({k: _require(state, k, _WHERE) for k in _TENSOR_KEYS}, recipe)
    if version >= 2:
        _check_checksum(state, stored_recipe, tensors)
    return recipe, tensors
