"""Activation ops of the MLP block: torch.ops.te.activation_fwd / activation_bwd
(and activation_bwd_fwd_columnwise: the backward that also writes the forward
output's FP8 columnwise copy, fc2's wgrad operand in LayerNormMLP).

te-core's formulas (core/include/te/activation.h): plain kinds act elementwise,
y = f(x); gated kinds split the last dim [..., 2H] into a = x[..., :H]
(activated) and b = x[..., H:] (linear) and return f(a) * lin(b). `kind` is the
core's code (transformer_engine.core.activation.ACTIVATIONS lists the names in
code order). Values are computed in FP32 and written once: rounded to
out_dtype, or quantized to FP8 with the delayed-scaling `scale` exactly as
quantize_fp8 would quantize the FP32 values (`amax` max-accumulated in place;
the op returns scale_inv). With a high-precision output, `amax` (if given)
max-accumulates the amax of the output as stored (rounded to out_dtype), so
current scaling can take its scale from it without another pass. The FP8
output can be rowwise and/or the [K, M] transposed "columnwise" copy.

The backward takes grad = dL/dy and the forward input x and returns
dL/dx (x's shape, optionally FP8 as above) and optionally the bias gradient
dbias[j] = sum over rows of dL/dx[:, j] in FP32 (the gradient of a bias added
before the activation: fc1's bias in LayerNormMLP).
limit / alpha / glu_linear_offset are clamped_swiglu's parameters.
"""

from __future__ import annotations

import torch

from transformer_engine.core import lib
from transformer_engine.core.activation import DEFAULT_PARAMS, is_gated

from ._common import FLOAT32, TORCH_TO_CODE, compiling, contiguous, desc, hp_desc, matrix_t_shape, stream_of, workspace
from .cast import _check_fp8, _or_empty


def _out_shape(x: torch.Tensor, kind: int) -> tuple:
    if not is_gated(kind):
        return tuple(x.shape)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"a gated activation (code {kind}) needs the input's last dim to be even "
            f"(halves [activated | linear]), got shape {tuple(x.shape)}"
        )
    return (*x.shape[:-1], x.shape[-1] // 2)


def _outputs(shape, like, out_dtype, fp8_dtype, scale, rowwise, columnwise):
    """(row, col, scale_inv, descriptors of all four FP8 slots)."""
    if fp8_dtype >= 0:
        _check_fp8(fp8_dtype)
        if scale is None:
            raise ValueError("argument 'scale' is required for an FP8 output (delayed scaling)")
        if not (rowwise or columnwise):
            raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
        row = torch.empty(shape, dtype=torch.uint8, device=like.device) if rowwise else None
        col = torch.empty(matrix_t_shape(shape), dtype=torch.uint8, device=like.device) if columnwise else None
        scale_inv = torch.empty((1,), dtype=torch.float32, device=like.device)
        descs = (
            None if row is None else desc(row, fp8_dtype),
            None if col is None else desc(col, fp8_dtype),
            desc(scale, FLOAT32),
            desc(scale_inv, FLOAT32),
        )
        return row, col, scale_inv, descs
    if columnwise:
        raise ValueError("a columnwise output needs an FP8 output (fp8_dtype >= 0)")
    row = torch.empty(shape, dtype=out_dtype, device=like.device)
    return row, None, None, (hp_desc(row, "out_dtype"), None, None, None)


def _activation_fwd(x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, limit, alpha, offset):
    x = contiguous(x)
    x_desc = hp_desc(x, "x")
    row, col, scale_inv, descs = _outputs(_out_shape(x, kind), x, out_dtype, fp8_dtype, scale, rowwise, columnwise)
    amax_desc = None if amax is None else desc(amax, FLOAT32)
    lib.activation_fwd(kind, x_desc, *descs, amax_desc, limit, alpha, offset, stream_of(x))
    return row, col, scale_inv


@torch.library.custom_op("te::activation_fwd", mutates_args=("amax",))
def _activation_fwd_op(
    x: torch.Tensor,
    kind: int,
    out_dtype: torch.dtype,
    fp8_dtype: int,
    scale: torch.Tensor | None,
    amax: torch.Tensor | None,
    rowwise: bool,
    columnwise: bool,
    limit: float,
    alpha: float,
    glu_linear_offset: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    row, col, scale_inv = _activation_fwd(
        x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, limit, alpha, glu_linear_offset
    )
    return _or_empty(row, x), _or_empty(col, x), _scale_inv_or_empty(scale_inv, x)


def _scale_inv_or_empty(scale_inv, like):
    return like.new_empty((0,), dtype=torch.float32) if scale_inv is None else scale_inv


def _fake_outputs(x, shape, out_dtype, fp8_dtype, rowwise, columnwise):
    fp8 = fp8_dtype >= 0
    row = x.new_empty(shape if rowwise else (0,), dtype=torch.uint8 if fp8 else out_dtype)
    col = x.new_empty(matrix_t_shape(shape) if columnwise else (0,), dtype=torch.uint8)
    return row, col, x.new_empty((1,) if fp8 else (0,), dtype=torch.float32)


def _bwd_op_results(row, col, scale_inv, bias, x):
    """The backward's outputs as an op returns them (no None: empty placeholders)."""
    bias = x.new_empty((0,), dtype=torch.float32) if bias is None else bias
    return _or_empty(row, x), _or_empty(col, x), _scale_inv_or_empty(scale_inv, x), bias


def _fake_bwd_results(x, out_dtype, fp8_dtype, rowwise, columnwise, dbias):
    row, col, scale_inv = _fake_outputs(x, tuple(x.shape), out_dtype, fp8_dtype, rowwise, columnwise)
    return row, col, scale_inv, x.new_empty((x.shape[-1],) if dbias else (0,), dtype=torch.float32)


def _bwd_call_results(results, fp8_dtype, rowwise, columnwise, dbias):
    """An op's (row, col, scale_inv, dbias) with the placeholders of what was not asked for as None."""
    row, col, scale_inv, bias = results
    fp8 = fp8_dtype >= 0
    return (
        (row if rowwise else None),
        (col if columnwise else None),
        (scale_inv if fp8 else None),
        (bias if dbias else None),
    )


@_activation_fwd_op.register_fake
def _(x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, limit, alpha, glu_linear_offset):
    return _fake_outputs(x, _out_shape(x, kind), out_dtype, fp8_dtype, rowwise, columnwise)


def activation_fwd(
    x,
    kind: int,
    *,
    out_dtype=None,
    fp8_dtype: int = -1,
    scale=None,
    amax=None,
    rowwise: bool = True,
    columnwise: bool = False,
    limit: float = DEFAULT_PARAMS["limit"],
    alpha: float = DEFAULT_PARAMS["alpha"],
    glu_linear_offset: float = DEFAULT_PARAMS["glu_linear_offset"],
):
    """y = f(x) (plain kinds) or f(a) * lin(b) (gated: last dim halved).

    Returns (rowwise | None, columnwise | None, scale_inv | None): rowwise has
    out_dtype (default x's), or is uint8 FP8 bytes when fp8_dtype >= 0 (then
    `scale` is required, `amax`, if given, is max-accumulated, and the
    columnwise [K, M] copy can be asked for).
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    args = (float(limit), float(alpha), float(glu_linear_offset))
    if compiling():
        row, col, scale_inv = torch.ops.te.activation_fwd(
            x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, *args
        )
        fp8 = fp8_dtype >= 0
        return (row if rowwise else None), (col if columnwise else None), (scale_inv if fp8 else None)
    return _activation_fwd(x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, *args)


def _activation_bwd(
    grad, x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, dbias, limit, alpha, offset, fwd=None
):
    """fwd: None, or (fwd_fp8_dtype, fwd_scale, fwd_values_dtype) for the
    forward output's FP8 columnwise copy written in the same pass; then also
    returns (its bytes, its scale_inv)."""
    grad, x = contiguous(grad), contiguous(x)
    x_desc, grad_desc = hp_desc(x, "x"), hp_desc(grad, "grad")
    if tuple(grad.shape) != _out_shape(x, kind):
        raise ValueError(
            f"argument 'grad' must have the forward output's shape {_out_shape(x, kind)}, got {tuple(grad.shape)}"
        )
    row, col, scale_inv, descs = _outputs(x.shape, x, out_dtype, fp8_dtype, scale, rowwise, columnwise)
    bias = torch.empty((x.shape[-1],), dtype=torch.float32, device=x.device) if dbias else None
    stream = stream_of(x)
    ws = workspace(lib.activation_bwd_workspace_size(x_desc, dbias), x, stream) if (dbias and x.is_cuda) else None
    args = (
        kind,
        grad_desc,
        x_desc,
        *descs,
        None if amax is None else desc(amax, FLOAT32),
        None if bias is None else desc(bias, FLOAT32),
        ws,
    )
    if fwd is None:
        lib.activation_bwd(*args, limit, alpha, offset, stream)
        return row, col, scale_inv, bias
    _, fwd_col, fwd_scale_inv, fwd_descs = _outputs(_out_shape(x, kind), x, None, fwd[0], fwd[1], False, True)
    values = TORCH_TO_CODE.get(fwd[2])
    if values is None:
        raise TypeError(f"argument 'fwd_values_dtype' must be float32, bfloat16 or float16, got {fwd[2]}")
    lib.activation_bwd_with_fwd_columnwise(*args, *fwd_descs[1:], values, limit, alpha, offset, stream)
    return row, col, scale_inv, bias, fwd_col, fwd_scale_inv


@torch.library.custom_op("te::activation_bwd", mutates_args=("amax",))
def _activation_bwd_op(
    grad: torch.Tensor,
    x: torch.Tensor,
    kind: int,
    out_dtype: torch.dtype,
    fp8_dtype: int,
    scale: torch.Tensor | None,
    amax: torch.Tensor | None,
    rowwise: bool,
    columnwise: bool,
    dbias: bool,
    limit: float,
    alpha: float,
    glu_linear_offset: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    results = _activation_bwd(
        grad, x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, dbias, limit, alpha, glu_linear_offset
    )
    return _bwd_op_results(*results, x)


@_activation_bwd_op.register_fake
def _(grad, x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, dbias, limit, alpha, glu_linear_offset):
    return _fake_bwd_results(x, out_dtype, fp8_dtype, rowwise, columnwise, dbias)


def activation_bwd(
    grad,
    x,
    kind: int,
    *,
    out_dtype=None,
    fp8_dtype: int = -1,
    scale=None,
    amax=None,
    rowwise: bool = True,
    columnwise: bool = False,
    dbias: bool = False,
    limit: float = DEFAULT_PARAMS["limit"],
    alpha: float = DEFAULT_PARAMS["alpha"],
    glu_linear_offset: float = DEFAULT_PARAMS["glu_linear_offset"],
):
    """dL/dx = grad * f'(x) (gated kinds: both halves), see the module docstring.

    Returns (rowwise | None, columnwise | None, scale_inv | None, dbias | None);
    the outputs are described as in `activation_fwd`, dbias is FP32 [K].
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    args = (float(limit), float(alpha), float(glu_linear_offset))
    if compiling():
        results = torch.ops.te.activation_bwd(
            grad, x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, dbias, *args
        )
        return _bwd_call_results(results, fp8_dtype, rowwise, columnwise, dbias)
    return _activation_bwd(grad, x, kind, out_dtype, fp8_dtype, scale, amax, rowwise, columnwise, dbias, *args)


@torch.library.custom_op("te::activation_bwd_fwd_columnwise", mutates_args=("amax",))
def _activation_bwd_fwd_columnwise_op(
    grad: torch.Tensor,
    x: torch.Tensor,
    kind: int,
    out_dtype: torch.dtype,
    fp8_dtype: int,
    scale: torch.Tensor | None,
    amax: torch.Tensor | None,
    rowwise: bool,
    columnwise: bool,
    dbias: bool,
    fwd_fp8_dtype: int,
    fwd_scale: torch.Tensor,
    fwd_values_dtype: torch.dtype,
    limit: float,
    alpha: float,
    glu_linear_offset: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    row, col, scale_inv, bias, fwd_col, fwd_scale_inv = _activation_bwd(
        grad,
        x,
        kind,
        out_dtype,
        fp8_dtype,
        scale,
        amax,
        rowwise,
        columnwise,
        dbias,
        limit,
        alpha,
        glu_linear_offset,
        (fwd_fp8_dtype, fwd_scale, fwd_values_dtype),
    )
    return *_bwd_op_results(row, col, scale_inv, bias, x), fwd_col, fwd_scale_inv


@_activation_bwd_fwd_columnwise_op.register_fake
def _(
    grad,
    x,
    kind,
    out_dtype,
    fp8_dtype,
    scale,
    amax,
    rowwise,
    columnwise,
    dbias,
    fwd_fp8_dtype,
    fwd_scale,
    fwd_values_dtype,
    limit,
    alpha,
    glu_linear_offset,
):
    _, fwd_col, fwd_scale_inv = _fake_outputs(x, _out_shape(x, kind), None, fwd_fp8_dtype, False, True)
    return *_fake_bwd_results(x, out_dtype, fp8_dtype, rowwise, columnwise, dbias), fwd_col, fwd_scale_inv


def activation_bwd_fwd_columnwise(
    grad,
    x,
    kind: int,
    *,
    fwd_fp8_dtype: int,
    fwd_scale,
    fwd_values_dtype=torch.float32,
    out_dtype=None,
    fp8_dtype: int = -1,
    scale=None,
    amax=None,
    rowwise: bool = True,
    columnwise: bool = False,
    dbias: bool = False,
    limit: float = DEFAULT_PARAMS["limit"],
    alpha: float = DEFAULT_PARAMS["alpha"],
    glu_linear_offset: float = DEFAULT_PARAMS["glu_linear_offset"],
):
    """`activation_bwd` that also writes, in the same pass, the forward output
    y = f(x) quantized to FP8 columnwise ([H, M]) with `fwd_scale`: the bytes of
    activation_fwd(x, kind, fp8_dtype=fwd_fp8_dtype, scale=fwd_scale,
    rowwise=False, columnwise=True) with fwd_values_dtype float32, or of
    quantize_fp8 (columnwise) of activation_fwd(x, kind, out_dtype=
    fwd_values_dtype) with bfloat16/float16 (y rounded to it first).

    Returns (rowwise | None, columnwise | None, scale_inv | None, dbias | None,
    fwd_columnwise, fwd_scale_inv).
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    args = (float(limit), float(alpha), float(glu_linear_offset))
    if fwd_fp8_dtype < 0 or fwd_scale is None:
        raise ValueError("the forward columnwise copy needs an FP8 'fwd_fp8_dtype' and 'fwd_scale'")
    if compiling():
        *results, fwd_col, fwd_scale_inv = torch.ops.te.activation_bwd_fwd_columnwise(
            grad,
            x,
            kind,
            out_dtype,
            fp8_dtype,
            scale,
            amax,
            rowwise,
            columnwise,
            dbias,
            fwd_fp8_dtype,
            fwd_scale,
            fwd_values_dtype,
            *args,
        )
        return *_bwd_call_results(results, fp8_dtype, rowwise, columnwise, dbias), fwd_col, fwd_scale_inv
    return _activation_bwd(
        grad,
        x,
        kind,
        out_dtype,
        fp8_dtype,
        scale,
        amax,
        rowwise,
        columnwise,
        dbias,
        *args,
        (fwd_fp8_dtype, fwd_scale, fwd_values_dtype),
    )
