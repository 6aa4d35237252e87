"""fused_attn partitioned over a mesh (_partition.py says how): attention is independent per
(batch row, head), so q / k / v split over the batch axes (dp, fsdp; bshd only) and the heads
(tp: both the query heads and the GQA kv heads, whose contiguous blocks keep their query
groups), with no collective in the forward. Each shard cuts its rows out of the cumulative
sequence lengths; a bias or softmax offset shared by the rows (or heads) a mesh axis splits
gets its gradient all-reduced over that axis."""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from . import _partition as pt
from . import sharding


def _axis(name: str, size: int):
    """The mesh axes of te logical axis `name` for a dim of `size`, if they divide it."""
    return pt.resolve_spec((name,), (size,), (name,))[0]


def _local_seqlens(seqlens: dict, batch, rows: int) -> dict:
    """This shard's rows of bshd cu_seqlens [b + 1]: rows * index .. + rows, rebased to 0."""
    if batch is None or not seqlens:
        return seqlens
    index = 0
    for axis in pt.axes_of(batch):  # major to minor, as the PartitionSpec orders them
        index = index * sharding.get_mesh_axis_size(axis) + jax.lax.axis_index(axis)
    out = {}
    for key, cu in seqlens.items():
        part = jax.lax.dynamic_slice_in_dim(cu, index * rows, rows + 1)
        out[key] = part - part[0]
    return out


def sharded_core_attention(mesh, q, k, v, bias, softmax_offset, seqlens, config, core_fwd, core_bwd):
    """core_attention over the mesh on q [b, sq, h, d], k / v [b, skv, hk, d] (thd: the rows
    still unflattened); core_fwd / core_bwd: attention.py's local rules."""
    if config.dropout > 0.0:
        raise NotImplementedError(
            "fused_attn over a mesh: dropout_probability > 0 is not yet supported (every shard would draw "
            "the same dropout mask); run it with is_training=False or dropout 0, or without a mesh"
        )
    thd = config.qkv_format == "thd"
    b, h, hk = q.shape[0], q.shape[2], k.shape[2]
    batch = None if thd else _axis(sharding.BATCH_AXES, b)
    head = _axis(sharding.HEAD_AXES, h)
    if head is not None and _axis(sharding.HEAD_AXES, hk) != head:
        head = None  # the kv heads must split as the query heads do
    q_spec, kv_spec = P(batch, None, head, None), P(batch, None, head, None)
    bias_spec, bias_sum = P(), ()
    if bias is not None:
        b_ax = batch if bias.shape[0] == b else None
        h_ax = head if bias.shape[1] == h else None
        bias_spec = P(b_ax, h_ax)
        bias_sum = tuple(a for ax, used in ((batch, b_ax), (head, h_ax)) if used is None for a in pt.axes_of(ax))
    offset_spec = P()
    if softmax_offset is not None:
        softmax_offset = softmax_offset.reshape(1, h, 1, 1)
        offset_spec = P(None, head)
    rows = b // (1 if batch is None else pt.axis_size(batch))

    def local_fwd(q, k, v, bias, offset, seqlens):
        lens = _local_seqlens(seqlens, batch, rows)
        if not thd:
            return core_fwd(q, k, v, bias, offset, lens, None, config)
        flat = [x.reshape(-1, *x.shape[2:]) for x in (q, k, v)]
        o, res = core_fwd(*flat, bias, offset, lens, None, config)
        return o.reshape(*q.shape[:2], *o.shape[1:]), res

    def local_bwd(res, d_o):
        shape = d_o.shape
        if thd:
            d_o = d_o.reshape(-1, *shape[2:])
        dq, dk, dv, dbias, doffset, _, _ = core_bwd(config, res, d_o)
        if thd:
            dq, dk, dv = (g.reshape(*shape[:2], *g.shape[1:]) for g in (dq, dk, dv))
        return dq, dk, dv, pt.psum(dbias, bias_sum), pt.psum(doffset, pt.axes_of(batch)), None

    specs = (q_spec, kv_spec, kv_spec, bias_spec, offset_spec, P())
    op = pt.sharded_vjp(mesh, local_fwd, local_bwd, specs, q_spec)
    return op(q, k, v, bias, softmax_offset, seqlens)
