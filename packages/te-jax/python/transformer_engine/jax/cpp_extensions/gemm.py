"""GEMM on JAX arrays through te-core (XLA FFI): high precision or per-tensor FP8.

    out = op(A) @ op(B) (+ bias[n])       op(A) [M, K], op(B) [K, N]

A is stored [M, K] ([K, M] when transa), B is stored [K, N] ([N, K] when
transb); a Linear layer's forward Y = X W^T is gemm(X, W, transb=True). An FP8
operand (float8_e4m3fn / float8_e5m2 array) comes with its scale_inv and is
read as float32(q) * scale_inv. Products are summed in FP32 (on Hopper's FP8
tensor cores, with the accumulator of te/gemm.h: use_split_accumulator=True
promotes partial sums to FP32 at intervals). bias_grad=True also returns
sum_k op(A)[m, k] for every m, the bias gradient of a wgrad GEMM.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from . import _registry  # noqa: F401 - registers the FFI targets
from ._checks import FP8, HIGH_PRECISION, check_dtype, check_fp32_scalar, dtype_name, gemm_epilogue


def _matrix_dims(x, trans: bool, name: str) -> tuple[int, int]:
    """(rows, cols) of op(x): leading dims fold into rows, as te/gemm.h does."""
    if x.ndim < 2:
        raise ValueError(f"argument '{name}' must have at least 2 dimensions, got shape {tuple(x.shape)}")
    rows = int(np.prod(x.shape[:-1]))
    cols = x.shape[-1]
    return (cols, rows) if trans else (rows, cols)


def _operand(x, scale_inv, name: str):
    is_fp8 = jnp.dtype(x.dtype) in [jnp.dtype(d) for d in FP8]
    if is_fp8:
        if scale_inv is None:
            raise ValueError(f"argument '{name}_scale_inv' is required for an FP8 '{name}'")
        check_fp32_scalar(scale_inv, f"{name}_scale_inv")
        return scale_inv, True
    check_dtype(x, name, HIGH_PRECISION + FP8)
    if scale_inv is not None:
        raise ValueError(f"argument '{name}_scale_inv' is only for FP8 operands; '{name}' is {dtype_name(x.dtype)}")
    return jnp.zeros((0,), jnp.float32), False


def gemm(
    a,
    b,
    *,
    transa=False,
    transb=False,
    out_dtype=None,
    a_scale_inv=None,
    b_scale_inv=None,
    bias=None,
    bias_grad=False,
    use_split_accumulator=True,
):
    """op(A) @ op(B) (+ bias). Returns out [M, N] (A's leading dims kept when A is
    not transposed), or (out, bias_grad [M]) with bias_grad=True. out_dtype
    defaults to the operands' type (bfloat16 for FP8 operands)."""
    a_si, a_fp8 = _operand(a, a_scale_inv, "a")
    b_si, b_fp8 = _operand(b, b_scale_inv, "b")
    if a_fp8 != b_fp8 or (not a_fp8 and a.dtype != b.dtype):
        raise TypeError(
            f"arguments 'a' and 'b' must both be FP8 or have the same type, got {dtype_name(a.dtype)} and "
            f"{dtype_name(b.dtype)}"
        )
    m, k = _matrix_dims(a, transa, "a")
    k_b, n = _b_dims(b, transb)
    if k != k_b:
        raise ValueError(f"inner dimensions differ: op(a) is [{m}, {k}] but op(b) is [{k_b}, {n}]")
    out_dtype, bias = gemm_epilogue(out_dtype or (jnp.bfloat16 if a_fp8 else a.dtype), bias, n)
    out_shape = (*a.shape[:-1], n) if not transa and a.ndim > 2 else (m, n)
    results = (
        jax.ShapeDtypeStruct(out_shape, out_dtype),
        jax.ShapeDtypeStruct((m,) if bias_grad else (0,), out_dtype),
    )
    out, grad = jax.ffi.ffi_call("te_jax_gemm", results, vmap_method="sequential")(
        a,
        b,
        a_si,
        b_si,
        bias,
        transa=np.bool_(transa),
        transb=np.bool_(transb),
        use_split_accumulator=np.bool_(use_split_accumulator),
    )
    return (out, grad) if bias_grad else out


def _b_dims(b, transb: bool) -> tuple[int, int]:
    """(K, N) of op(B): B stored [K, N], or [N, K] when transb."""
    rows, cols = _matrix_dims(b, False, "b")
    return (cols, rows) if transb else (rows, cols)
