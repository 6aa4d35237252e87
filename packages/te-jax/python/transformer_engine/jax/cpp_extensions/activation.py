"""Activations of the MLP block on JAX arrays through te-core's kernels (XLA FFI).

Formulas: te/activation.h. Plain kinds act elementwise, out = f(x). Gated kinds
split the last dim [..., 2H] into a = x[..., :H] (activated) and b = x[..., H:]
(linear): out = f(a) * lin(b), [..., H].

    gelu / geglu    x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)     lin(b) = b
    relu / reglu    max(x, 0)
    silu / swiglu   x * sigmoid(x)
    qgelu / qgeglu  x * sigmoid(1.702 x)
    srelu / sreglu  max(x, 0)^2
    glu             sigmoid(x)
    clamped_swiglu  c * sigmoid(alpha c), c = min(x, limit);  lin(b) = clamp(b, +-limit) + glu_linear_offset

    backward: grad_input = dy * f'(x); gated: [(dy f'(a)) lin(b), (dy f(a)) lin'(b)]

Values are computed in FP32 with the same bits on te-core's CPU and CUDA
backends and written once: rounded to the output type, or quantized to FP8
with the given scale (q = fp8(v * scale), amax max-accumulated over the
unrounded v, scale_inv = 1 / scale), rowwise and/or as the [N, M] transposed
copy Hopper FP8 GEMMs read. A high-precision output with `amax` given also
returns max(amax, max|out|) over the stored values (current scaling's amax).
The backward can add dbias[j] = sum over rows of grad_input[:, j] (FP32 sums in
te/activation.h's fixed order).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import jax
import jax.numpy as jnp
from transformer_engine.core.activation import ACTIVATION_KINDS, ACTIVATIONS, DEFAULT_PARAMS, GATED_ACTIVATIONS

from . import _registry  # noqa: F401 - registers the FFI targets
from ._checks import HIGH_PRECISION, check_dtype, dtype_name
from ._outputs import is_fp8, out_dtype_of, rows, scaling


class ActivationOutput(NamedTuple):
    """An activation's output when more than the plain array is asked for."""

    data: jax.Array | None  # rowwise values (None when only columnwise was asked)
    columnwise: jax.Array | None  # FP8 [N, M]: data viewed as [M, N] and transposed
    scale_inv: jax.Array | None  # FP8 only: float32 (1,)
    amax: jax.Array | None  # FP8, or high precision with amax given: float32 (1,)
    dbias: jax.Array | None = None  # backward with dbias=True: [K]


def _kind_code(kind) -> int:
    if not isinstance(kind, str) or kind.lower() not in ACTIVATIONS:
        raise ValueError(f"argument 'kind' must be one of {', '.join(ACTIVATIONS)}; got {kind!r}")
    return ACTIVATIONS.index(kind.lower())


def _attributes(kind: str, limit, alpha, glu_linear_offset) -> dict:
    """The FFI attributes; clamped_swiglu's parameters are checked (the other kinds ignore them)."""
    code = _kind_code(kind)
    if ACTIVATION_KINDS[code]["params"]:
        if not limit > 0:
            raise ValueError(f"argument 'limit' must be > 0 (inf: no clamping), got {limit}")
        for name, value in (("alpha", alpha), ("glu_linear_offset", glu_linear_offset)):
            if not np.isfinite(value):
                raise ValueError(f"argument '{name}' must be finite, got {value}")
    return {
        "kind": np.int32(code),
        "limit": np.float32(limit),
        "alpha": np.float32(alpha),
        "glu_linear_offset": np.float32(glu_linear_offset),
    }


def _output_shape(x, kind: str) -> tuple:
    """The forward output's shape: x's, with the last dim halved for gated kinds."""
    check_dtype(x, "x", HIGH_PRECISION)
    if x.ndim < 1:
        raise ValueError("argument 'x' must have at least 1 dimension, got a scalar")
    if kind.lower() not in GATED_ACTIVATIONS:
        return tuple(x.shape)
    if x.shape[-1] % 2:
        raise ValueError(
            f"argument 'x' of the gated kind {kind!r} must have an even last dimension "
            f"([activated | linear] halves), got shape {tuple(x.shape)}"
        )
    return (*x.shape[:-1], x.shape[-1] // 2)


def _outputs(shape, out_dtype, scale, amax, rowwise: bool, columnwise: bool):
    """The Scaling operands and the (rowwise, columnwise) result shapes of an
    output of `shape` (te-core views it as [M, N]; columnwise is [N, M])."""
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    if columnwise and not is_fp8(out_dtype):
        raise ValueError(f"a columnwise output needs an FP8 out_dtype, got {dtype_name(out_dtype)}")
    s = scaling(out_dtype, scale, amax)
    m, n = rows(shape), shape[-1]
    none = jax.ShapeDtypeStruct((0,), out_dtype)
    row = jax.ShapeDtypeStruct((m, n), out_dtype) if rowwise else none
    col = jax.ShapeDtypeStruct((n, m), out_dtype) if columnwise else none
    return s, row, col


def _result(out, shape, out_dtype, s, rowwise, columnwise, dbias=None):
    """The plain array, or an ActivationOutput when FP8 / amax / columnwise / dbias were asked."""
    row, col, scale_inv, amax = out[:4]
    row = row.reshape(shape) if rowwise else None
    fp8 = is_fp8(out_dtype)
    if not (fp8 or s.amax_asked or dbias is not None):
        return row
    return ActivationOutput(
        row, col if columnwise else None, scale_inv if fp8 else None, amax if s.amax_asked else None, dbias
    )


def activation_fwd(
    x,
    kind,
    *,
    out_dtype=None,
    scale=None,
    amax=None,
    rowwise=True,
    columnwise=False,
    limit=DEFAULT_PARAMS["limit"],
    alpha=DEFAULT_PARAMS["alpha"],
    glu_linear_offset=DEFAULT_PARAMS["glu_linear_offset"],
):
    """f(x) (plain kinds) or f(a) * lin(b) (gated kinds: the last dim halved).

    kind: a name of te-core's ACTIVATIONS ("gelu", "swiglu", ...). x: float32,
    bfloat16 or float16. out_dtype: None (x's type), high precision, or
    float8_e4m3fn/float8_e5m2 with `scale` (float32 (1,)). Returns the array for
    a high-precision output without `amax`, else an ActivationOutput.
    limit/alpha/glu_linear_offset: clamped_swiglu only.
    """
    attrs = _attributes(kind, limit, alpha, glu_linear_offset)
    shape = _output_shape(x, kind)
    out_dtype = out_dtype_of(out_dtype, x.dtype)
    s, row, col = _outputs(shape, out_dtype, scale, amax, rowwise, columnwise)
    call = jax.ffi.ffi_call(
        "te_jax_activation_fwd",
        (row, col, s.scale_inv_result, s.amax_result),
        input_output_aliases={2: 3} if s.amax_asked else None,
        vmap_method="sequential",
    )
    out = call(x.reshape(rows(x.shape), x.shape[-1]), s.scale, s.amax, **attrs)
    return _result(out, shape, out_dtype, s, rowwise, columnwise)


def activation_bwd(
    dy,
    x,
    kind,
    *,
    out_dtype=None,
    scale=None,
    amax=None,
    rowwise=True,
    columnwise=False,
    dbias=False,
    dbias_dtype=jnp.float32,
    limit=DEFAULT_PARAMS["limit"],
    alpha=DEFAULT_PARAMS["alpha"],
    glu_linear_offset=DEFAULT_PARAMS["glu_linear_offset"],
):
    """grad_input = dy * f'(x) (gated kinds: both halves), x's shape.

    dy: the forward output's shape and x's type. out_dtype/scale/amax/rowwise/
    columnwise describe grad_input as in activation_fwd (columnwise: [K, M], K
    x's last dim). dbias=True adds dbias [K] of dbias_dtype. Returns the array
    for a high-precision grad_input without amax or dbias, else an
    ActivationOutput.
    """
    attrs = _attributes(kind, limit, alpha, glu_linear_offset)
    out_shape = _output_shape(x, kind)
    if jnp.dtype(dy.dtype) != jnp.dtype(x.dtype) or tuple(dy.shape) != out_shape:
        raise ValueError(
            f"argument 'dy' must have the forward output's shape {out_shape} and the type of 'x' "
            f"({dtype_name(x.dtype)}), got {tuple(dy.shape)} {dtype_name(dy.dtype)}"
        )
    out_dtype = out_dtype_of(out_dtype, x.dtype)
    s, row, col = _outputs(tuple(x.shape), out_dtype, scale, amax, rowwise, columnwise)
    k = x.shape[-1]
    if dbias:
        dbias_dtype = jnp.dtype(dbias_dtype)
        if dbias_dtype not in [jnp.dtype(d) for d in HIGH_PRECISION]:
            raise TypeError(f"argument 'dbias_dtype' must be float32, bfloat16 or float16, got {dbias_dtype.name}")
    bias = jax.ShapeDtypeStruct((k,) if dbias else (0,), dbias_dtype)
    call = jax.ffi.ffi_call(
        "te_jax_activation_bwd",
        (row, col, s.scale_inv_result, s.amax_result, bias),
        input_output_aliases={3: 3} if s.amax_asked else None,
        vmap_method="sequential",
    )
    m = rows(x.shape)
    out = call(dy.reshape(m, out_shape[-1]), x.reshape(m, k), s.scale, s.amax, **attrs)
    return _result(out, tuple(x.shape), out_dtype, s, rowwise, columnwise, out[4] if dbias else None)
