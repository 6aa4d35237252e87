"""GEMM with fused epilogues on NumPy arrays (the CPU backend of the core).

Row-major semantics (see core/include/te/gemm.h for the full contract):
    v = alpha * op(A) @ op(B) + beta * C + bias[n]     (FP32 accumulation)
    pre_gelu_out = v and D = gelu_tanh(v) when gelu, else D = v
    FP8 D: D = saturate(RNE(v' * d_scale)) and amax = max |v'| (v' = D's value)
    bias_grad[m] = sum_k op(A)[m, k]
op(A) = A.T when transa (A stored [K, M]); op(B) = B.T when transb (B stored
[N, K]). Leading dims of A are folded into rows. FP8 operands are ml_dtypes
float8_e4m3fn / float8_e5m2 arrays, dequantized as float32(q) * scale_inv.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._arrays import HIGH_PRECISION, desc, empty, fp32_scalar, matrix_shape
from ._checks import contiguous, flag, real
from ._native import lib
from .dtypes import FP8_DTYPES, te_dtype

_INPUT_TEXT = "float32, bfloat16, float16, float8_e4m3fn or float8_e5m2"


class GemmOutput(NamedTuple):
    """Result of `gemm`; fields that were not requested are None."""

    out: np.ndarray  # D: a.shape[:-1] + (N,) without transa, else (M, N)
    pre_gelu_out: np.ndarray | None  # (M, N), when gelu
    bias_grad: np.ndarray | None  # (M,), when bias_grad
    amax: np.ndarray | None  # FP32 scalar max |D| before scaling, when D is FP8


def _is_high_precision(dtype) -> bool:
    return np.dtype(dtype) in HIGH_PRECISION


def _array(x, name: str) -> np.ndarray:
    """x as a C-contiguous array of a type the GEMM takes, or TypeError naming it."""
    array = np.asarray(x)
    try:
        code = te_dtype(array.dtype)
    except TypeError:
        code = None
    if code is None or not (_is_high_precision(array.dtype) or code in FP8_DTYPES):
        raise TypeError(f"argument '{name}' must be {_INPUT_TEXT}, got {array.dtype}")
    return contiguous(array, name)


def _optional_desc(array: np.ndarray | None):
    return None if array is None else desc(array)


def _output_dtype(dtype, name: str) -> np.dtype:
    try:
        code = te_dtype(dtype)
    except TypeError:
        code = None
    if code is None or not (_is_high_precision(np.dtype(dtype)) or code in FP8_DTYPES):
        raise TypeError(f"argument '{name}' must be {_INPUT_TEXT}, got {dtype!r}")
    return np.dtype(dtype)


def gemm(
    a,
    b,
    *,
    transa: bool = False,
    transb: bool = False,
    a_scale_inv=None,
    b_scale_inv=None,
    c=None,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias=None,
    gelu: bool = False,
    bias_grad: bool = False,
    out_dtype=np.float32,
    d_scale=None,
    use_split_accumulator: bool = True,
    pre_gelu_dtype=None,
    bias_grad_dtype=None,
) -> GemmOutput:
    """D = alpha * op(a) @ op(b) + beta * c (+ bias, GELU), see the module docstring.

    a_scale_inv / b_scale_inv are required for FP8 operands; d_scale for an FP8
    out_dtype. pre_gelu_out and bias_grad default to out_dtype (float32 when
    out_dtype is FP8).
    """
    transa, transb = flag(transa, "transa"), flag(transb, "transb")
    gelu, bias_grad = flag(gelu, "gelu"), flag(bias_grad, "bias_grad")
    a = _array(a, "a")
    b = _array(b, "b")
    out_dtype = _output_dtype(out_dtype, "out_dtype")
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"arguments 'a' and 'b' must have at least 2 dims, got shapes {a.shape} and {b.shape}")
    a_rows, a_cols = matrix_shape(a.shape)
    b_rows, b_cols = matrix_shape(b.shape)
    m = a_cols if transa else a_rows
    n = b_rows if transb else b_cols
    out_shape = (m, n) if transa else tuple(a.shape[:-1]) + (n,)
    out = empty(out_shape, out_dtype)
    fp8_out = te_dtype(out_dtype) in FP8_DTYPES
    side_dtype = out_dtype if _is_high_precision(out_dtype) else np.dtype(np.float32)

    scales = {}
    for name, value in (("a_scale_inv", a_scale_inv), ("b_scale_inv", b_scale_inv), ("d_scale", d_scale)):
        scales[name] = None if value is None else fp32_scalar(value, name)
    c_array = None if c is None else _array(c, "c")
    bias_array = None if bias is None else _array(bias, "bias")
    if pre_gelu_dtype is None:
        pre_gelu_dtype = side_dtype
    if bias_grad_dtype is None:
        bias_grad_dtype = side_dtype
    pre_gelu = empty((m, n), _output_dtype(pre_gelu_dtype, "pre_gelu_dtype")) if gelu else None
    grad = empty((m,), _output_dtype(bias_grad_dtype, "bias_grad_dtype")) if bias_grad else None
    amax = np.zeros((), np.float32) if fp8_out else None

    lib.gemm(
        desc(a),
        desc(b),
        desc(out),
        a_scale_inv=_optional_desc(scales["a_scale_inv"]),
        b_scale_inv=_optional_desc(scales["b_scale_inv"]),
        c=_optional_desc(c_array),
        d_scale=_optional_desc(scales["d_scale"]),
        d_amax=_optional_desc(amax),
        bias=_optional_desc(bias_array),
        pre_gelu_out=_optional_desc(pre_gelu),
        bias_grad=_optional_desc(grad),
        alpha=real(alpha, "alpha"),
        beta=real(beta, "beta"),
        transa=transa,
        transb=transb,
        use_split_accumulator=flag(use_split_accumulator, "use_split_accumulator"),
    )
    return GemmOutput(out, pre_gelu, grad, amax)
