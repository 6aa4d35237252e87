"""MeshResource: which mesh axis carries each kind of parallelism (reference §5.1).

    with te_jax.autocast(enabled=True, recipe=r, mesh_resource=te_jax.MeshResource()):
        ...

te-jax runs on one device so far: a MeshResource whose axes are all None (the
default) is accepted, and naming any mesh axis raises NotImplementedError.
autocast installs its mesh_resource with global_shard_guard for the duration
of the context; global_mesh_resource() reads it.
"""

from __future__ import annotations

import contextlib
import dataclasses


@dataclasses.dataclass(frozen=True)
class MeshResource:
    """Mesh axis names per parallelism kind (None: that kind is not used).

    dp: data parallel (batch); tp: tensor parallel (heads, hidden);
    tpsp: tensor + sequence parallel; fsdp: sharded weights (and batch);
    pp: pipeline; cp: context parallel (sequence); ep: expert parallel."""

    dp_resource: str | None = None
    tp_resource: str | None = None
    tpsp_resource: str | None = None
    fsdp_resource: str | None = None
    pp_resource: str | None = None
    cp_resource: str | None = None
    ep_resource: str | None = None


_GLOBAL_MESH_RESOURCE = MeshResource()


def _check_single_device(resource) -> MeshResource:
    if resource is None:
        return MeshResource()
    if not isinstance(resource, MeshResource):
        raise TypeError(f"argument 'mesh_resource' must be None or a MeshResource, got {type(resource).__name__}")
    named = {f.name: getattr(resource, f.name) for f in dataclasses.fields(resource)}
    named = {k: v for k, v in named.items() if v is not None}
    if named:
        raise NotImplementedError(
            f"te-jax runs on one device so far: argument 'mesh_resource' must name no mesh axes, got {named} "
            "(data, tensor, sequence, context, pipeline and expert parallelism are not yet available in te-jax)"
        )
    return resource


@contextlib.contextmanager
def global_shard_guard(resource: MeshResource | None = None):
    """Makes `resource` the global MeshResource inside the context (None: MeshResource())."""
    global _GLOBAL_MESH_RESOURCE
    resource = _check_single_device(resource)
    previous = _GLOBAL_MESH_RESOURCE
    _GLOBAL_MESH_RESOURCE = resource
    try:
        yield
    finally:
        _GLOBAL_MESH_RESOURCE = previous


def global_mesh_resource() -> MeshResource:
    """The MeshResource of the innermost autocast / global_shard_guard (MeshResource() outside)."""
    return _GLOBAL_MESH_RESOURCE
