"""MeshResource, logical sharding axes and the mesh helpers (reference §5.1)::

    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))
    with jax.set_mesh(mesh), te_jax.autocast(enabled=True, recipe=r,
                                             mesh_resource=MeshResource(dp_resource="dp", tp_resource="tp")):
        ...jit(train_step)...

MeshResource names the mesh axis of each kind of parallelism. Tensors are
annotated with *logical* axes: te's own names below (BATCH_AXES, HIDDEN_TP_AXES,
W_TP_AXES, ...), which get_sharding_map_logic_axis_to_mesh_axis maps to mesh
axes through the active MeshResource, or flax's logical names ('batch',
'embed', 'mlp', ...), mapped through flax's logical axis rules
(flax.linen.logical_axis_rules). The ops (dense, layernorm_dense, layernorm_mlp,
layernorm, activation) read these axes and partition themselves over the mesh
(transformer_engine/jax/_partition.py). The mesh is the one of `jax.set_mesh`
(or the deprecated `with mesh:`); without a mesh everything runs on one device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import jax
from jax.sharding import PartitionSpec

BATCH_AXES = "nvte_batch"
SEQLEN_AXES = "nvte_seqlen"
SEQLEN_TP_AXES = "nvte_seqlen_tp"
SEQLEN_CP_AXES = "nvte_seqlen_cp"
HEAD_AXES = "nvte_head"
HIDDEN_AXES = "nvte_hidden"
HIDDEN_TP_AXES = "nvte_hidden_tp"
JOINED_AXES = "nvte_joined"
W_NO_SHARD_AXES = "nvte_w_no_shard"
W_FSDP_AXES = "nvte_w_fsdp"
W_TP_AXES = "nvte_w_tp"
W_JOINED_AXES = "nvte_w_joined"


@dataclasses.dataclass(frozen=True)
class MeshResource:
    """Mesh axis names per parallelism kind (None: that kind is not used).

    dp: data parallel (batch); tp: tensor parallel (heads, hidden);
    tpsp: tensor + sequence parallel; fsdp: sharded weights (and batch);
    pp: pipeline; cp: context parallel (sequence); ep: expert parallel.
    te-jax partitions over dp, fsdp, tp and tpsp; cp, pp and ep are not yet
    supported (an op raises NotImplementedError when one is set and in the mesh)."""

    dp_resource: str | None = None
    tp_resource: str | None = None
    tpsp_resource: str | None = None
    fsdp_resource: str | None = None
    pp_resource: str | None = None
    cp_resource: str | None = None
    ep_resource: str | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and not isinstance(value, str):
                raise TypeError(
                    f"argument '{field.name}' of MeshResource must be None or a mesh axis name (str), "
                    f"got {type(value).__name__}"
                )


_GLOBAL_MESH_RESOURCE = MeshResource()


def _checked(resource) -> MeshResource:
    if resource is None:
        return MeshResource()
    if not isinstance(resource, MeshResource):
        raise TypeError(f"argument 'mesh_resource' must be None or a MeshResource, got {type(resource).__name__}")
    return resource


@contextlib.contextmanager
def global_shard_guard(resource: MeshResource | None):
    """Makes `resource` the global MeshResource inside the context (None: MeshResource())."""
    global _GLOBAL_MESH_RESOURCE
    resource = _checked(resource)
    previous = _GLOBAL_MESH_RESOURCE
    _GLOBAL_MESH_RESOURCE = resource
    try:
        yield
    finally:
        _GLOBAL_MESH_RESOURCE = previous


def global_mesh_resource() -> MeshResource:
    """The MeshResource of the innermost autocast / global_shard_guard (MeshResource() outside)."""
    return _GLOBAL_MESH_RESOURCE


def current_mesh():
    """The mesh in scope: jax.set_mesh's (concrete) or the deprecated `with mesh:`'s; None without one."""
    from jax._src import mesh as mesh_lib  # the only home of the context's concrete mesh

    physical = mesh_lib.thread_resources.env.physical_mesh
    if not physical.empty:
        return physical
    concrete = mesh_lib.get_concrete_mesh() if hasattr(mesh_lib, "get_concrete_mesh") else None
    if concrete is not None and not concrete.empty:
        return concrete
    return None


def is_mesh_available() -> bool:
    """True inside jax.set_mesh(mesh) (or `with mesh:`)."""
    return current_mesh() is not None


def get_all_mesh_axes() -> tuple[str, ...]:
    mesh = current_mesh()
    return () if mesh is None else tuple(mesh.axis_names)


def num_of_devices() -> int:
    return len(jax.devices())


def get_num_devices_in_mesh(mesh=None) -> int:
    mesh = mesh if mesh is not None else current_mesh()
    return 1 if mesh is None else int(mesh.devices.size)


def get_mesh_axis_size(axis, mesh=None) -> int:
    """The size of mesh axis `axis` (1 for None or without a mesh)."""
    mesh = mesh if mesh is not None else current_mesh()
    if axis is None or mesh is None:
        return 1
    if axis not in mesh.shape:
        raise ValueError(f"argument 'axis' must be an axis of the mesh {tuple(mesh.axis_names)}, got {axis!r}")
    return int(mesh.shape[axis])


def get_mesh_axis_rank(axis, mesh=None):
    """This shard's index along `axis` (inside shard_map; 0 for None)."""
    del mesh
    return 0 if axis is None else jax.lax.axis_index(axis)


def _in_mesh(axis) -> str | None:
    """axis if the mesh in scope has it with size > 1, else None (an absent axis shards nothing)."""
    return axis if axis is not None and _mesh_axis_size_or_zero(axis) > 1 else None


def _mesh_axis_size_or_zero(axis) -> int:
    mesh = current_mesh()
    return 0 if mesh is None or axis not in mesh.shape else int(mesh.shape[axis])


def _batch_rule(gsr: MeshResource):
    # NVTE_OUTER_BATCH_FSDP_DIM=1 puts fsdp before dp on the batch dim (the reference's switch).
    outer_fsdp = bool(int(os.environ.get("NVTE_OUTER_BATCH_FSDP_DIM", "0")))
    order = (gsr.fsdp_resource, gsr.dp_resource) if outer_fsdp else (gsr.dp_resource, gsr.fsdp_resource)
    axes = tuple(dict.fromkeys(a for a in order if a is not None))
    return None if not axes else axes[0] if len(axes) == 1 else axes


def get_sharding_map_logic_axis_to_mesh_axis() -> dict:
    """{te logical axis: mesh axis (or tuple of axes, or None)} under the active MeshResource.

    batch -> dp and fsdp; heads / hidden_tp / w_tp -> tpsp if set, else tp;
    seqlen_tp -> tpsp; seqlen_cp -> cp; w_fsdp -> fsdp; the others unsharded."""
    gsr = global_mesh_resource()
    tp = gsr.tpsp_resource if gsr.tpsp_resource is not None else gsr.tp_resource
    return {
        BATCH_AXES: _batch_rule(gsr),
        SEQLEN_AXES: None,
        SEQLEN_TP_AXES: gsr.tpsp_resource,
        SEQLEN_CP_AXES: gsr.cp_resource,
        HEAD_AXES: tp,
        HIDDEN_AXES: None,
        HIDDEN_TP_AXES: tp,
        JOINED_AXES: None,
        W_NO_SHARD_AXES: None,
        W_FSDP_AXES: gsr.fsdp_resource,
        W_TP_AXES: tp,
        W_JOINED_AXES: None,
    }


def _flax_rule(name: str):
    """The mesh axis flax's logical axis rules give `name` (None when flax has no rule for it)."""
    try:
        from flax.linen import partitioning as nn_partitioning
    except ImportError:  # flax is optional: without it only te's own logical names map
        return None
    for logical, mesh_axis in nn_partitioning.get_axis_rules():
        if logical == name:
            return mesh_axis
    return None


def logical_to_mesh_axis(name):
    """One logical axis name (te's or flax's; None: unsharded) -> mesh axis / axes / None."""
    if name is None:
        return None
    te_map = get_sharding_map_logic_axis_to_mesh_axis()
    mesh_axis = te_map[name] if name in te_map else _flax_rule(name)
    if isinstance(mesh_axis, (tuple, list)):
        present = tuple(a for a in mesh_axis if _in_mesh(a) is not None)
        return None if not present else present[0] if len(present) == 1 else present
    return _in_mesh(mesh_axis)


def generate_pspec(logical_axis_names) -> PartitionSpec:
    """The PartitionSpec of logical axes (each te's, flax's or None); a mesh axis used twice shards
    only its first dim (XLA allows each mesh axis once per array)."""
    used, spec = set(), []
    for name in logical_axis_names:
        axis = logical_to_mesh_axis(name)
        axes = axis if isinstance(axis, tuple) else (axis,) if axis is not None else ()
        if any(a in used for a in axes):
            axis = None
        used.update(axes if axis is not None else ())
        spec.append(axis)
    return PartitionSpec(*spec)


def get_padded_spec(spec, ndim: int) -> tuple:
    """spec as a tuple of ndim entries (None-padded on the right)."""
    if spec is None:
        return (None,) * ndim
    spec = tuple(spec)
    if len(spec) > ndim:
        raise ValueError(f"argument 'spec' has {len(spec)} entries, more than ndim={ndim}")
    return spec + (None,) * (ndim - len(spec))


def with_sharding_constraint(x, pspec):
    """jax.lax.with_sharding_constraint(x, pspec) when a mesh is in scope; x unchanged otherwise."""
    mesh = current_mesh()
    if pspec is None or mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, pspec))


def with_sharding_constraint_by_logical_axes(x, logical_axis_names):
    """x constrained to the sharding its logical axes name (unchanged for empty axes or no mesh)."""
    if not logical_axis_names or current_mesh() is None:
        return x
    if len(logical_axis_names) != x.ndim:
        raise ValueError(
            f"argument 'logical_axis_names' must name one axis per dim of x (ndim={x.ndim}), got {logical_axis_names!r}"
        )
    return with_sharding_constraint(x, generate_pspec(logical_axis_names))


def get_active_resource_axis(kind: str = "tp") -> str | None:
    """The mesh axis of `kind` ('dp', 'tp', 'tpsp', 'fsdp', 'pp', 'cp', 'ep') if it is in the mesh."""
    field = f"{kind}_resource"
    if field not in MeshResource.__dataclass_fields__:
        raise ValueError(f"argument 'kind' must be one of dp, tp, tpsp, fsdp, pp, cp, ep, got {kind!r}")
    return _in_mesh(getattr(global_mesh_resource(), field))


def lax_paral_op(x, ops, mesh_resource, mesh=None, **kwargs):
    """``ops(x, mesh_resource, **kwargs)`` (a collective such as jax.lax.psum) when the axis is set."""
    del mesh
    return x if mesh_resource is None else ops(x, mesh_resource, **kwargs)


def _present(*axes) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for a in axes if _in_mesh(a) is not None))


def all_reduce_sum_along_dp_fsdp(x, mesh=None):
    gsr = global_mesh_resource()
    axes = _present(gsr.dp_resource, gsr.fsdp_resource)
    return jax.lax.psum(x, axes) if axes else x


def all_reduce_sum_along_dp_fsdp_tpsp(x, mesh=None):
    gsr = global_mesh_resource()
    axes = _present(gsr.dp_resource, gsr.fsdp_resource, gsr.tpsp_resource)
    return jax.lax.psum(x, axes) if axes else x


def all_reduce_max_along_all_axes_except_PP(x, mesh=None):
    """max over every mesh axis but pp's: the delayed-scaling amax reduction (inside shard_map)."""
    axes = amax_reduction_axes()
    return jax.lax.pmax(x, axes) if axes else x


def amax_reduction_axes() -> tuple[str, ...]:
    pp = global_mesh_resource().pp_resource
    return tuple(a for a in get_all_mesh_axes() if a != pp and _in_mesh(a) is not None)


def tpsp_axis_size() -> int:
    return get_mesh_axis_size(get_active_resource_axis("tpsp"))


def dp_or_fsdp_axis_size() -> int:
    gsr = global_mesh_resource()
    return get_mesh_axis_size(_in_mesh(gsr.dp_resource)) * get_mesh_axis_size(_in_mesh(gsr.fsdp_resource))


def ep_axis_size() -> int:
    return get_mesh_axis_size(get_active_resource_axis("ep"))


def extend_logical_axis_rules(rules) -> tuple:
    """flax logical axis rules `rules` ((logical name, mesh axis) pairs) plus te's logical axes
    mapped by the active MeshResource, for flax.linen.logical_axis_rules; a name `rules`
    already maps keeps its rule."""
    if not isinstance(rules, (tuple, list)) or any(not isinstance(r, (tuple, list)) or len(r) != 2 for r in rules):
        raise TypeError(f"argument 'rules' must be a sequence of (logical axis, mesh axis) pairs, got {rules!r}")
    known = {name for name, _ in rules}
    extra = [(k, v) for k, v in get_sharding_map_logic_axis_to_mesh_axis().items() if k not in known]
    return (*(tuple(r) for r in rules), *extra)
