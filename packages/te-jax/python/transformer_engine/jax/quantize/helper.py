"""autocast (the global FP8 recipe of the Flax modules) and update_collections.

    with te_jax.autocast(enabled=True, recipe=recipe.DelayedScaling()):
        variables = model.init(rng, x)               # creates the "fp8_metas" collection
        ...jax.value_and_grad(loss_fn, argnums=(0, 1))(params, other_vars, x)...
    other_vars = te_jax.update_collections(other_grads, other_vars)

autocast sets a process-wide recipe that te-jax's Flax modules read when they
are traced (not when they run): a function jitted inside an autocast keeps the
recipe it was traced with, whatever context it is later called in, because
JAX's cache key does not include this global. Outside every autocast, and
inside autocast(enabled=False), the modules run high precision.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping

from transformer_engine.common import recipe as recipe_lib

from ..sharding import global_shard_guard
from .quantizer_set import check_recipe_supported

NVTE_FP8_COLLECTION_NAME = "fp8_metas"
"""The Flax variable collection holding delayed-scaling state (each quantizer's scale and amax_history)."""

_ACTIVE_RECIPE: recipe_lib.Recipe | None = None  # None: FP8 disabled


@contextlib.contextmanager
def autocast(enabled: bool = False, recipe: recipe_lib.Recipe | None = None, mesh_resource=None):
    """Runs te-jax's Flax modules in FP8 with `recipe` inside the context.

    enabled: False (the default, unlike PyTorch's autocast) runs high precision,
    also inside an enabled autocast; leaving the context restores the outer state.
    recipe: None means DelayedScaling(). Supported: DelayedScaling (margin,
    fp8_format, amax_history_len and amax_compute_algo "max" | "most_recent" are
    honoured; over a mesh amaxes are always max-reduced over every axis but pp's,
    whatever reduce_amax says, as in the reference's JAX), Float8CurrentScaling,
    MXFP8BlockScaling, Float8BlockScaling and NVFP4BlockScaling; custom recipes raise
    NotImplementedError when enabled.
    mesh_resource: a MeshResource (or None: MeshResource()); with a mesh in scope
    (jax.set_mesh) the ops partition over the axes it names (docs/te_jax.md).
    """
    global _ACTIVE_RECIPE
    if not isinstance(enabled, bool):
        raise TypeError(f"argument 'enabled' of autocast must be a bool, got {type(enabled).__name__}")
    if recipe is None:
        recipe = recipe_lib.DelayedScaling()
    if enabled:
        check_recipe_supported(recipe, "autocast")
    elif not isinstance(recipe, recipe_lib.Recipe):  # a disabled context still refuses a non-recipe
        raise TypeError(
            f"argument 'recipe' must be None or a transformer_engine.common.recipe recipe, got {type(recipe).__name__}"
        )
    with global_shard_guard(mesh_resource):
        previous = _ACTIVE_RECIPE
        _ACTIVE_RECIPE = recipe if enabled else None
        try:
            yield
        finally:
            _ACTIVE_RECIPE = previous


def fp8_autocast(enabled: bool = False, fp8_recipe: recipe_lib.Recipe | None = None, mesh_resource=None):
    """Deprecated name of autocast (its recipe argument was called fp8_recipe)."""
    warnings.warn(
        "fp8_autocast is deprecated; use transformer_engine.jax.autocast(enabled, recipe, mesh_resource)",
        DeprecationWarning,
        stacklevel=2,
    )
    return autocast(enabled=enabled, recipe=fp8_recipe, mesh_resource=mesh_resource)


def get_fp8_recipe() -> recipe_lib.Recipe | None:
    """The recipe of the innermost enabled autocast, or None when FP8 is disabled."""
    return _ACTIVE_RECIPE


def is_fp8_enabled() -> bool:
    return _ACTIVE_RECIPE is not None


def update_collections(new, original):
    """original with each top-level collection of `new` put in place of its own.

    Collections of `original` that `new` lacks are kept, collections only in
    `new` are added; a collection is replaced whole, not merged. The result is a
    dict when `original` is a dict (nested FrozenDicts unfrozen), a FrozenDict
    when it is one. The training loop's use: `other_vars =
    update_collections(other_grads, other_vars)`, where the "gradient" of the
    "fp8_metas" collection is its updated delayed-scaling state.
    """
    for name, value in (("new", new), ("original", original)):
        if not isinstance(value, Mapping):
            raise TypeError(
                f"argument '{name}' of update_collections must be a dict or FrozenDict of collections, "
                f"got {type(value).__name__}"
            )
    merged = {**original, **new}
    from flax.core import FrozenDict, unfreeze  # only here: the rest of this module needs no flax

    return FrozenDict(merged) if isinstance(original, FrozenDict) else unfreeze(merged)
