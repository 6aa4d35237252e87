"""The partitioned forms of dense, layernorm_dense, layernorm and activation (_partition.py
says how). Each local rule is the single-device rule of its op (dense._dense_fwd, ...) on
the local shards, with the collectives of its DensePlan around the GEMMs."""

from __future__ import annotations

import math
from functools import partial

from jax.sharding import PartitionSpec as P

from . import _partition as pt
from . import sharding
from .dense import _dense_bwd, _dense_fwd, fp8_forward
from .layernorm import norm_backward, norm_forward
from .quantize.quantizer import ScaledTensor


def _specs(plan: pt.DensePlan, *extra):
    return (P(*plan.x_spec), P(*plan.k_spec), *extra)


def dense_forward_local(plan, x, k, b, qset, fp8_x=None):
    """y (x's lead dims gathered, kernel's out dims local) and the residuals of one GEMM.
    fp8_x: (qx, x_quantizer, lead shape, out dtype) when x's FP8 copies are already written
    (by a fused norm or activation); x is then unused."""
    k = pt.gather_kernel(plan, k)
    kin, out = k.shape[0], k.shape[1:]
    if not qset.is_noop:
        _check_fp8_shard(x.shape[:-1] if fp8_x is None else fp8_x[2], kin, math.prod(out))
    fused_bias = None if plan.contract or b is None else b.reshape(-1)
    if fp8_x is None:
        lead = x.shape[:-1]
        y2, res = _dense_fwd(x.reshape(-1, kin), k.reshape(kin, -1), fused_bias, qset)
    else:
        qx, x_quantizer, lead, out_dtype = fp8_x
        y2, res = fp8_forward(qx, x_quantizer, k.reshape(kin, -1), fused_bias, qset, out_dtype)
    y = pt.reduce_output(plan, y2.reshape(*lead, *out))
    extra_bias = b if plan.contract else None  # row parallel: the bias once, after the sum
    if extra_bias is not None:
        y = y + extra_bias
    return y, (res, extra_bias)


def _check_fp8_shard(lead, kin: int, n: int) -> None:
    """te_gemm's multiples of 16, on the shard each device multiplies."""
    rows = math.prod(lead)
    if rows % 16 or kin % 16 or n % 16:
        raise ValueError(
            f"FP8 dense over a mesh needs multiples of 16 (te_gemm's rule) on each shard: a shard has {rows} rows, "
            f"{kin} inputs and {n} outputs; shard fewer dims or use larger ones"
        )


def dense_backward_local(plan, res, dy):
    """(dX partial sums reduced, dW to its shard, dbias summed over the rows, quantizer set)."""
    dense_res, extra_bias = res
    dy = pt.gather_output_grad(plan, dy)
    out = dy.shape[plan.n_lead :]
    dy2 = dy.reshape(-1, math.prod(out))
    dx2, dk2, db, qset = _dense_bwd(dense_res, dy2)
    if extra_bias is not None:
        db = pt.f32_sum_rows(dy2, extra_bias.dtype)
    db = None if db is None else pt.psum(db.reshape(out), plan.rows)
    dx = pt.reduce_input_grad(plan, dx2.reshape(*dy.shape[: plan.n_lead], dx2.shape[-1]))
    dk = pt.scatter_kernel_grad(plan, dk2.reshape(dk2.shape[0], *out))
    return dx, dk, db, qset


def _dense_local_fwd(plan, x, k, b, qset):
    return dense_forward_local(plan, pt.gather_lead(plan, x), k, b, qset)


def sharded_dense(mesh, x, kernel, bias, quantizer_set, input_axes, kernel_axes, output_axes):
    """dense over the mesh; x, kernel and bias already in x's type, kernel [in, *out]."""
    x_spec = pt.resolve_spec(input_axes, x.shape, pt.batch_default(x.ndim), "input_axes")
    k_spec = pt.resolve_spec(kernel_axes, kernel.shape, (None,) * kernel.ndim, "kernel_axes")
    y_lead = None
    if output_axes:
        y_shape = (*x.shape[:-1], *kernel.shape[1:])
        y_lead = pt.resolve_spec(output_axes, y_shape, output_axes, "output_axes")[: x.ndim - 1]
    plan = pt.dense_plan(x_spec, k_spec, y_lead)
    op = pt.sharded_vjp(
        mesh,
        partial(_dense_local_fwd, plan),
        partial(dense_backward_local, plan),
        _specs(plan, P(*plan.b_spec), P()),
        P(*plan.y_spec),
    )
    return op(x, kernel, bias, quantizer_set)


# ---- norms -------------------------------------------------------------------------------


def norm_spec(x_shape, logical_axes, name: str = "layernorm_input_axes") -> tuple:
    """A norm's input spec: rows over the batch axes (and the sequence over tpsp by default),
    the normalized last dim never split."""
    default = (sharding.BATCH_AXES,) + (sharding.SEQLEN_TP_AXES,) * (len(x_shape) > 2)
    default += (None,) * (len(x_shape) - len(default))
    spec = pt.resolve_spec(logical_axes, x_shape, default, name)
    return (*spec[:-1], None)


def _row_axes(spec) -> tuple:
    return tuple(a for e in spec[:-1] for a in pt.axes_of(e))


def _layernorm_local_fwd(norm_args, x, gamma, beta):
    out = norm_forward(x, gamma, beta, *norm_args)
    return out.y, (x, out.mu, out.rsigma, gamma)


def _layernorm_local_bwd(norm_args, rows, res, dy):
    x, mu, rsigma, gamma = res
    dx, dgamma, dbeta = norm_backward(dy, x, mu, rsigma, gamma, *norm_args[:2])
    return dx, pt.psum(dgamma, rows), pt.psum(dbeta, rows)


def sharded_layernorm(mesh, x, gamma, beta, norm_type, zero_centered_gamma, epsilon):
    spec = norm_spec(x.shape, None)
    norm_args = (norm_type, zero_centered_gamma, epsilon)
    op = pt.sharded_vjp(
        mesh,
        partial(_layernorm_local_fwd, norm_args),
        partial(_layernorm_local_bwd, norm_args, _row_axes(spec)),
        (P(*spec), P(), P()),
        P(*spec),
    )
    return op(x, gamma, beta)


def gather_scaled(plan, q: ScaledTensor, lead_shape) -> ScaledTensor:
    """The FP8 copies of a [M_local, H] tensor with the plan's sequence dims gathered (the
    rowwise copy along its rows, the columnwise [H, M] one along its columns)."""
    if not plan.x_gather:
        return q
    h = q.rowwise.shape[-1]
    row = pt.gather_lead(plan, q.rowwise.reshape(*lead_shape, h)).reshape(-1, h)
    col = pt.gather_lead(plan, q.columnwise.reshape(h, *lead_shape), offset=1).reshape(h, -1)
    return ScaledTensor(row, col, q.scale_inv)


def norm_dense_forward_local(plan, norm_args, x, k, gamma, beta, b, qset):
    """The norm on the local rows, its output gathered to the GEMM's rows, then the GEMM.
    Returns (y, norm residuals, dense residuals)."""
    from .layernorm_dense import quantized_norm  # (layernorm_dense imports this module)

    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    gathered = pt.gathered_lead_shape(plan, x.shape[:-1])
    if qset.is_noop:
        out = norm_forward(x2, gamma, beta, *norm_args)
        ln = pt.gather_lead(plan, out.y.reshape(x.shape))
        y, dres = dense_forward_local(plan, ln, k, b, qset)
        return y, (x, out.mu, out.rsigma, gamma), dres
    qx, mu, rsigma, x_quantizer = quantized_norm(x2, gamma, beta, *norm_args, qset.x)
    fp8_x = (gather_scaled(plan, qx, x.shape[:-1]), x_quantizer, gathered, x.dtype)
    y, dres = dense_forward_local(plan, None, k, b, qset, fp8_x=fp8_x)
    return y, (x, mu, rsigma, gamma), dres


def norm_dense_backward_local(plan, norm_args, rows, norm_res, dnorm_gathered):
    """The norm's backward from the GEMM's dX partial sums (reduced / scattered to the local rows)."""
    x, mu, rsigma, gamma = norm_res
    h = x.shape[-1]
    dnorm = pt.reduce_input_grad(plan, dnorm_gathered.reshape(*dnorm_gathered.shape[:-1], h))
    dx, dgamma, dbeta = norm_backward(dnorm.reshape(-1, h), x.reshape(-1, h), mu, rsigma, gamma, *norm_args[:2])
    return dx.reshape(x.shape), pt.psum(dgamma, rows), pt.psum(dbeta, rows)


def _ln_dense_local_fwd(plan, norm_args, x, k, gamma, beta, b, qset):
    y, norm_res, dres = norm_dense_forward_local(plan, norm_args, x, k, gamma, beta, b, qset)
    return y, (norm_res, dres)


def _ln_dense_local_bwd(plan, norm_args, rows, res, dy):
    norm_res, dres = res
    dense_res, extra_bias = dres
    dy = pt.gather_output_grad(plan, dy)
    out = dy.shape[plan.n_lead :]
    dy2 = dy.reshape(-1, math.prod(out))
    dnorm2, dk2, db, qset = _dense_bwd(dense_res, dy2)
    db = None if db is None else pt.psum(db.reshape(out), plan.rows)
    dnorm = dnorm2.reshape(*dy.shape[: plan.n_lead], dnorm2.shape[-1])
    dx, dgamma, dbeta = norm_dense_backward_local(plan, norm_args, rows, norm_res, dnorm)
    dk = pt.scatter_kernel_grad(plan, dk2.reshape(dk2.shape[0], *out))
    return dx, dk, dgamma, dbeta, db, qset


def ln_dense_plan(
    x_shape, kernel_shape, layernorm_input_axes, kernel_axes, names=("layernorm_input_axes", "kernel_axes")
):
    x_name, kernel_name = names
    x_spec = norm_spec(x_shape, layernorm_input_axes, x_name)
    k_spec = pt.resolve_spec(kernel_axes, kernel_shape, (None,) * len(kernel_shape), kernel_name)
    plan = pt.dense_plan(x_spec, k_spec)
    if plan.contract:
        raise NotImplementedError(
            "layernorm_dense: a kernel whose input (normalized) dim is sharded over "
            f"{plan.contract} (row parallel after a norm) is not yet supported; shard its output dims"
        )
    return x_spec, plan


def sharded_layernorm_dense(mesh, x, kernel, gamma, beta, bias, qset, norm_args, layernorm_input_axes, kernel_axes):
    x_spec, plan = ln_dense_plan(x.shape, kernel.shape, layernorm_input_axes, kernel_axes)
    op = pt.sharded_vjp(
        mesh,
        partial(_ln_dense_local_fwd, plan, norm_args),
        partial(_ln_dense_local_bwd, plan, norm_args, _row_axes(x_spec)),
        (P(*x_spec), P(*plan.k_spec), P(), P(), P(*plan.b_spec), P()),
        P(*plan.y_spec),
    )
    return op(x, kernel, gamma, beta, bias, qset)


# ---- activation ---------------------------------------------------------------------------


def sharded_activation(mesh, local_fwd, local_bwd, x):
    """An activation x [..., ACT_DIM, K] -> [..., K] (local per element pair: no collective);
    rows on the batch axes, K on tp (the intermediate dim of an MLP)."""
    default = (sharding.BATCH_AXES,) + (None,) * (x.ndim - 2) + (sharding.HIDDEN_TP_AXES,)
    spec = list(pt.resolve_spec(None, x.shape, default))
    spec[-2] = None  # the [activated | linear] pair stays together
    op = pt.sharded_vjp(mesh, local_fwd, local_bwd, (P(*spec),), P(*spec[:-2], spec[-1]))
    return op(x)
