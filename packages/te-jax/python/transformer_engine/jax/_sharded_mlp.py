"""The partitioned layernorm_mlp (_partition.py says how): the norm on x's shard, FC1 column
parallel (its output's intermediate dim on tp, the norm output gathered over the sequence
first under sequence parallelism), the activation on the local intermediate slice, FC2 row
parallel (all-reduced, or reduce-scattered back to x's sequence shard), FSDP kernels gathered.
The local rules are layernorm_mlp's single-device ones with those collectives between them."""

from __future__ import annotations

import math
from functools import partial

from jax.sharding import PartitionSpec as P

from . import _partition as pt
from ._sharded_ops import (
    _row_axes,
    dense_backward_local,
    dense_forward_local,
    ln_dense_plan,
    norm_dense_backward_local,
    norm_dense_forward_local,
)
from .cpp_extensions import activation_fwd
from .dense import backward_gemms


def _local_fwd(plans, norm_args, act, x, gamma, beta, k1, k2, b1, b2, sets):
    from .layernorm_mlp import quantized_activation  # (layernorm_mlp imports this module lazily)

    plan_1, plan_2 = plans
    kind, attrs, _ = act
    set_1, set_2 = sets
    h, norm_res, fc1_res = norm_dense_forward_local(plan_1, norm_args, x, k1, gamma, beta, b1, set_1)
    lead = h.shape[:-2]
    h2 = h.reshape(math.prod(lead), -1)  # [rows, ACT_DIM * local intermediate]
    if set_2.is_noop:
        a = activation_fwd(h2, kind, **dict(attrs)).reshape(*lead, -1)
        y, fc2_res = dense_forward_local(plan_2, a, k2, b2, set_2)
    else:
        qa, a_quantizer = quantized_activation(h2, kind, attrs, set_2.x)
        y, fc2_res = dense_forward_local(plan_2, None, k2, b2, set_2, fp8_x=(qa, a_quantizer, lead, x.dtype))
    return y, (norm_res, fc1_res, h2, fc2_res)


def _local_bwd(plans, norm_args, act, rows, res, dy):
    from .layernorm_mlp import _activation_backward

    plan_1, plan_2 = plans
    kind, attrs, act_dim = act
    norm_res, (fc1_dense_res, _), h2, fc2_res = res
    da, dk2, db2, set_2 = dense_backward_local(plan_2, fc2_res, dy)
    ln_saved, k1_saved, b1, set_1 = fc1_dense_res
    dh, db1, set_1 = _activation_backward(da.reshape(h2.shape[0], -1), h2, kind, attrs, b1, set_1)
    x = norm_res[0]
    dln, dk1 = backward_gemms(dh, ln_saved, k1_saved, out_dtype=x.dtype)
    lead = da.shape[:-1]
    dx, dgamma, dbeta = norm_dense_backward_local(plan_1, norm_args, rows, norm_res, dln.reshape(*lead, -1))
    k1_local = (dk1.shape[0], act_dim, dk1.shape[1] // act_dim)  # FC1's dW came back flattened
    dk1 = pt.scatter_kernel_grad(plan_1, dk1.reshape(k1_local))
    if db1 is not None:
        db1 = pt.psum(db1.reshape(k1_local[1:]), plan_1.rows)
    return dx, dgamma, dbeta, dk1, dk2, db1, db2, (set_1, set_2)


def sharded_layernorm_mlp(mesh, x, gamma, beta, k1, k2, b1, b2, sets, norm_args, act, axes):
    """layernorm_mlp over the mesh: k1 [hidden, ACT_DIM, intermediate], k2 [intermediate, out],
    b1 [ACT_DIM, intermediate] | None, b2 [out] | None, all in x's type. act: (kind, attrs,
    ACT_DIM); axes: (norm_input_axes, kernel_1_axes, kernel_2_axes)."""
    norm_input_axes, kernel_1_axes, kernel_2_axes = axes
    x_spec, plan_1 = ln_dense_plan(
        x.shape, k1.shape, norm_input_axes, kernel_1_axes, ("norm_input_axes", "kernel_1_axes")
    )
    if plan_1.k_spec[1] is not None:
        raise NotImplementedError("layernorm_mlp: kernel_1's activation dim (ACT_DIM) must not be sharded")
    a_spec = (*plan_1.y_spec[:-2], plan_1.y_spec[-1])
    k2_spec = pt.resolve_spec(kernel_2_axes, k2.shape, (None, None), "kernel_2_axes")
    plan_2 = pt.dense_plan(a_spec, k2_spec, x_spec[:-1])
    if tuple(plan_2.x_spec) != tuple(a_spec) or plan_2.x_gather:
        raise NotImplementedError(
            f"layernorm_mlp: kernel_2's input dim must be sharded as kernel_1's intermediate dim ({a_spec[-1]!r}), "
            f"got kernel_2 spec {k2_spec}"
        )
    plans = (plan_1, plan_2)
    op = pt.sharded_vjp(
        mesh,
        partial(_local_fwd, plans, norm_args, act),
        partial(_local_bwd, plans, norm_args, act, _row_axes(x_spec)),
        (P(*x_spec), P(), P(), P(*plan_1.k_spec), P(*plan_2.k_spec), P(*plan_1.b_spec), P(*plan_2.b_spec), P()),
        P(*plan_2.y_spec),
    )
    return op(x, gamma, beta, k1, k2, b1, b2, sets)
