"""The autograd function of te.Linear: y = x W^T + b over te-core GEMMs.

Under FP8 (§3.2 of the reference), with x viewed as [M, K] and W [N, K]:
    fprop  y  = x W^T   x rowwise (E4M3)    . W rowwise (E4M3)
    dgrad  dx = dy W    dy rowwise (E5M2 under HYBRID) . W columnwise
    wgrad  dW = dy^T x  dy columnwise . x columnwise
The columnwise copies are the [K, M]-style transposes the quantize kernels
write in the same pass as the rowwise bytes, so all three GEMMs are in the
"TN" form Hopper FP8 needs and the core copies nothing. Backward keeps only
what it uses: the FP8 columnwise x (when W needs a gradient) and the FP8
columnwise W (when x needs one) -- never the high-precision input.
The bias gradient is summed from the high-precision dy (the FP8 dy would
add its quantization error to it).

Without FP8 the same GEMMs run in high precision through the core, the
bias gradient fused into the wgrad GEMM.
"""

from __future__ import annotations

import torch

from .. import kernels


class LinearArgs:
    """Everything but the tensors that the forward and backward need."""

    __slots__ = (
        "act_dtype",
        "bwd_queue",
        "cache_weight",
        "fp8",
        "fuse_wgrad",
        "grad_q",
        "input_q",
        "module",
        "reuse_weight",
        "split_acc",
        "weight_param",
        "weight_q",
    )

    def __init__(self) -> None:
        self.fp8 = False
        self.bwd_queue = None


def check_fp8_dims(tokens: int, in_features: int, out_features: int) -> None:
    if tokens % 16 or in_features % 16 or out_features % 16:
        raise ValueError(
            "te.Linear under FP8 needs the number of tokens (the product of the input's leading "
            f"dims) and in_features/out_features divisible by 16, got tokens={tokens}, "
            f"in_features={in_features}, out_features={out_features}. Pad the sequence or batch "
            "to a multiple of 16 (e.g. torch.nn.functional.pad) and the feature sizes of the "
            "layer, or run this layer outside te.autocast"
        )


def _quantized_weight(a: LinearArgs, weight: torch.Tensor, need_columnwise: bool):
    """(rowwise, columnwise, scale_inv) of W; cached across microbatches when asked."""
    module = a.module
    if a.reuse_weight and module._weight_cache is not None:
        return module._weight_cache
    parts = a.weight_q.quantize_parts(weight, True, need_columnwise or a.cache_weight)
    if a.cache_weight:
        module._weight_cache = parts
    return parts


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, weight, bias, a: LinearArgs):
        in_features = weight.shape[1]
        # (2-D inputs skip the reshape/view pairs: each is a dispatcher call.)
        x = inp if inp.dim() == 2 else inp.reshape(-1, in_features)
        if a.fp8:
            check_fp8_dims(x.shape[0], in_features, weight.shape[0])
            need_wgrad = weight.requires_grad
            xr, xc, xs = a.input_q.quantize_parts(x, True, need_wgrad)
            wr, wc, ws = _quantized_weight(a, weight, inp.requires_grad)
            x_code, w_code = int(a.input_q.dtype), int(a.weight_q.dtype)
            out, _, _ = kernels.gemm(
                xr,
                wr,
                a_dtype=x_code,
                a_scale_inv=xs,
                b_dtype=w_code,
                b_scale_inv=ws,
                transb=True,
                out_dtype=a.act_dtype,
                bias=bias,
                use_split_accumulator=a.split_acc[0],
            )
            ctx.save_for_backward(xc if need_wgrad else None, xs, wc, ws)
            ctx.codes = (x_code, w_code)
        else:
            x = x.to(a.act_dtype)
            w = weight.to(a.act_dtype)
            out, _, _ = kernels.gemm(x, w, transb=True, out_dtype=a.act_dtype, bias=bias)
            ctx.save_for_backward(x, w)
        ctx.args = a
        ctx.inp_shape = inp.shape
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out if inp.dim() == 2 else out.view(*inp.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        a: LinearArgs = ctx.args
        need_dgrad, need_wgrad, need_bgrad = ctx.needs_input_grad[:3]
        dy = grad_out if grad_out.dim() == 2 else grad_out.reshape(-1, grad_out.shape[-1])
        if dy.dtype != a.act_dtype:
            dy = dy.to(a.act_dtype)
        if a.fp8:
            dx, dw, db = _fp8_backward(ctx, a, dy, need_dgrad, need_wgrad, need_bgrad)
        else:
            dx, dw, db = _hp_backward(ctx, a, dy, need_dgrad, need_wgrad, need_bgrad)
        if db is not None and db.dtype != ctx.bias_dtype:
            db = db.to(ctx.bias_dtype)
        if a.bwd_queue is not None:
            # The first FP8 module of the autocast region runs last in backward:
            # the backward delayed-scaling update happens here (§3.3).
            a.bwd_queue.run()
        if dx is not None and len(ctx.inp_shape) != 2:
            dx = dx.view(ctx.inp_shape)
        return dx, dw, db, None


def _wgrad(ctx, a: LinearArgs, run):
    """Runs the wgrad GEMM into a new tensor, or into weight.main_grad.

    run(out, beta) does the GEMM into `out` (None: a new tensor) and returns
    (dW or None, bias_grad or None).
    """
    if not a.fuse_wgrad:
        return run(None, 0.0)
    param = a.weight_param
    beta = 0.0 if getattr(param, "overwrite_main_grad", False) else 1.0
    _, db = run(param.main_grad, beta)
    param.grad_added_to_main_grad = True
    return None, db


def _fp8_backward(ctx, a, dy, need_dgrad, need_wgrad, need_bgrad):
    xc, xs, wc, ws = ctx.saved_tensors
    x_code, w_code = ctx.codes
    g_code = int(a.grad_q.dtype)
    dx = dw = db = None
    if need_dgrad or need_wgrad:  # (only the bias may need a gradient)
        dyr, dyc, dys = a.grad_q.quantize_parts(dy, need_dgrad, need_wgrad)
    if need_dgrad:
        dx, _, _ = kernels.gemm(
            dyr,
            wc,
            a_dtype=g_code,
            a_scale_inv=dys,
            b_dtype=w_code,
            b_scale_inv=ws,
            transb=True,
            out_dtype=a.act_dtype,
            use_split_accumulator=a.split_acc[1],
        )
    if need_wgrad:

        def run(out, beta):
            kw = {
                "a_dtype": g_code,
                "a_scale_inv": dys,
                "b_dtype": x_code,
                "b_scale_inv": xs,
                "transb": True,
                "use_split_accumulator": a.split_acc[2],
            }
            if out is None:
                return kernels.gemm(dyc, xc, out_dtype=ctx.weight_dtype, **kw)[0], None
            kernels.gemm_accumulate(dyc, xc, out, beta=beta, **kw)
            return None, None

        dw, _ = _wgrad(ctx, a, run)
    if need_bgrad:  # (accumulated in FP32 by torch, rounded once to the bias dtype)
        db = dy.sum(dim=0, dtype=ctx.bias_dtype)
    return dx, dw, db


def _hp_backward(ctx, a, dy, need_dgrad, need_wgrad, need_bgrad):
    x, w = ctx.saved_tensors
    dx = dw = db = None
    if need_dgrad:
        dx, _, _ = kernels.gemm(dy, w, out_dtype=a.act_dtype)
    if need_wgrad:

        def run(out, beta):
            if out is None:
                dw, _, grad = kernels.gemm(dy, x, transa=True, out_dtype=ctx.weight_dtype, bias_grad=need_bgrad)
                return dw, grad
            return None, kernels.gemm_accumulate(dy, x, out, beta=beta, transa=True, bias_grad=need_bgrad)

        dw, db = _wgrad(ctx, a, run)
    if need_bgrad and db is None:
        db = dy.sum(dim=0, dtype=torch.float32)
    return dx, dw, db
