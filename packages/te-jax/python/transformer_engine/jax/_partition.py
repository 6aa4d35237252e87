"""How te-jax's FFI-backed ops partition over a device mesh.

XLA cannot split a custom call, so each op, when a mesh is in scope and the
active MeshResource names axes of it, runs its forward and its backward rule
each inside a jax.shard_map: XLA's SPMD partitioner places the shards and
reshards the operands to the specs below, and the rule runs te-core's kernels
on the local shards with the collectives the layout needs written explicitly:

    column parallel (kernel out dims on tp):  no collective forward; dX all-reduced over tp
    row parallel (kernel in dim on tp):       Y all-reduced over tp (reduce-scattered over the
                                              sequence with sequence parallelism), bias added after
    sequence parallel (x's sequence on tp):   the norm runs on the sequence shard; its output is
                                              all-gathered before a column-parallel GEMM, dX reduce-scattered
    FSDP (a kernel dim on fsdp):              the kernel is all-gathered for the GEMM, dW reduce-scattered
    data parallel (rows on dp / fsdp):        dW, dbias, dgamma all-reduced over the row axes
    FP8:                                      every amax max-reduced over the mesh (quantize.quantizer)

Forward and backward are two shard_maps under one jax.custom_vjp (no autodiff
through shard_map: the quantizer set's "gradient" is its new state, which
must not be summed over devices). The forward's residuals cross from one to
the other as per-device blocks: each leaf gets a leading dim of size 1 that is
sharded over every mesh axis, so no residual is ever moved or gathered.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from . import sharding
from .quantize.quantizer import amax_reduction


def active_mesh():
    """The mesh to partition over, or None (no mesh, or the MeshResource names none of its axes)."""
    mesh = sharding.current_mesh()
    if mesh is None:
        return None
    gsr = sharding.global_mesh_resource()
    names = {f.name: getattr(gsr, f.name) for f in dataclasses.fields(gsr)}
    used = {k: v for k, v in names.items() if v is not None and sharding._mesh_axis_size_or_zero(v) > 1}
    for kind in ("cp_resource", "ep_resource"):
        if kind in used:
            raise NotImplementedError(
                f"te-jax partitions over dp, fsdp, tp and tpsp; MeshResource.{kind}={used[kind]!r} "
                "(context / expert parallelism) is not yet supported"
            )
    for kind, axis in names.items():
        if axis is not None and axis not in mesh.axis_names:
            raise ValueError(
                f"MeshResource.{kind}={axis!r} is not an axis of the mesh in scope {tuple(mesh.axis_names)}"
            )
    return mesh if used else None


def axes_of(entry) -> tuple[str, ...]:
    """A PartitionSpec entry as a tuple of mesh axis names."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def entry_of(axes: tuple[str, ...]):
    """The PartitionSpec entry of a tuple of axes."""
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def resolve_spec(logical_axes, shape, default, name: str = "logical axes") -> tuple:
    """The mesh spec (one entry per dim) of an array from its logical axes (te's or flax's names;
    None: `default`). A dim whose size the axes do not divide stays unsharded. `name`: the
    argument the axes came from, for the error."""
    if logical_axes is None or len(logical_axes) == 0:
        logical_axes = default
    if isinstance(logical_axes, str) or len(logical_axes) != len(shape):
        raise ValueError(
            f"argument '{name}' must name one logical axis (or None) per dim of its {len(shape)}-d array "
            f"(shape {tuple(shape)}), got {logical_axes!r}"
        )
    spec = sharding.generate_pspec(logical_axes)
    out = []
    for entry, size in zip(sharding.get_padded_spec(spec, len(shape)), shape):
        n = 1
        for axis in axes_of(entry):
            n *= sharding.get_mesh_axis_size(axis)
        out.append(entry if size % n == 0 else None)
    return tuple(out)


def axis_size(entry) -> int:
    """The number of devices a PartitionSpec entry splits a dim over."""
    return math.prod(sharding.get_mesh_axis_size(a) for a in axes_of(entry))


def batch_default(ndim: int) -> tuple:
    """Logical axes of an activation without explicit ones: the leading dim is the batch."""
    return (sharding.BATCH_AXES,) + (None,) * (ndim - 1)


def all_gather(x, dim: int, axes: tuple[str, ...]):
    return x if not axes else jax.lax.all_gather(x, axes, axis=dim, tiled=True)


def reduce_scatter(x, dim: int, axes: tuple[str, ...]):
    return x if not axes else jax.lax.psum_scatter(x, axes, scatter_dimension=dim, tiled=True)


def psum(x, axes: tuple[str, ...]):
    return x if x is None or not axes else jax.lax.psum(x, tuple(axes))


def local_slice(x, dim: int, axes: tuple[str, ...]):
    """This device's block of x along dim (x identical on every shard of `axes`)."""
    if not axes:
        return x
    index, count = 0, 1
    for axis in axes:  # major to minor, as a PartitionSpec entry orders them
        size = sharding.get_mesh_axis_size(axis)
        index, count = index * size + jax.lax.axis_index(axis), count * size
    block = x.shape[dim] // count
    return jax.lax.dynamic_slice_in_dim(x, index * block, block, axis=dim)


def _add_block_dim(tree):
    return jax.tree_util.tree_map(lambda a: a[None], tree)


def _drop_block_dim(tree):
    return jax.tree_util.tree_map(lambda a: a[0], tree)


def sharded_vjp(mesh, local_fwd, local_bwd, in_specs, out_spec):
    """A custom-VJP function of the global arguments (in_specs: a spec prefix per argument)
    whose forward is local_fwd(*local args) -> (local y, residuals) and backward
    local_bwd(residuals, local dy) -> local cotangents (sharded as the arguments),
    each run in a shard_map over `mesh` with every quantizer amax max-reduced over the mesh."""
    block = P(tuple(mesh.axis_names))  # per-device residual blocks
    reduce_axes = sharding.amax_reduction_axes()

    def fwd_body(*args):
        with amax_reduction(reduce_axes):
            y, res = local_fwd(*args)
        return y, _add_block_dim(res)

    def bwd_body(res, dy):
        with amax_reduction(reduce_axes):
            return tuple(local_bwd(_drop_block_dim(res), dy))

    fwd_map = jax.shard_map(fwd_body, mesh=mesh, in_specs=tuple(in_specs), out_specs=(out_spec, block), check_vma=False)
    bwd_map = jax.shard_map(bwd_body, mesh=mesh, in_specs=(block, out_spec), out_specs=tuple(in_specs), check_vma=False)

    @jax.custom_vjp
    def op(*args):
        return fwd_map(*args)[0]

    def op_fwd(*args):
        return fwd_map(*args)

    def op_bwd(res, dy):
        return bwd_map(res, dy)

    op.defvjp(op_fwd, op_bwd)
    return op


@dataclasses.dataclass(frozen=True)
class DensePlan:
    """The partitioning of y = x @ kernel (+ bias), x [*lead, K], kernel [K, *out].

    x_spec / k_spec / b_spec / y_spec: the shard_map specs. x_gather: (dim, axes) of x's
    lead dims gathered before the GEMM (sequence parallel input of a column-parallel GEMM).
    k_gather: (dim, axes) of the kernel's FSDP dims. contract: the axes of K (row parallel:
    y is summed over them; scatter_dim: reduce-scattered along that lead dim instead).
    col: the axes of the kernel's out dims. rows: the axes the GEMM's rows are split over
    (dW, dbias and dgamma are summed over them)."""

    x_spec: tuple
    k_spec: tuple
    b_spec: tuple
    y_spec: tuple
    x_gather: tuple
    k_gather: tuple
    contract: tuple
    scatter_dim: int | None
    col: tuple
    rows: tuple

    @property
    def n_lead(self) -> int:
        return len(self.x_spec) - 1


def dense_plan(x_spec: tuple, k_spec: tuple, y_lead_spec: tuple | None = None) -> DensePlan:
    """The DensePlan of given mesh specs of x and kernel (y_lead_spec: the requested sharding of
    y's lead dims; a row-parallel GEMM reduce-scatters along a lead dim sharded on its K axes)."""
    fsdp = sharding.get_active_resource_axis("fsdp")
    k_gather = tuple((d, axes_of(e)) for d, e in enumerate(k_spec) if axes_of(e) and set(axes_of(e)) <= {fsdp})
    gathered_dims = {d for d, _ in k_gather}
    compute_k = tuple(None if d in gathered_dims else e for d, e in enumerate(k_spec))
    contract = axes_of(compute_k[0])
    col = tuple(a for e in compute_k[1:] for a in axes_of(e))
    for d, e in enumerate(k_spec):
        if d not in gathered_dims and fsdp is not None and fsdp in axes_of(e):
            raise NotImplementedError(f"a kernel dim sharded over fsdp and another axis ({e!r}) is not yet supported")
    lead = list(x_spec[:-1])
    x_gather = []
    for d, e in enumerate(lead):
        clash = set(axes_of(e)) & (set(col) | set(contract))
        if clash and not set(axes_of(e)) <= set(col):
            raise NotImplementedError(
                f"x's dim {d} is sharded over {e!r}, an axis of the kernel's contracting dim: sequence-parallel "
                "input of a row-parallel GEMM is not yet supported"
            )
        if clash:
            x_gather.append((d, axes_of(e)))
    gathered_lead = [None if any(d == g for g, _ in x_gather) else e for d, e in enumerate(lead)]
    rows = tuple(a for e in gathered_lead for a in axes_of(e))
    if set(rows) & set(contract):
        raise NotImplementedError(
            f"x's rows and the kernel's contracting dim share mesh axes {set(rows) & set(contract)}"
        )
    y_lead, scatter_dim = list(gathered_lead), None
    if contract and y_lead_spec is not None:
        for d, e in enumerate(y_lead_spec):
            if axes_of(e) and set(axes_of(e)) == set(contract) and gathered_lead[d] is None:
                scatter_dim, y_lead[d] = d, entry_of(contract)
                break
    out = compute_k[1:]
    return DensePlan(
        x_spec=(*lead, entry_of(contract)),
        k_spec=tuple(k_spec),
        b_spec=tuple(out),
        y_spec=(*y_lead, *out),
        x_gather=tuple(x_gather),
        k_gather=k_gather,
        contract=contract,
        scatter_dim=scatter_dim,
        col=col,
        rows=rows,
    )


def gathered_lead_shape(plan: DensePlan, lead: tuple) -> tuple:
    """The local lead dims after gather_lead (static)."""
    lead = list(lead)
    for d, axes in plan.x_gather:
        lead[d] *= math.prod(sharding.get_mesh_axis_size(a) for a in axes)
    return tuple(lead)


def gather_lead(plan: DensePlan, t, offset: int = 0):
    """t with the plan's x_gather dims (shifted by offset) all-gathered."""
    for d, axes in plan.x_gather:
        t = all_gather(t, d + offset, axes)
    return t


def scatter_lead(plan: DensePlan, t, offset: int = 0):
    """The transpose of gather_lead: reduce-scatter along those dims."""
    for d, axes in plan.x_gather:
        t = reduce_scatter(t, d + offset, axes)
    return t


def gather_kernel(plan: DensePlan, k):
    for d, axes in plan.k_gather:
        k = all_gather(k, d, axes)
    return k


def scatter_kernel_grad(plan: DensePlan, dk):
    """dW of the gathered kernel back to its FSDP shard (summed over the FSDP axis when the rows
    are split over it, else the local block), then summed over the other row axes."""
    done = set()
    for d, axes in plan.k_gather:
        if set(axes) <= set(plan.rows):
            dk = reduce_scatter(dk, d, axes)
            done.update(axes)
        else:
            dk = local_slice(dk, d, axes)
    return psum(dk, tuple(a for a in plan.rows if a not in done))


def reduce_output(plan: DensePlan, y):
    """A row-parallel GEMM's partial sums: all-reduced, or reduce-scattered along scatter_dim."""
    if not plan.contract:
        return y
    if plan.scatter_dim is not None:
        return reduce_scatter(y, plan.scatter_dim, plan.contract)
    return psum(y, plan.contract)


def gather_output_grad(plan: DensePlan, dy):
    """dy of a reduce-scattered output, gathered back to the full rows."""
    return dy if plan.scatter_dim is None else all_gather(dy, plan.scatter_dim, plan.contract)


def reduce_input_grad(plan: DensePlan, dx):
    """A column-parallel GEMM's dX partial sums: reduce-scattered along the gathered sequence
    dims, all-reduced over the remaining column axes."""
    dx = scatter_lead(plan, dx)
    scattered = {a for _, axes in plan.x_gather for a in axes}
    return psum(dx, tuple(a for a in plan.col if a not in scattered))


def f32_sum_rows(dy2, dtype):
    """The bias gradient: dy summed over its rows in FP32, in `dtype`."""
    return jnp.sum(dy2, axis=0, dtype=jnp.float32).astype(dtype)
