"""The autograd function of te.LayerNormMLP:

    ln  = norm(x)                      (LayerNorm or RMSNorm, _norm_parts)
    h   = ln W1^T + b1                 (fc1: [T, H] -> [T, F1], F1 = 2F for gated kinds)
    a   = act(h)                       (kernels.activation: [T, F1] -> [T, F])
    out = a W2^T + b2                  (fc2: [T, F] -> [T, H])

Under a quantization recipe the two GEMMs are Linear's TN triple
(_linear_fn), run on the Operands of _operand.py so that every recipe
(per-tensor FP8, MXFP8, FP8 block, NVFP4) takes the same code: fprop
x rowwise . W rowwise, dgrad dy rowwise . W columnwise, wgrad dy columnwise .
x columnwise. Forward quantizer slots are 0/1 fc1 input/weight and 3/4 fc2
input/weight; backward slots 0 (fc1's grad_output, the activation's gradient)
and 2 (fc2's grad_output).

DelayedScaling writes FP8 straight from the kernels: the norm's output and the
activation's output are quantized in the kernels that compute them, and the
activation backward writes fc1's FP8 gradient (both copies) together with the
fc1 bias gradient. The other recipes compute those tensors in high precision
and quantize them with their quantizers (current scaling needs the whole
tensor's amax first: the norm / activation kernel computes it while writing
the tensor, _operand.fused_amax, so no separate amax pass reads it again; the
block formats quantize per block). Backward frees
the activation's input gradient and then its high-precision output gradient
dL/dh [T, F1] as soon as they are consumed (the step's peak is there);
per-tensor FP8 quantizes dL/dh rowwise only, runs fc1's dgrad, then
transposes the bytes (exactly the columnwise copy: one scale) for fc1's wgrad.

What backward keeps under a recipe (the memory goal: fewer saved bytes than
the BF16 module, and a lower step peak):
  - x, mu, rsigma (the norm's backward; x is the caller's tensor anyway),
  - ln quantized: per-tensor FP8 its rowwise bytes (transposed in backward,
    exactly the columnwise copy), the block formats their columnwise copy
    (which cannot be derived from the rowwise one),
  - h in high precision (the activation backward needs the exact values).
It keeps neither the activation output nor quantized copies of the weights:
fc2's wgrad operand (a columnwise) is recomputed from h and quantized, and the
weights' columnwise copies are quantized again from the parameters -- with
the forward's scales under per-tensor FP8 (saved: delayed scaling's autocast
exit updates them before backward; current scaling's scale is the weight's
own, kept so that backward needs no second amax pass); the block formats
derive their scales from the weight itself, so the bytes equal the forward's
(checked per recipe by the tests). A weight quantizer that rounds stochastically would not
reproduce its bytes: its columnwise copy is then made in forward and kept.
Under per-tensor FP8 the recompute of a costs no pass of its own: the
activation backward, which reads h anyway, writes a's FP8 columnwise bytes
with the forward's scale in the same pass (kernels.activation_bwd_fwd_columnwise;
delayed scaling: the saved forward scale, FP32 values; current scaling: the
scale forward derived, saved as one float, values rounded to h's dtype as the
forward's act was stored), so backward runs fc2's dgrad, the activation
backward, then fc2's wgrad (_operand.FUSE_ACT_RECOMPUTE; off, or under the
block formats, a separate pass recomputes it first). The bytes are the same.
Weights held quantized (quantized_model_init) or cached across microbatches
(is_first_microbatch) are never quantized again: backward reads their own
columnwise copies. Without a recipe the function keeps ln, h and a in high
precision.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..tensor import Float8CurrentScalingQuantizer, QuantizedTensor
from . import _operand
from ._operand import Operand, fused_amax, operand_gemm, quantize_operand, tensor_operand
from .normalization import norm_kernel_bwd, norm_kernel_fwd


class MLPArgs:
    """Everything but the tensors that the forward and backward need."""

    __slots__ = (
        "act_dtype",
        "act_params",
        "bwd_q",
        "bwd_queue",
        "cache_weight",
        "calibrate",
        "delayed",
        "eps",
        "fc1_param",
        "fc2_param",
        "fp8",
        "fuse_wgrad",
        "fwd_q",
        "grads",
        "kind",
        "per_tensor",
        "return_ln",
        "reuse_weight",
        "scales",
        "skip_fc2",
        "split_acc",
        "weight_cache",
        "weight_scales",
        "zero_centered_gamma",
    )

    def __init__(self) -> None:
        self.grads = (False,) * 5  # which of (inp, gamma, beta, W1, b1) need a gradient (set by the module)
        self.fp8 = False
        self.calibrate = False
        self.cache_weight = False
        self.bwd_queue = None
        # In: a copy of the module's {"fc1"/"fc2": weight Operand} cache; the
        # function adds what it makes when cache_weight, and the module stores
        # the dict afterwards (the function writes no module state).
        self.weight_cache = None
        self.weight_scales = {}  # slot -> the FP32 [1] scale current scaling gave that weight in forward
        self.skip_fc2 = False  # checkpoint=True's recompute: fc2's output is not used


def _code(quantizer) -> int:
    return int(quantizer.dtype)


def _fp8_operand(row, col, scale_inv, quantizer) -> Operand:
    """A per-tensor Operand of bytes a fused (delayed-scaling) kernel wrote."""
    return Operand("fp8", {"row": row, "col": col, "scale_inv": scale_inv, "code": _code(quantizer)})


def _main_grad(a: MLPArgs, param):
    """(out, beta) of a wgrad GEMM: param.main_grad under fuse_wgrad_accumulation, else (None, 0)."""
    if not a.fuse_wgrad:
        return None, 0.0
    param.grad_added_to_main_grad = True
    return param.main_grad, (0.0 if getattr(param, "overwrite_main_grad", False) else 1.0)


def _pack(ctx, tensors: list, operands: tuple) -> None:
    """save_for_backward of `tensors` followed by the operands' tensors; the
    operands (None allowed) are kept as templates for _unpack."""
    ctx.operands = operands
    ctx.n_plain = len(tensors)
    ctx.counts = [0 if op is None else len(op.tensors()) for op in operands]
    ctx.save_for_backward(*tensors, *(t for op in operands if op is not None for t in op.tensors()))


def _unpack(ctx):
    """(plain tensors, operands) as _pack saved them."""
    saved = ctx.saved_tensors
    plain, start, ops = saved[: ctx.n_plain], ctx.n_plain, []
    for op, n in zip(ctx.operands, ctx.counts):
        ops.append(None if op is None else op.with_tensors(saved[start : start + n]))
        start += n
    return plain, ops


# --------------------------------------------------------------------------- weights


def _requantizes_exactly(quantizer) -> bool:
    """Whether quantizing the same weight again gives the same bytes (not with stochastic rounding)."""
    return not getattr(quantizer, "stochastic_rounding", False)


def _weight_fprop(a: MLPArgs, key: str, weight, slot: int, need_dgrad: bool):
    """(fprop Operand, Operand kept for dgrad | None: quantize again in backward)."""
    if isinstance(weight, QuantizedTensor):  # quantized_model_init: the parameter's own copies
        op = tensor_operand(weight, columnwise=need_dgrad)
        return op, (op.drop(rowwise=True) if need_dgrad else None)
    cache = a.weight_cache
    if a.reuse_weight and key in cache:
        op = cache[key]
        return op, op.drop(rowwise=True)
    q = a.fwd_q[slot]
    keep_col = a.cache_weight or (need_dgrad and not _requantizes_exactly(q))
    op = quantize_operand(q, weight, rowwise=True, columnwise=keep_col)
    if need_dgrad and not keep_col:
        # Current scaling: the scale this quantization used (the quantizer's is
        # overwritten by later calls); backward quantizes the same weight with
        # it, skipping another amax pass.
        scale = _current_scale(q, None, weight)
        if scale is not None:
            a.weight_scales[slot] = scale
    if a.cache_weight:
        cache[key] = op
    return op, (op.drop(rowwise=True) if keep_col and need_dgrad else None)


def _weight_dgrad(a: MLPArgs, kept, weight, slot: int) -> Operand:
    """W's columnwise Operand: the kept one, else W quantized again as forward quantized it."""
    if kept is not None:
        return kept
    q = a.fwd_q[slot]
    # The forward's scale (the quantizer's may have been updated since): delayed
    # scaling's, or the one current scaling computed from this weight's amax
    # (the same weight has the same amax, so the bytes are forward's).
    scale = a.scales[slot : slot + 1] if a.delayed else a.weight_scales.get(slot)
    if scale is not None:
        _, col, scale_inv = kernels.quantize_fp8(weight, scale, None, _code(q), False, True)
        return _fp8_operand(None, col, scale_inv, q)
    return quantize_operand(q, weight, rowwise=False, columnwise=True)


def _columnwise(op: Operand) -> Operand:
    """A per-tensor operand with its columnwise copy (the exact transpose of the rowwise bytes)."""
    if op.kind != "fp8" or op.fields["col"] is not None:
        return op
    return Operand("fp8", {**op.fields, "row": None, "col": kernels.transpose(op.fields["row"])})


# --------------------------------------------------------------------------- forward


def _unused_output(x, w2, dtype):
    """fc2's output shape, not computed (checkpoint=True's recompute discards it)."""
    return torch.empty(x.shape[0], w2.shape[0], dtype=dtype, device=x.device)


def _forward_q(ctx, x, gamma, beta, w1, b1, w2, b2, a: MLPArgs):
    q = a.fwd_q
    grads = a.grads
    dt = a.act_dtype
    ln_hp = None
    per_tensor = a.per_tensor
    if a.delayed and not a.return_ln:  # the norm kernel writes FP8
        ln_r, mu, rsigma, ln_s = norm_kernel_fwd(
            x, gamma, beta, a.eps, a.zero_centered_gamma, fp8_dtype=_code(q[0]), scale=q[0].scale, amax=q[0].amax
        )
        ln_op = _fp8_operand(ln_r, None, ln_s, q[0])
    else:
        amax = fused_amax(q[0], x)  # current scaling: the norm kernel writes max|ln|
        ln_hp, mu, rsigma, _ = norm_kernel_fwd(x, gamma, beta, a.eps, a.zero_centered_gamma, out_dtype=dt, amax=amax)
        ln_col = grads[3] and not per_tensor
        ln_op = quantize_operand(q[0], ln_hp, rowwise=True, columnwise=ln_col, amax=amax)
        if not a.return_ln:  # (not returned: freed before fc1's output exists)
            ln_hp = None
    # fc1's dgrad (W1 columnwise) serves the norm's inputs; fc2's (W2 columnwise) everything before it.
    need_ln = any(grads[:3])
    w1_op, w1_keep = _weight_fprop(a, "fc1", w1, 1, need_ln)
    w2_op, w2_keep = _weight_fprop(a, "fc2", w2, 4, need_ln or grads[3] or grads[4])
    h = operand_gemm(ln_op, False, w1_op, False, out_dtype=dt, bias=b1, use_split_accumulator=a.split_acc[0])
    act_scale = None  # current scaling: the scale act was quantized with (_backward_q's fused recompute)
    if a.delayed:
        act_r, _, act_s = kernels.activation_fwd(
            h, a.kind, fp8_dtype=_code(q[3]), scale=q[3].scale, amax=q[3].amax, **a.act_params
        )
        act_op = _fp8_operand(act_r, None, act_s, q[3])
    else:
        amax = fused_amax(q[3], h)
        act_hp = kernels.activation_fwd(h, a.kind, amax=amax, **a.act_params)[0]
        act_op = quantize_operand(q[3], act_hp, rowwise=True, columnwise=False, amax=amax)
        if _operand.FUSE_ACT_RECOMPUTE and w2.requires_grad:
            act_scale = _current_scale(q[3], amax, act_hp)
        del act_hp
    if a.skip_fc2:
        out = _unused_output(x, w2, dt)
    else:
        out = operand_gemm(act_op, False, w2_op, False, out_dtype=dt, bias=b2, use_split_accumulator=a.split_acc[0])
    ln_keep = None
    if grads[3]:  # fc1's wgrad reads ln columnwise (per-tensor: transposed in backward)
        ln_keep = ln_op if per_tensor else ln_op.drop(rowwise=True)
    # The parameters are saved only where backward quantizes them again.
    weights = [w1 if w1_keep is None else None, w2 if w2_keep is None else None]
    _pack(ctx, [x, mu, rsigma, gamma, h, *weights, act_scale], (ln_keep, w1_keep, w2_keep))
    return out, ln_hp


def _forward_hp(ctx, x, gamma, beta, w1, b1, w2, b2, a: MLPArgs):
    dt = a.act_dtype
    ln, mu, rsigma, _ = norm_kernel_fwd(x, gamma, beta, a.eps, a.zero_centered_gamma, out_dtype=dt)
    w1, w2 = w1.to(dt), w2.to(dt)
    h = kernels.gemm(ln, w1, transb=True, out_dtype=dt, bias=b1)[0]
    act = kernels.activation_fwd(h, a.kind, **a.act_params)[0]
    out = _unused_output(x, w2, dt) if a.skip_fc2 else kernels.gemm(act, w2, transb=True, out_dtype=dt, bias=b2)[0]
    if a.calibrate:  # delayed-scaling calibration: record the amaxes FP8 would see
        for slot, t in ((0, ln), (1, w1), (3, act), (4, w2)):
            a.fwd_q[slot].calibrate(t)
    ctx.save_for_backward(x, mu, rsigma, gamma, ln, h, act, w1, w2)
    return out, ln


class LayerNormMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, a: MLPArgs):
        hidden = ln_weight.shape[0]
        x = inp.reshape(-1, hidden)
        run = _forward_q if a.fp8 else _forward_hp
        out, ln = run(ctx, x, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, a)
        ctx.args = a
        ctx.inp_shape = inp.shape
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (fc1_weight, fc1_bias, fc2_weight, fc2_bias))
        out = out.view(*inp.shape[:-1], fc2_weight.shape[0])
        if a.return_ln:
            return out, ln.view(inp.shape)
        return out

    @staticmethod
    def backward(ctx, grad_out, *grad_ln):
        a: MLPArgs = ctx.args
        needs = ctx.needs_input_grad[:7]
        dy = grad_out.reshape(-1, grad_out.shape[-1]).to(a.act_dtype)
        if a.fp8:
            (x, mu, rsigma, gamma, *rest), ops = _unpack(ctx)
            d_ln, dw1, db1, dw2, db2 = _backward_q(a, ctx.dtypes, dy, needs, rest, ops)
        else:
            x, mu, rsigma, gamma, *rest = ctx.saved_tensors
            d_ln, dw1, db1, dw2, db2 = _backward_hp(a, ctx.dtypes, dy, needs, rest)
        dx = dgamma = dbeta = None
        if d_ln is not None:
            if grad_ln and grad_ln[0] is not None:  # the returned layernorm output's gradient
                d_ln = d_ln + grad_ln[0].reshape(d_ln.shape)
            dx, dgamma, dbeta = norm_kernel_bwd(d_ln.to(x.dtype), x, mu, rsigma, gamma, a.zero_centered_gamma)
            dx = dx.view(ctx.inp_shape)
        _, b1_dt, _, b2_dt = ctx.dtypes
        db1 = None if db1 is None else db1.to(b1_dt)
        db2 = None if db2 is None else db2.to(b2_dt)
        if a.bwd_queue is not None:
            # The first FP8 module of the autocast region runs last in backward:
            # the backward delayed-scaling update happens here (§3.3).
            a.bwd_queue.run()
        return dx, dgamma, dbeta, dw1, db1, dw2, db2, None


# --------------------------------------------------------------------------- backward


def _act_columnwise(a: MLPArgs, h) -> Operand:
    """fc2's wgrad operand: act(h) recomputed and quantized columnwise as forward would have."""
    q = a.fwd_q[3]
    if a.delayed:
        _, col, scale_inv = kernels.activation_fwd(
            h, a.kind, fp8_dtype=_code(q), scale=a.scales[3:4], rowwise=False, columnwise=True, **a.act_params
        )
        return _fp8_operand(None, col, scale_inv, q)
    amax = fused_amax(q, h)
    act_hp = kernels.activation_fwd(h, a.kind, amax=amax, **a.act_params)[0]
    return quantize_operand(q, act_hp, rowwise=False, columnwise=True, amax=amax)


def _current_scale(q, amax, x):
    """The scale current scaling quantized x with (just now, in forward), for
    backward to quantize the same values again without an amax pass (act's
    fused recompute, the weights' columnwise copies); None where it cannot be
    known exactly (not current scaling, or a path that records no scale: then
    backward recomputes it). amax: the fused amax buffer given to
    quantize_operand (it holds x's amax, all-reduced where the quantizer
    reduces), or None."""
    if type(q) is not Float8CurrentScalingQuantizer:
        return None
    if amax is None and q.use_existing_amax:
        amax = q.amax
    if amax is not None:  # the same function of the same amax that quantize_operand used
        return kernels.compute_scale_from_amax(amax, _code(q), q.force_pow_2_scales, q.amax_epsilon)[0:1]
    if q._updates_state(x):  # quantize_parts' fast path recorded its scale
        return q.scale.clone()
    return None


def _act_bwd(a: MLPArgs, d_act, h, fwd_scale, **kw):
    """kernels.activation_bwd(d_act, h, **kw), plus, where fwd_scale is given,
    fc2's wgrad operand (act(h) columnwise, quantized with fwd_scale) from the
    same pass: ((rowwise, columnwise, scale_inv, dbias), act Operand | None)."""
    if fwd_scale is None:
        return kernels.activation_bwd(d_act, h, a.kind, **kw, **a.act_params), None
    q = a.fwd_q[3]
    # Delayed scaling's forward quantized the FP32 values in the activation
    # kernel; current scaling quantized act as stored in h's dtype.
    values = torch.float32 if a.delayed else h.dtype
    *grads, col, scale_inv = kernels.activation_bwd_fwd_columnwise(
        d_act, h, a.kind, fwd_fp8_dtype=_code(q), fwd_scale=fwd_scale, fwd_values_dtype=values, **kw, **a.act_params
    )
    return grads, _fp8_operand(None, col, scale_inv, q)


def _act_grad_fp8(a: MLPArgs, d_act, h, need_row: bool, need_col: bool, need_bias: bool, fwd_scale=None):
    """Delayed scaling: (dL/dh Operand, fc1 bias gradient | None, act Operand | None)
    written in FP8 by the activation kernel (act: see _act_bwd)."""
    gq = a.bwd_q[0]
    (d1r, d1c, d1s, db1), act_op = _act_bwd(
        a,
        d_act,
        h,
        fwd_scale,
        fp8_dtype=_code(gq),
        scale=gq.scale,
        amax=gq.amax,
        rowwise=need_row,
        columnwise=need_col,
        dbias=need_bias,
    )
    return _fp8_operand(d1r, d1c, d1s, gq), db1, act_op


def _fc2_wgrad(a: MLPArgs, dy_op, act_op, w2_dt):
    """dW2 = dy^T act (into main_grad under fuse_wgrad)."""
    out, beta = _main_grad(a, a.fc2_param)
    kw = {"use_split_accumulator": a.split_acc[2], "out": out, "beta": beta}
    return operand_gemm(dy_op, True, act_op, True, out_dtype=w2_dt, **kw)


def _backward_q(a: MLPArgs, dtypes, dy, needs, saved, ops):
    n_x, n_g, n_b, n_w1, n_b1, n_w2, n_b2 = needs
    h, w1, w2, act_scale = saved
    ln_op, w1_keep, w2_keep = ops
    w1_dt, _, w2_dt, _ = dtypes
    need_ln = n_x or n_g or n_b
    need_dact = need_ln or n_w1 or n_b1
    dt = a.act_dtype
    # fc2's wgrad operand from the activation backward's pass (per-tensor FP8,
    # the forward's scale known), else recomputed first in a pass of its own.
    fwd_scale = None
    if n_w2 and need_dact and _operand.FUSE_ACT_RECOMPUTE and a.per_tensor:
        fwd_scale = a.scales[3:4] if a.delayed else act_scale
    dy_op = quantize_operand(a.bwd_q[2], dy, rowwise=need_dact, columnwise=n_w2) if (need_dact or n_w2) else None
    d_ln = dw1 = db1 = dw2 = db2 = None
    if n_w2 and fwd_scale is None:
        dw2 = _fc2_wgrad(a, dy_op, _act_columnwise(a, h), w2_dt)
    if n_b2:
        db2 = dy.sum(dim=0, dtype=torch.float32)
    if not need_dact:
        return d_ln, dw1, db1, dw2, db2
    w2_col = _weight_dgrad(a, w2_keep, w2, 4)
    d_act = operand_gemm(dy_op, False, w2_col, True, out_dtype=dt, use_split_accumulator=a.split_acc[1])
    del w2_col
    # The fused path's fc2 wgrad (after the activation backward) reads dy's columnwise copy only.
    dy_op = dy_op.drop(rowwise=True) if fwd_scale is not None else None
    if a.delayed and (need_ln or n_w1):
        d1_op, db1, act_op = _act_grad_fp8(a, d_act, h, need_ln, n_w1, n_b1, fwd_scale)
        del d_act
        if fwd_scale is not None:
            dw2 = _fc2_wgrad(a, dy_op, act_op, w2_dt)
        del dy_op, act_op
    else:
        # (the fused amax only where it is quantized: asking for it resets the quantizer's amax)
        amax = fused_amax(a.bwd_q[0], h) if (need_ln or n_w1) else None
        (d1_hp, _, _, db1), act_op = _act_bwd(a, d_act, h, fwd_scale, amax=amax, dbias=n_b1)
        del d_act  # (before quantizing: the peak of the step is here)
        if fwd_scale is not None:  # (before quantizing too: act's and dy's columnwise copies are freed)
            dw2 = _fc2_wgrad(a, dy_op, act_op, w2_dt)
        del dy_op, act_op
        if not (need_ln or n_w1):
            return d_ln, dw1, db1, dw2, db2
        per_tensor = a.per_tensor
        # Per-tensor FP8 quantizes the rowwise copy only: its transpose is
        # exactly the columnwise copy (one scale), made after the dgrad GEMM
        # once the high-precision gradient is gone.
        d1_op = quantize_operand(
            a.bwd_q[0], d1_hp, rowwise=need_ln or per_tensor, columnwise=n_w1 and not per_tensor, amax=amax
        )
        del d1_hp
    if need_ln:
        w1_col = _weight_dgrad(a, w1_keep, w1, 1)
        d_ln = operand_gemm(d1_op, False, w1_col, True, out_dtype=dt, use_split_accumulator=a.split_acc[1])
        del w1_col
    if n_w1:
        d1_op = _columnwise(d1_op).drop(rowwise=True)  # (per-tensor: the rowwise copy is freed here)
        out, beta = _main_grad(a, a.fc1_param)
        kw = {"use_split_accumulator": a.split_acc[2], "out": out, "beta": beta}
        dw1 = operand_gemm(d1_op, True, _columnwise(ln_op), True, out_dtype=w1_dt, **kw)
    return d_ln, dw1, db1, dw2, db2


def _hp_wgrad(a: MLPArgs, param, dy, x, weight_dtype, bias_grad: bool):
    """(dW | None, bias gradient | None) = dy^T x, into main_grad under fuse_wgrad."""
    out, beta = _main_grad(a, param)
    if out is not None:
        return None, kernels.gemm_accumulate(dy, x, out, beta=beta, transa=True, bias_grad=bias_grad)
    dw, _, db = kernels.gemm(dy, x, transa=True, out_dtype=weight_dtype, bias_grad=bias_grad)
    return dw, db


def _backward_hp(a: MLPArgs, dtypes, dy, needs, saved):
    n_x, n_g, n_b, n_w1, n_b1, n_w2, n_b2 = needs
    ln, h, act, w1, w2 = saved
    w1_dt, _, w2_dt, _ = dtypes
    need_ln = n_x or n_g or n_b
    d_ln = dw1 = db1 = dw2 = db2 = None
    if n_w2:
        dw2, db2 = _hp_wgrad(a, a.fc2_param, dy, act, w2_dt, n_b2)
    if n_b2 and db2 is None:
        db2 = dy.sum(dim=0, dtype=torch.float32)
    if not (need_ln or n_w1 or n_b1):
        return d_ln, dw1, db1, dw2, db2
    d_act = kernels.gemm(dy, w2, out_dtype=a.act_dtype)[0]
    d1, _, _, db1 = kernels.activation_bwd(d_act, h, a.kind, dbias=n_b1, **a.act_params)
    del d_act
    if n_w1:
        dw1, _ = _hp_wgrad(a, a.fc1_param, d1, ln, w1_dt, False)
    if need_ln:
        d_ln = kernels.gemm(d1, w1, out_dtype=a.act_dtype)[0]
    return d_ln, dw1, db1, dw2, db2
