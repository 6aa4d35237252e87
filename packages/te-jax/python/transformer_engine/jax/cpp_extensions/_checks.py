"""Argument checks shared by the FFI wrappers: a clear TypeError/ValueError
naming the argument, raised at trace time, before XLA sees the call."""

from __future__ import annotations

import jax.numpy as jnp

HIGH_PRECISION = (jnp.float32, jnp.bfloat16, jnp.float16)
FP8 = (jnp.float8_e4m3fn, jnp.float8_e5m2)


def dtype_name(dtype) -> str:
    return jnp.dtype(dtype).name


def check_dtype(x, name: str, allowed) -> None:
    if jnp.dtype(x.dtype) not in [jnp.dtype(d) for d in allowed]:
        names = ", ".join(dtype_name(d) for d in allowed)
        raise TypeError(f"argument '{name}' must be one of {names}, got {dtype_name(x.dtype)}")


def check_fp8_dtype(fp8_dtype) -> jnp.dtype:
    dtype = jnp.dtype(fp8_dtype)
    if dtype not in [jnp.dtype(d) for d in FP8]:
        raise TypeError(f"argument 'fp8_dtype' must be float8_e4m3fn or float8_e5m2, got {dtype.name}")
    return dtype


def check_fp32_scalar(x, name: str) -> None:
    """One FP32 element stored as shape (1,) (the reference's scale and amax layout)."""
    if jnp.dtype(x.dtype) != jnp.float32 or tuple(x.shape) != (1,):
        raise ValueError(
            f"argument '{name}' must be a float32 array of shape (1,), got {dtype_name(x.dtype)} {tuple(x.shape)}"
        )


def matrix_t_shape(shape) -> tuple:
    """[K, M]: the columnwise (transposed) copy of a tensor viewed as [M, K]."""
    if len(shape) == 0:
        return (1, 1)
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    return (shape[-1], rows)


def gemm_epilogue(out_dtype, bias, n: int):
    """(out_dtype, bias) of a GEMM with N = n outputs per row: out_dtype one of the
    high-precision types, bias [n] or the (0,) placeholder of "no bias"."""
    out_dtype = jnp.dtype(out_dtype)
    if out_dtype not in [jnp.dtype(d) for d in HIGH_PRECISION]:
        raise TypeError(f"argument 'out_dtype' must be float32, bfloat16 or float16, got {out_dtype.name}")
    if bias is None:
        return out_dtype, jnp.zeros((0,), out_dtype)
    if bias.shape != (n,):
        raise ValueError(f"argument 'bias' must have shape ({n},), got {tuple(bias.shape)}")
    return out_dtype, bias
