"""Activations of the MLP block on NumPy arrays (the CPU backend of the core).

Formulas: core/include/te/activation.h and docs/numerics.md. Plain kinds act
elementwise; gated kinds split the last dimension [..., 2H] into halves
a = x[..., :H] (activated) and b = x[..., H:] (linear) and return f(a) * lin(b).
Values are computed in FP32 and written once: rounded to the output type, or
quantized to FP8 exactly as `quantize_fp8` would quantize the FP32 values.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._arrays import as_high_precision, desc, empty, fp32_scalar, matrix_shape
from ._checks import flag, integer, real
from ._native import lib
from .cast import Fp8Tensor
from .dtypes import FP8_DTYPES, te_dtype

# The core's table of kinds (TE_ACTIVATION_KINDS in te/activation.h), in code
# order: [{"name", "code", "gated", "params"}]. The names are LayerNormMLP's
# `activation` values; "params" holds the defaults of the parameters a kind reads.
ACTIVATION_KINDS = tuple(lib.activation_kinds())
ACTIVATIONS = tuple(k["name"] for k in ACTIVATION_KINDS)
GATED_ACTIVATIONS = frozenset(k["name"] for k in ACTIVATION_KINDS if k["gated"])
# The defaults of te_activation_params (the reference's activation_params; only
# clamped_swiglu reads them).
DEFAULT_PARAMS = {name: value for k in ACTIVATION_KINDS for name, value in k["params"].items()}
_GATED_CODES = frozenset(k["code"] for k in ACTIVATION_KINDS if k["gated"])


def activation_code(kind: str | int) -> int:
    """The te_activation code of a name such as 'swiglu' (or of a code)."""
    if isinstance(kind, str):
        try:
            return ACTIVATIONS.index(kind.lower())
        except ValueError:
            raise ValueError(f"unknown activation {kind!r}; expected one of {', '.join(ACTIVATIONS)}") from None
    code = integer(kind, "kind")
    if not 0 <= code < len(ACTIVATIONS):
        names = ", ".join(f"{i} ({n})" for i, n in enumerate(ACTIVATIONS))
        raise ValueError(
            f"argument 'kind' must be an activation name or code 0 to {len(ACTIVATIONS) - 1}: {names}; got {code}"
        )
    return code


def is_gated(kind: str | int) -> bool:
    """Whether a kind (name or code) is gated; a code outside the table is a ValueError."""
    return activation_code(kind) in _GATED_CODES


class HighPrecisionOutput(NamedTuple):
    """A high-precision result asked for with `amax`: amax = max(amax, max|values|)
    over the values as stored (rounded to their dtype; NaN skipped)."""

    values: np.ndarray
    amax: np.ndarray  # FP32 scalar


class ForwardColumnwise(NamedTuple):
    """The forward output's FP8 columnwise copy that `activation_backward` can
    write in the same pass (`fwd_columnwise=`): the bytes of
    activation_forward(x, kind, out_dtype=..., scale=scale, rowwise=False,
    columnwise=True).columnwise."""

    columnwise: np.ndarray  # FP8 [H, M]: the forward output [M, H] transposed
    scale: np.ndarray  # FP32 scalar used for the cast
    scale_inv: np.ndarray  # FP32 scalar 1/scale


class ActivationGrad(NamedTuple):
    """Result of `activation_backward`."""

    grad_input: np.ndarray | HighPrecisionOutput | Fp8Tensor  # the input's shape
    dbias: np.ndarray | None  # [K], K the input's last dim; None unless requested
    fwd_columnwise: ForwardColumnwise | None = None  # only when requested


def _output_shape(x: np.ndarray, kind: int, halve: bool) -> tuple:
    if not halve or not is_gated(kind):
        return x.shape
    if x.ndim == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"{ACTIVATIONS[kind]} needs the input's last dimension to be even "
            f"(halves [activated | linear]), got shape {list(x.shape)}"
        )
    return x.shape[:-1] + (x.shape[-1] // 2,)


def _outputs(shape, out_dtype, scale, rowwise: bool, columnwise: bool, amax):
    """Allocates the outputs; returns (row, col, scale, scale_inv, amax) arrays or None."""
    code = te_dtype(out_dtype)
    fp8 = code in FP8_DTYPES
    rowwise, columnwise = flag(rowwise, "rowwise"), flag(columnwise, "columnwise")
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    if columnwise and not fp8:
        raise ValueError(f"a columnwise output needs an FP8 out_dtype, got {out_dtype!r}")
    if fp8 and scale is None:
        raise ValueError("an FP8 out_dtype needs 'scale'")
    if not fp8 and scale is not None:
        raise ValueError(f"'scale' is only used with an FP8 out_dtype, got {out_dtype!r}")
    rows, cols = matrix_shape(shape)
    row = empty(shape, code) if rowwise else None
    col = empty((cols, rows), code) if columnwise else None
    scale = fp32_scalar(scale, "scale") if fp8 else None
    scale_inv = np.zeros((), np.float32) if fp8 else None
    amax = fp32_scalar(0.0 if amax is None else amax, "amax").copy()
    return row, col, scale, scale_inv, amax


def _result(row, col, scale, scale_inv, amax, amax_given: bool):
    if scale is None:
        return HighPrecisionOutput(row, amax) if amax_given else row
    return Fp8Tensor(row, col, scale, scale_inv, amax)


def _opt(a):
    return None if a is None else desc(a)


def activation_forward(
    x,
    kind,
    *,
    out_dtype=None,
    scale=None,
    rowwise=True,
    columnwise=False,
    amax=None,
    limit=DEFAULT_PARAMS["limit"],
    alpha=DEFAULT_PARAMS["alpha"],
    glu_linear_offset=DEFAULT_PARAMS["glu_linear_offset"],
):
    """f(x) (plain kinds) or f(a) * lin(b) (gated kinds: last dim halved).

    out_dtype: None (the input's), float32/bfloat16/float16, or FP8 ('e4m3',
    'e5m2'); FP8 needs `scale` and returns an Fp8Tensor (rowwise and/or the
    [N, M] transposed columnwise copy, scale_inv, amax max-accumulated into
    `amax`). A high-precision out_dtype returns the array, or with `amax` given a
    HighPrecisionOutput whose amax is that of the stored values. limit/alpha/
    glu_linear_offset apply to clamped_swiglu only.
    """
    amax_given = amax is not None
    x = as_high_precision(x, "x")
    code = activation_code(kind)
    shape = _output_shape(x, code, halve=True)
    row, col, scale, scale_inv, amax = _outputs(
        shape, x.dtype if out_dtype is None else out_dtype, scale, rowwise, columnwise, amax
    )
    lib.activation_fwd(
        code,
        desc(x),
        _opt(row),
        _opt(col),
        _opt(scale),
        _opt(scale_inv),
        desc(amax),
        real(limit, "limit"),
        real(alpha, "alpha"),
        real(glu_linear_offset, "glu_linear_offset"),
    )
    return _result(row, col, scale, scale_inv, amax, amax_given)


def activation_backward(
    grad,
    x,
    kind,
    *,
    out_dtype=None,
    scale=None,
    rowwise=True,
    columnwise=False,
    amax=None,
    dbias=False,
    dbias_dtype=np.float32,
    fwd_columnwise=None,
    fwd_scale=None,
    fwd_values_dtype=np.float32,
    limit=DEFAULT_PARAMS["limit"],
    alpha=DEFAULT_PARAMS["alpha"],
    glu_linear_offset=DEFAULT_PARAMS["glu_linear_offset"],
) -> ActivationGrad:
    """grad_input = grad * f'(x) (gated: both halves), with an optional bias gradient.

    grad has the forward output's shape and x's dtype. out_dtype/scale/rowwise/
    columnwise/amax describe grad_input as in `activation_forward`. dbias=True
    also returns dbias[j] = sum over rows of grad_input[:, j] (FP32 sums in the
    order of te/activation.h, rounded to dbias_dtype). fwd_columnwise (an FP8
    dtype, 'e4m3' or 'e5m2') with fwd_scale also returns, from the same pass,
    the forward output f(x) quantized columnwise: q[j, r] = fp8(s(f(x)[r, j]) *
    fwd_scale), s(v) = v rounded to fwd_values_dtype (float32: v itself; bfloat16
    / float16: the bytes of quantizing a forward output of that type)
    (te_activation_bwd_with_fwd_columnwise).
    """
    amax_given = amax is not None
    x = as_high_precision(x, "x")
    grad = as_high_precision(grad, "grad")
    code = activation_code(kind)
    row, col, scale, scale_inv, amax = _outputs(
        x.shape, x.dtype if out_dtype is None else out_dtype, scale, rowwise, columnwise, amax
    )
    bias = empty((x.shape[-1] if x.ndim else 1,), dbias_dtype) if flag(dbias, "dbias") else None
    args = [code, desc(grad), desc(x), _opt(row), _opt(col), _opt(scale), _opt(scale_inv), desc(amax), _opt(bias), None]
    params = (real(limit, "limit"), real(alpha, "alpha"), real(glu_linear_offset, "glu_linear_offset"))
    fwd = None
    if fwd_columnwise is None:
        if fwd_scale is not None:
            raise ValueError("'fwd_scale' is only used with 'fwd_columnwise'")
        lib.activation_bwd(*args, *params)
    else:
        if te_dtype(fwd_columnwise) not in FP8_DTYPES:
            raise ValueError(f"'fwd_columnwise' must be an FP8 dtype ('e4m3' or 'e5m2'), got {fwd_columnwise!r}")
        if fwd_scale is None:
            raise ValueError("'fwd_columnwise' needs 'fwd_scale'")
        rows, cols = matrix_shape(_output_shape(x, code, halve=True))
        fwd = ForwardColumnwise(
            empty((cols, rows), te_dtype(fwd_columnwise)), fp32_scalar(fwd_scale, "fwd_scale"), np.zeros((), np.float32)
        )
        values = int(te_dtype(fwd_values_dtype))
        lib.activation_bwd_with_fwd_columnwise(*args, *(desc(a) for a in fwd), values, *params)
    return ActivationGrad(_result(row, col, scale, scale_inv, amax, amax_given), bias, fwd)
