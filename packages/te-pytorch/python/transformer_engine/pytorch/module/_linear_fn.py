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
The block recipes (MXFP8, FP8 block, NVFP4) run the same three GEMMs on
their rowwise/columnwise copies through the Operand interface of
_operand.py (kernels.gemm_block; emulated where the device has no native
kernel, with a one-time warning).
The bias gradient is summed from the high-precision dy (the FP8 dy would
add its quantization error to it).

Without FP8 the same GEMMs run in high precision through the core, the
bias gradient fused into the wgrad GEMM.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..tensor import Float8Tensor, QuantizedTensor
from ._operand import Operand, operand_gemm, quantize_operand, tensor_operand


class LinearArgs:
    """Everything but the tensors that the forward and backward need."""

    __slots__ = (
        "act_dtype",
        "bwd_queue",
        "cache_weight",
        "fp8",
        "fuse_wgrad",
        "grad_q",
        "input_amax",
        "input_q",
        "reuse_weight",
        "split_acc",
        "weight_cache",
        "weight_param",
        "weight_q",
    )

    def __init__(self) -> None:
        self.fp8 = False
        self.cache_weight = False
        self.bwd_queue = None
        self.input_amax = None  # max|input| from the kernel that wrote it (LayerNormLinear, current scaling)
        # In: the module's cached weight Operand (reused when reuse_weight). Out:
        # the Operand to cache, when cache_weight (the module stores it: the
        # function writes no module state).
        self.weight_cache = None


def _quantized_weight(a: LinearArgs, weight: torch.Tensor, need_columnwise: bool) -> Operand:
    """The Operand of W (rowwise, and columnwise when needed); cached across microbatches when asked."""
    if isinstance(weight, QuantizedTensor):  # quantized_model_init: the parameter's own bytes
        return tensor_operand(weight, columnwise=need_columnwise)
    if a.reuse_weight and a.weight_cache is not None:
        return a.weight_cache
    op = quantize_operand(a.weight_q, weight, rowwise=True, columnwise=need_columnwise or a.cache_weight)
    if a.cache_weight:
        a.weight_cache = op
    return op


def _operand_of_float8(t: Float8Tensor, in_features: int, a: LinearArgs) -> Operand:
    """The per-tensor Operand of an input its producer already quantized."""
    fields = {"row": t._data.view(-1, in_features), "col": t._transpose, "scale_inv": t._scale_inv}
    return Operand("fp8", {**fields, "code": int(a.input_q.dtype)})


def linear_forward(ctx, inp, weight, bias, a: LinearArgs, need_dgrad: bool, need_wgrad: bool):
    """y = inp W^T (+ bias), saving in `ctx` what linear_backward needs.

    ctx: an autograd ctx, or any object with save_for_backward / saved_tensors
    (te.ops' OperationContext). need_dgrad / need_wgrad: whether backward will
    compute the input / weight gradient (what is kept for it depends on them;
    te.Linear passes the tensors' requires_grad, the ops fuser its own flags,
    since tensors made inside its autograd function never require grad)."""
    in_features = weight.shape[1]
    # (2-D inputs skip the reshape/view pairs: each is a dispatcher call. A
    # pre-quantized input is read through its own fields, never reshaped.)
    x = inp if inp.dim() == 2 or isinstance(inp, Float8Tensor) else inp.reshape(-1, in_features)
    if a.fp8:  # (the module checked the recipe's dimension rule)
        if isinstance(inp, Float8Tensor):
            # Already quantized by the producer (LayerNormLinear's fused norm).
            x_op = _operand_of_float8(inp, in_features, a)
        else:
            x_op = quantize_operand(a.input_q, x, rowwise=True, columnwise=need_wgrad, amax=a.input_amax)
        w_op = _quantized_weight(a, weight, need_dgrad)
        out = operand_gemm(
            x_op, False, w_op, False, out_dtype=a.act_dtype, bias=bias, use_split_accumulator=a.split_acc[0]
        )
        # Backward keeps the quantized copies it uses, never the high-precision input.
        x_keep = x_op.drop(rowwise=True, columnwise=not need_wgrad)
        w_keep = w_op.drop(rowwise=True, columnwise=not need_dgrad)
        ctx.operands = (x_keep, w_keep)
        x_saved = x_keep.tensors()
        ctx.n_x = len(x_saved)
        ctx.save_for_backward(*x_saved, *w_keep.tensors())
    else:
        # (.to is skipped when the dtype already matches: even a no-op .to is a dispatcher call)
        x = x if x.dtype == a.act_dtype else x.to(a.act_dtype)
        w = weight if weight.dtype == a.act_dtype else weight.to(a.act_dtype)
        out, _, _ = kernels.gemm(x, w, transb=True, out_dtype=a.act_dtype, bias=bias)
        ctx.save_for_backward(x, w)
    ctx.args = a
    ctx.inp_shape = inp.shape
    ctx.weight_dtype = weight.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype
    return out if inp.dim() == 2 else out.view(*inp.shape[:-1], weight.shape[0])


def linear_backward(ctx, grad_out, need_dgrad: bool, need_wgrad: bool, need_bgrad: bool):
    """(dx, dW, db) of a linear_forward (None where not needed; dW is None
    under fuse_wgrad, where it went into weight.main_grad)."""
    a: LinearArgs = ctx.args
    dy = grad_out if grad_out.dim() == 2 else grad_out.reshape(-1, grad_out.shape[-1])
    if dy.dtype != a.act_dtype:
        dy = dy.to(a.act_dtype)
    if a.fp8:
        dx, dw, db = _fp8_backward(ctx, a, dy, need_dgrad, need_wgrad, need_bgrad)
    else:
        dx, dw, db = _hp_backward(ctx, a, dy, need_dgrad, need_wgrad, need_bgrad)
    if db is not None and db.dtype != ctx.bias_dtype:
        db = db.to(ctx.bias_dtype)
    if dx is not None and len(ctx.inp_shape) != 2:
        dx = dx.view(ctx.inp_shape)
    return dx, dw, db


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, weight, bias, a: LinearArgs):
        return linear_forward(ctx, inp, weight, bias, a, inp.requires_grad, weight.requires_grad)

    @staticmethod
    def backward(ctx, grad_out):
        a: LinearArgs = ctx.args
        dx, dw, db = linear_backward(ctx, grad_out, *ctx.needs_input_grad[:3])
        if a.bwd_queue is not None:
            # The first FP8 module of the autocast region runs last in backward:
            # the backward delayed-scaling update happens here (§3.3).
            a.bwd_queue.run()
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
    saved = ctx.saved_tensors
    x_keep, w_keep = ctx.operands
    x_op, w_op = x_keep.with_tensors(saved[: ctx.n_x]), w_keep.with_tensors(saved[ctx.n_x :])
    dx = dw = db = None
    if need_dgrad or need_wgrad:  # (only the bias may need a gradient)
        dy_op = quantize_operand(a.grad_q, dy, rowwise=need_dgrad, columnwise=need_wgrad)
    if need_dgrad:
        dx = operand_gemm(dy_op, False, w_op, True, out_dtype=a.act_dtype, use_split_accumulator=a.split_acc[1])
    if need_wgrad:

        def run(out, beta):
            kw = {"use_split_accumulator": a.split_acc[2], "out": out, "beta": beta}
            return operand_gemm(dy_op, True, x_op, True, out_dtype=ctx.weight_dtype, **kw), None

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
