"""The autograd function of te.LayerNormMLP:

    ln  = norm(x)                      (LayerNorm or RMSNorm, _norm_parts)
    h   = ln W1^T + b1                 (fc1: [T, H] -> [T, F1], F1 = 2F for gated kinds)
    a   = act(h)                       (kernels.activation: [T, F1] -> [T, F])
    out = a W2^T + b2                  (fc2: [T, F] -> [T, H])

Under FP8 (DelayedScaling, Float8CurrentScaling) the GEMMs are Linear's TN
triple (_linear_fn): fprop x rowwise . W rowwise, dgrad dy rowwise . W
columnwise, wgrad dy columnwise . x columnwise. Forward quantizer slots are
0/1 fc1 input/weight and 3/4 fc2 input/weight; backward slots 0 (fc1's
grad_output, the activation's gradient) and 2 (fc2's grad_output).

Delayed scaling writes FP8 straight from the kernels: the norm's output and
the activation's output are quantized in the kernels that compute them, and
the activation backward writes fc1's FP8 gradient (both copies) together with
the fc1 bias gradient. Current scaling computes those tensors in high
precision and then quantizes them with their own amax.

What backward keeps under FP8 (the memory goal: fewer saved bytes than the
BF16 module, and a lower step peak):
  - x, mu, rsigma (the norm's backward; x is the caller's tensor anyway),
  - ln as FP8 rowwise bytes (transposed in backward for fc1's wgrad),
  - h in high precision (the activation backward needs the exact values).
It does not keep the activation output nor FP8 copies of the weights: fc2's
wgrad operand (a columnwise) is recomputed from h by the activation kernel,
and the weights' columnwise copies are quantized again from the parameters,
both with the forward's scales (saved; delayed scaling updates the scales at
the autocast exit, before backward), so the bytes equal the forward's. Weights
cached across microbatches (is_first_microbatch) keep both copies in the
cache and are not quantized again. Without FP8 the function keeps ln, h and
a in high precision.
"""

from __future__ import annotations

import torch

from .. import kernels


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
        "kind",
        "module",
        "return_ln",
        "reuse_weight",
        "scales",
        "split_acc",
        "zero_centered_gamma",
    )

    def __init__(self) -> None:
        self.fp8 = False
        self.calibrate = False
        self.bwd_queue = None


def _code(quantizer) -> int:
    return int(quantizer.dtype)


def _tn(a_op, b_op, split: bool, out_dtype, bias=None, out=None, beta: float = 0.0):
    """op_a @ op_b^T of two FP8 operands (bytes, code, scale_inv): a new
    tensor of out_dtype, or accumulated into `out` (beta * out + ...)."""
    kw = {
        "a_dtype": a_op[1],
        "a_scale_inv": a_op[2],
        "b_dtype": b_op[1],
        "b_scale_inv": b_op[2],
        "transb": True,
        "use_split_accumulator": split,
    }
    if out is not None:
        kernels.gemm_accumulate(a_op[0], b_op[0], out, beta=beta, **kw)
        return None
    return kernels.gemm(a_op[0], b_op[0], out_dtype=out_dtype, bias=bias, **kw)[0]


def _main_grad(a: MLPArgs, param):
    """(out, beta) of a wgrad GEMM: param.main_grad under fuse_wgrad_accumulation, else (None, 0)."""
    if not a.fuse_wgrad:
        return None, 0.0
    param.grad_added_to_main_grad = True
    return param.main_grad, (0.0 if getattr(param, "overwrite_main_grad", False) else 1.0)


# --------------------------------------------------------------------------- FP8 weights


def _weight_fprop(a: MLPArgs, key: str, weight, slot: int):
    """(rowwise, columnwise | None, scale_inv) of a weight for the fprop GEMM."""
    cache = a.module._weight_cache or {}
    if a.reuse_weight and key in cache:
        return cache[key]
    parts = a.fwd_q[slot].quantize_parts(weight, True, a.cache_weight)
    if a.cache_weight:
        cache[key] = parts
        a.module._weight_cache = cache
    return parts


def _weight_dgrad(a: MLPArgs, parts, weight, slot: int):
    """(columnwise, code, scale_inv): from the cache, else quantized again with the forward's scale."""
    q = a.fwd_q[slot]
    if parts[1] is not None:
        return parts[1], _code(q), parts[2]
    if a.delayed:
        _, col, scale_inv = kernels.quantize_fp8(weight, a.scales[slot : slot + 1], None, _code(q), False, True)
    else:  # current scaling: the same weight gives the same scale and bytes
        _, col, scale_inv = q.quantize_parts(weight, False, True)
    return col, _code(q), scale_inv


# --------------------------------------------------------------------------- forward


def _forward_fp8(ctx, x, gamma, beta, w1, b1, w2, b2, a: MLPArgs):
    q = a.fwd_q
    dt = a.act_dtype
    ln_hp = None
    if a.delayed and not a.return_ln:
        ln_r, mu, rsigma, ln_s = kernels.norm_fwd(
            x, gamma, beta, a.eps, a.zero_centered_gamma, fp8_dtype=_code(q[0]), scale=q[0].scale, amax=q[0].amax
        )
    else:
        ln_hp, mu, rsigma, _ = kernels.norm_fwd(x, gamma, beta, a.eps, a.zero_centered_gamma, out_dtype=dt)
        ln_r, _, ln_s = q[0].quantize_parts(ln_hp, True, False)
    w1_parts = _weight_fprop(a, "fc1", w1, 1)
    w2_parts = _weight_fprop(a, "fc2", w2, 4)
    ln_op = (ln_r, _code(q[0]), ln_s)
    h = _tn(ln_op, (w1_parts[0], _code(q[1]), w1_parts[2]), a.split_acc[0], dt, bias=b1)
    if a.delayed:
        act_r, _, act_s = kernels.activation_fwd(
            h, a.kind, fp8_dtype=_code(q[3]), scale=q[3].scale, amax=q[3].amax, **a.act_params
        )
    else:
        act_hp = kernels.activation_fwd(h, a.kind, **a.act_params)[0]
        act_r, _, act_s = q[3].quantize_parts(act_hp, True, False)
        del act_hp
    out = _tn((act_r, _code(q[3]), act_s), (w2_parts[0], _code(q[4]), w2_parts[2]), a.split_acc[0], dt, bias=b2)
    ctx.save_for_backward(x, mu, rsigma, gamma, ln_r, ln_s, h, w1, w2)
    ctx.weight_parts = (w1_parts, w2_parts)
    return out, ln_hp


def _forward_hp(ctx, x, gamma, beta, w1, b1, w2, b2, a: MLPArgs):
    dt = a.act_dtype
    ln, mu, rsigma, _ = kernels.norm_fwd(x, gamma, beta, a.eps, a.zero_centered_gamma, out_dtype=dt)
    w1, w2 = w1.to(dt), w2.to(dt)
    h = kernels.gemm(ln, w1, transb=True, out_dtype=dt, bias=b1)[0]
    act = kernels.activation_fwd(h, a.kind, **a.act_params)[0]
    out = kernels.gemm(act, w2, transb=True, out_dtype=dt, bias=b2)[0]
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
        run = _forward_fp8 if a.fp8 else _forward_hp
        if a.fp8 and a.delayed:
            # The scales this forward used (the autocast exit updates them before backward).
            a.scales = a.module.fp8_meta["scaling_fwd"].scale.clone()
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
        run = _backward_fp8 if a.fp8 else _backward_hp
        d_ln, dw1, db1, dw2, db2 = run(ctx, a, dy, needs)
        dx = dgamma = dbeta = None
        if d_ln is not None:
            x, mu, rsigma, gamma = ctx.saved_tensors[:4]
            if grad_ln and grad_ln[0] is not None:  # the returned layernorm output's gradient
                d_ln = d_ln + grad_ln[0].reshape(d_ln.shape)
            dx, dgamma, dbeta = kernels.norm_bwd(d_ln.to(x.dtype), x, mu, rsigma, gamma, a.zero_centered_gamma)
            dx = dx.view(ctx.inp_shape)
        w1_dt, b1_dt, w2_dt, b2_dt = ctx.dtypes
        db1 = None if db1 is None else db1.to(b1_dt)
        db2 = None if db2 is None else db2.to(b2_dt)
        if a.bwd_queue is not None:
            # The first FP8 module of the autocast region runs last in backward:
            # the backward delayed-scaling update happens here (§3.3).
            a.bwd_queue.run()
        return dx, dgamma, dbeta, dw1, db1, dw2, db2, None


# --------------------------------------------------------------------------- backward


def _backward_fp8(ctx, a: MLPArgs, dy, needs):
    n_x, n_g, n_b, n_w1, n_b1, n_w2, n_b2 = needs
    _, _, _, _, ln_r, ln_s, h, w1, w2 = ctx.saved_tensors
    w1_parts, w2_parts = ctx.weight_parts
    w1_dt, _, w2_dt, _ = ctx.dtypes
    q, gq = a.fwd_q, a.bwd_q
    need_ln = n_x or n_g or n_b
    need_dact = need_ln or n_w1 or n_b1
    dt = a.act_dtype
    dyr, dyc, dys = gq[2].quantize_parts(dy, need_dact, n_w2) if (need_dact or n_w2) else (None, None, None)
    g2 = _code(gq[2])
    d_ln = dw1 = db1 = dw2 = db2 = None
    if n_w2:
        if a.delayed:
            _, act_c, act_s = kernels.activation_fwd(
                h, a.kind, fp8_dtype=_code(q[3]), scale=a.scales[3:4], rowwise=False, columnwise=True, **a.act_params
            )
        else:
            act_hp = kernels.activation_fwd(h, a.kind, **a.act_params)[0]
            _, act_c, act_s = q[3].quantize_parts(act_hp, False, True)
            del act_hp
        out, beta = _main_grad(a, a.fc2_param)
        dw2 = _tn((dyc, g2, dys), (act_c, _code(q[3]), act_s), a.split_acc[2], w2_dt, out=out, beta=beta)
    if n_b2:
        db2 = dy.sum(dim=0, dtype=torch.float32)
    if not need_dact:
        return d_ln, dw1, db1, dw2, db2
    d_act = _tn((dyr, g2, dys), _weight_dgrad(a, w2_parts, w2, 4), a.split_acc[1], dt)
    del dyr, dyc
    g1 = _code(gq[0])
    fp8_grad = need_ln or n_w1
    if fp8_grad and a.delayed:
        d1r, d1c, d1s, db1 = kernels.activation_bwd(
            d_act,
            h,
            a.kind,
            fp8_dtype=g1,
            scale=gq[0].scale,
            amax=gq[0].amax,
            rowwise=need_ln,
            columnwise=n_w1,
            dbias=n_b1,
            **a.act_params,
        )
    else:
        d1_hp, _, _, db1 = kernels.activation_bwd(d_act, h, a.kind, dbias=n_b1, **a.act_params)
        if fp8_grad:
            d1r, d1c, d1s = gq[0].quantize_parts(d1_hp, need_ln, n_w1)
        del d1_hp
    del d_act
    if n_w1:
        ln_c = ln_r.t().contiguous()
        out, beta = _main_grad(a, a.fc1_param)
        dw1 = _tn((d1c, g1, d1s), (ln_c, _code(q[0]), ln_s), a.split_acc[2], w1_dt, out=out, beta=beta)
    if need_ln:
        d_ln = _tn((d1r, g1, d1s), _weight_dgrad(a, w1_parts, w1, 1), a.split_acc[1], dt)
    return d_ln, dw1, db1, dw2, db2


def _hp_wgrad(a: MLPArgs, param, dy, x, weight_dtype, bias_grad: bool):
    """(dW | None, bias gradient | None) = dy^T x, into main_grad under fuse_wgrad."""
    out, beta = _main_grad(a, param)
    if out is not None:
        return None, kernels.gemm_accumulate(dy, x, out, beta=beta, transa=True, bias_grad=bias_grad)
    dw, _, db = kernels.gemm(dy, x, transa=True, out_dtype=weight_dtype, bias_grad=bias_grad)
    return dw, db


def _backward_hp(ctx, a: MLPArgs, dy, needs):
    n_x, n_g, n_b, n_w1, n_b1, n_w2, n_b2 = needs
    _, _, _, _, ln, h, act, w1, w2 = ctx.saved_tensors
    w1_dt, _, w2_dt, _ = ctx.dtypes
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
