"""Activation ops of the MLP block: torch.ops.te.activation_fwd / activation_bwd
(and activation_bwd_fwd_columnwise: the backward that also writes the forward
output's FP8 columnwise copy, fc2's wgrad operand in LayerNormMLP).

te-core's formulas (core/include/te/activation.h): plain kinds act elementwise,
y = f(x); gated kinds split the last dim [..., 2H] into a = x[..., :H]
(activated) and b = x[..., H:] (linear) and return f(a) * lin(b). `kind` is a
name of transformer_engine.core.activation.ACTIVATIONS ("gelu", "swiglu", ...),
as in te-jax. Values are computed in FP32 and written once: rounded to
out_dtype, or quantized to FP8 with the delayed-scaling `scale` exactly as
quantize_fp8 would quantize the FP32 values (`amax` max-accumulated in place;
the op returns scale_inv). With a high-precision output, `amax` (if given)
max-accumulates the amax of the output as stored (rounded to out_dtype), so
current scaling can take its scale from it without another pass. The FP8
output can be rowwise and/or the [K, M] transposed "columnwise" copy.

The backward takes dy = dL/dy and the forward input x and returns
dL/dx (x's shape, optionally FP8 as above) and optionally the bias gradient
dbias[j] = sum over rows of dL/dx[:, j] in FP32 (the gradient of a bias added
before the activation: fc1's bias in LayerNormMLP).
limit / alpha / glu_linear_offset are clamped_swiglu's parameters.
"""

from __future__ import annotations

from typing import NamedTuple, Unpack

import torch
from torch import Tensor

from transformer_engine.core import lib
from transformer_engine.core.activation import ACTIVATION_KINDS, ACTIVATIONS, DEFAULT_PARAMS, is_gated

from ._common import (
    FLOAT32,
    TORCH_TO_CODE,
    contiguous,
    desc,
    hp_desc,
    matrix_t_shape,
    signature_without,
    stream_of,
    te_op,
    workspace,
)
from .cast import _check_fp8, fp8_shapes

_CODES = {k["name"]: k["code"] for k in ACTIVATION_KINDS}


def _code(kind: str) -> int:
    code = _CODES.get(kind.lower() if isinstance(kind, str) else None)
    if code is None:
        raise ValueError(f"argument 'kind' must be one of {', '.join(ACTIVATIONS)}; got {kind!r}")
    return code


def _out_shape(x: torch.Tensor, code: int) -> tuple:
    if not is_gated(code):
        return tuple(x.shape)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"a gated activation ({ACTIVATIONS[code]!r}) needs the input's last dim to be even "
            f"(halves [activated | linear]), got shape {tuple(x.shape)}"
        )
    return (*x.shape[:-1], x.shape[-1] // 2)


class ActivationOptions(NamedTuple):
    """The keyword arguments of every activation op (a keyword group of
    _common.te_op): the output's format (out_dtype, default x's; or FP8 bytes
    when fp8_dtype >= 0, with the delayed-scaling `scale`, `amax`
    max-accumulated if given, rowwise and/or columnwise copies) and
    clamped_swiglu's parameters."""

    out_dtype: torch.dtype | None = None
    fp8_dtype: int = -1
    scale: Tensor | None = None
    amax: Tensor | None = None
    rowwise: bool = True
    columnwise: bool = False
    limit: float = DEFAULT_PARAMS["limit"]
    alpha: float = DEFAULT_PARAMS["alpha"]
    glu_linear_offset: float = DEFAULT_PARAMS["glu_linear_offset"]


def _outputs(shape, like, o: ActivationOptions):
    """(row, col, scale_inv, descriptors of all four FP8 slots) of an output of `shape` in o's format."""
    fp8_dtype = o.fp8_dtype
    if fp8_dtype >= 0:
        _check_fp8(fp8_dtype)
        if o.scale is None:
            raise ValueError("argument 'scale' is required for an FP8 output (delayed scaling)")
        if not (o.rowwise or o.columnwise):
            raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
        row = torch.empty(shape, dtype=torch.uint8, device=like.device) if o.rowwise else None
        col = torch.empty(matrix_t_shape(shape), dtype=torch.uint8, device=like.device) if o.columnwise else None
        scale_inv = torch.empty((1,), dtype=torch.float32, device=like.device)
        descs = (
            None if row is None else desc(row, fp8_dtype),
            None if col is None else desc(col, fp8_dtype),
            desc(o.scale, FLOAT32),
            desc(scale_inv, FLOAT32),
        )
        return row, col, scale_inv, descs
    if o.columnwise:
        raise ValueError("a columnwise output needs an FP8 output (fp8_dtype >= 0)")
    row = torch.empty(shape, dtype=like.dtype if o.out_dtype is None else o.out_dtype, device=like.device)
    return row, None, None, (hp_desc(row, "out_dtype"), None, None, None)


def _shapes(shape, a):
    """Shape-rule entries of (rowwise, columnwise, scale_inv) of an output of `shape`."""
    if a.fp8_dtype < 0:
        return (shape, a.x.dtype if a.out_dtype is None else a.out_dtype), None, None
    return (*fp8_shapes(shape, a.rowwise, a.columnwise), ((1,), torch.float32))


def _fwd_shapes(a):
    return _shapes(_out_shape(a.x, _code(a.kind)), a)


def _bwd_shapes(a):
    dbias = ((a.x.shape[-1],), torch.float32) if a.dbias else None
    grads = (*_shapes(tuple(a.x.shape), a), dbias)
    if not hasattr(a, "fwd_scale"):
        return grads
    return (*grads, (matrix_t_shape(_out_shape(a.x, _code(a.kind))), torch.uint8), ((1,), torch.float32))


_Outputs = tuple[Tensor | None, Tensor | None, Tensor | None]
_Grads = tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]


@te_op("activation_fwd", mutates_args=("amax",), shapes=_fwd_shapes)
def activation_fwd(x: Tensor, kind: str, **options: Unpack[ActivationOptions]) -> _Outputs:
    """y = f(x) (plain kinds) or f(a) * lin(b) (gated: last dim halved); the
    keyword arguments are ActivationOptions' fields.

    Returns (rowwise | None, columnwise | None, scale_inv | None): rowwise has
    out_dtype (default x's), or is uint8 FP8 bytes when fp8_dtype >= 0 (then
    `scale` is required, `amax`, if given, is max-accumulated, and the
    columnwise [K, M] copy can be asked for).
    """
    o = ActivationOptions(**options)
    code = _code(kind)
    x = contiguous(x)
    x_desc = hp_desc(x, "x")
    row, col, scale_inv, descs = _outputs(_out_shape(x, code), x, o)
    amax_desc = None if o.amax is None else desc(o.amax, FLOAT32)
    lib.activation_fwd(code, x_desc, *descs, amax_desc, o.limit, o.alpha, o.glu_linear_offset, stream_of(x))
    return row, col, scale_inv


# fwd_fp8_dtype of activation_bwd's call of the fused implementation: no
# forward copy (a private value: a caller's -1 or None is refused).
_NO_FORWARD_COPY = object()


@te_op("activation_bwd_fwd_columnwise", mutates_args=("amax",), shapes=_bwd_shapes)
def activation_bwd_fwd_columnwise(
    dy: Tensor,
    x: Tensor,
    kind: str,
    *,
    fwd_fp8_dtype: int,
    fwd_scale: Tensor,
    fwd_values_dtype: torch.dtype = torch.float32,
    dbias: bool = False,
    **options: Unpack[ActivationOptions],
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None, Tensor, Tensor]:
    """`activation_bwd` that also writes, in the same pass, the forward output
    y = f(x) quantized to FP8 columnwise ([H, M]) with `fwd_scale`: the bytes of
    activation_fwd(x, kind, fp8_dtype=fwd_fp8_dtype, scale=fwd_scale,
    rowwise=False, columnwise=True) with fwd_values_dtype float32, or of
    quantize_fp8 (columnwise) of activation_fwd(x, kind, out_dtype=
    fwd_values_dtype) with bfloat16/float16 (y rounded to it first).

    Returns (rowwise | None, columnwise | None, scale_inv | None, dbias | None,
    fwd_columnwise, fwd_scale_inv).
    """
    o = ActivationOptions(**options)
    plain = fwd_fp8_dtype is _NO_FORWARD_COPY
    if not plain and (fwd_fp8_dtype is None or fwd_fp8_dtype < 0 or fwd_scale is None):
        raise ValueError("the forward columnwise copy needs an FP8 'fwd_fp8_dtype' and 'fwd_scale'")
    code = _code(kind)
    dy, x = contiguous(dy), contiguous(x)
    x_desc, dy_desc = hp_desc(x, "x"), hp_desc(dy, "dy")
    if tuple(dy.shape) != _out_shape(x, code):
        raise ValueError(
            f"argument 'dy' must have the forward output's shape {_out_shape(x, code)}, got {tuple(dy.shape)}"
        )
    row, col, scale_inv, descs = _outputs(x.shape, x, o)
    bias = torch.empty((x.shape[-1],), dtype=torch.float32, device=x.device) if dbias else None
    stream = stream_of(x)
    ws = workspace(lib.activation_bwd_workspace_size(x_desc, dbias), x, stream) if (dbias and x.is_cuda) else None
    args = (
        code,
        dy_desc,
        x_desc,
        *descs,
        None if o.amax is None else desc(o.amax, FLOAT32),
        None if bias is None else desc(bias, FLOAT32),
        ws,
    )
    params = (o.limit, o.alpha, o.glu_linear_offset)
    if plain:
        lib.activation_bwd(*args, *params, stream)
        return row, col, scale_inv, bias
    out_shape = _out_shape(x, code)
    fwd_format = ActivationOptions(fp8_dtype=fwd_fp8_dtype, scale=fwd_scale, rowwise=False, columnwise=True)
    _, fwd_col, fwd_scale_inv, fwd_descs = _outputs(out_shape, x, fwd_format)
    values = TORCH_TO_CODE.get(fwd_values_dtype)
    if values is None:
        raise TypeError(f"argument 'fwd_values_dtype' must be float32, bfloat16 or float16, got {fwd_values_dtype}")
    lib.activation_bwd_with_fwd_columnwise(*args, *fwd_descs[1:], values, *params, stream)
    return row, col, scale_inv, bias, fwd_col, fwd_scale_inv


@te_op(
    "activation_bwd",
    mutates_args=("amax",),
    shapes=_bwd_shapes,
    signature=signature_without(
        activation_bwd_fwd_columnwise, "fwd_fp8_dtype", "fwd_scale", "fwd_values_dtype", returns=_Grads
    ),
)
def activation_bwd(dy, x, kind, **kwargs):
    """dL/dx = dy * f'(x) (gated kinds: both halves), see the module docstring;
    the keyword arguments are activation_bwd_fwd_columnwise's but the fwd_* ones.

    Returns (rowwise | None, columnwise | None, scale_inv | None, dbias | None);
    the outputs are described as in `activation_fwd`, dbias is FP32 [K].
    """
    return activation_bwd_fwd_columnwise.__wrapped__(
        dy, x, kind, fwd_fp8_dtype=_NO_FORWARD_COPY, fwd_scale=None, **kwargs
    )
