"""transformer_engine.jax.autocast, fp8_autocast, MeshResource and
update_collections: the recipe each context makes active (nesting, restoring,
the reference's defaults), the recipes and meshes refused, and how collections
merge. The Flax modules that read the recipe: test_jax_flax_dense.py."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_engine.jax as te_jax
from transformer_engine.common import recipe
from transformer_engine.jax.quantize import get_fp8_recipe, is_fp8_enabled
from transformer_engine.jax.sharding import MeshResource, global_mesh_resource

pytestmark = pytest.mark.recipe


def _active():
    return get_fp8_recipe(), global_mesh_resource()


def test_defaults_disabled_and_delayed():
    assert get_fp8_recipe() is None and not is_fp8_enabled()
    with te_jax.autocast():  # enabled=False by default (PyTorch's default is True)
        assert get_fp8_recipe() is None and not is_fp8_enabled()
    with te_jax.autocast(enabled=True):  # recipe None means DelayedScaling()
        active = get_fp8_recipe()
        assert is_fp8_enabled() and isinstance(active, recipe.DelayedScaling)
        assert (active.amax_history_len, active.fp8_format, active.margin) == (1024, recipe.Format.HYBRID, 0)
        assert global_mesh_resource() == MeshResource()
    assert get_fp8_recipe() is None


def test_nesting_restores_the_outer_state():
    delayed = recipe.DelayedScaling(amax_history_len=16)
    current = recipe.Float8CurrentScaling()
    mesh = MeshResource()
    with te_jax.autocast(enabled=True, recipe=delayed, mesh_resource=mesh):
        assert get_fp8_recipe() is delayed and global_mesh_resource() is mesh
        with te_jax.autocast(enabled=False, recipe=current):
            assert get_fp8_recipe() is None
        assert get_fp8_recipe() is delayed
        with te_jax.autocast(enabled=True, recipe=current):
            assert get_fp8_recipe() is current
            assert global_mesh_resource() == MeshResource() and global_mesh_resource() is not mesh
        assert _active() == (delayed, mesh)
        with pytest.raises(KeyError), te_jax.autocast(enabled=True, recipe=current):
            raise KeyError("an exception inside the context")
        assert _active() == (delayed, mesh)
    assert get_fp8_recipe() is None


def test_fp8_autocast_is_a_deprecated_alias():
    delayed = recipe.DelayedScaling(margin=1)
    with pytest.warns(DeprecationWarning, match="fp8_autocast is deprecated; use transformer_engine.jax.autocast"):
        context = te_jax.fp8_autocast(enabled=True, fp8_recipe=delayed)
    with context:
        assert get_fp8_recipe() is delayed
    assert get_fp8_recipe() is None


@pytest.mark.parametrize(
    "unsupported",
    [lambda: recipe.CustomRecipe(qfactory=lambda role: None)],
    ids=["CustomRecipe"],
)
def test_unsupported_recipes_raise_when_enabled(unsupported):
    fp8_recipe = unsupported()
    with pytest.raises(NotImplementedError) as error, te_jax.autocast(enabled=True, recipe=fp8_recipe):
        pass
    message = str(error.value)
    assert message.startswith(f"autocast: {type(fp8_recipe).__name__} is not supported by te-jax yet")
    assert "supported: DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling" in message
    assert "NVFP4BlockScaling; custom recipes" in message and "not yet available" in message
    assert get_fp8_recipe() is None  # a refused context changes nothing
    with te_jax.autocast(enabled=False, recipe=fp8_recipe):  # disabled: the recipe is never used
        assert get_fp8_recipe() is None


def test_bad_arguments():
    with pytest.raises(NotImplementedError, match="callables are not supported"):
        with te_jax.autocast(enabled=True, recipe=recipe.DelayedScaling(amax_compute_algo=lambda h: h[0])):
            pass
    with pytest.raises(TypeError, match="argument 'recipe' must be None or a transformer_engine.common.recipe"):
        with te_jax.autocast(enabled=True, recipe="delayed"):
            pass
    with pytest.raises(TypeError, match="argument 'recipe' must be None or a transformer_engine.common.recipe"):
        with te_jax.autocast(enabled=False, recipe="delayed"):
            pass
    with pytest.raises(TypeError, match="argument 'enabled' of autocast must be a bool, got str"):
        with te_jax.autocast(enabled="yes"):
            pass
    assert get_fp8_recipe() is None


def test_mesh_resource_fields_and_guard():
    assert [f for f in MeshResource.__dataclass_fields__] == [
        "dp_resource",
        "tp_resource",
        "tpsp_resource",
        "fsdp_resource",
        "pp_resource",
        "cp_resource",
        "ep_resource",
    ]
    assert te_jax.MeshResource is MeshResource
    named = MeshResource(dp_resource="data", tp_resource="model")
    with te_jax.autocast(enabled=True, mesh_resource=named):  # axes are read by the ops under a mesh
        assert global_mesh_resource() is named
    with pytest.raises(TypeError, match="argument 'tp_resource' of MeshResource must be None or a mesh axis name"):
        MeshResource(tp_resource=4)
    with pytest.raises(TypeError, match="argument 'mesh_resource' must be None or a MeshResource, got dict"):
        with te_jax.autocast(mesh_resource={"dp_resource": None}):
            pass
    assert _active() == (None, MeshResource())


def test_update_collections():
    pytest.importorskip("flax")
    from flax.core import FrozenDict

    params = {"kernel": np.ones(2)}
    original = {"params": params, "fp8_metas": {"x_scale": np.ones(1)}, "cache": {"k": np.zeros(1)}}
    new = {"fp8_metas": {"x_scale": np.full(1, 2.0)}, "extra": {"y": np.ones(1)}}
    merged = te_jax.update_collections(new, original)
    assert type(merged) is dict and set(merged) == {"params", "fp8_metas", "cache", "extra"}
    assert merged["params"]["kernel"] is params["kernel"] and merged["cache"] == original["cache"]  # kept
    assert merged["fp8_metas"]["x_scale"][0] == 2.0 and merged["extra"] == new["extra"]  # replaced, added
    assert original["fp8_metas"]["x_scale"][0] == 1.0  # the inputs are not modified
    # A collection is replaced whole: keys of the old one that the new one lacks are gone.
    merged = te_jax.update_collections({"fp8_metas": {}}, original)
    assert merged["fp8_metas"] == {}
    # The result's type follows `original`; a dict result holds no FrozenDict.
    frozen = te_jax.update_collections(new, FrozenDict(original))
    assert isinstance(frozen, FrozenDict) and frozen["fp8_metas"]["x_scale"][0] == 2.0
    thawed = te_jax.update_collections(FrozenDict(new), original)
    assert type(thawed) is dict and type(thawed["fp8_metas"]) is dict
    with pytest.raises(TypeError, match="argument 'new' of update_collections must be a dict or FrozenDict"):
        te_jax.update_collections([("fp8_metas", {})], original)
    with pytest.raises(TypeError, match="argument 'original' of update_collections must be a dict or FrozenDict"):
        te_jax.update_collections(new, None)
