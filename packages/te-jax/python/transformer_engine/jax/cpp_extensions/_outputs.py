"""Output arguments shared by the norm and activation wrappers: the output
type (high precision or FP8) and the FP8 scale / amax operands.

XLA FFI has no optional buffers: an unused one is a zero-element (0,)
placeholder, which the handlers read as NULL (common.h, is_placeholder).
The amax is max-accumulated in place by te-core, so its result aliases its
operand (input_output_aliases)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import jax
import jax.numpy as jnp

from ._checks import FP8, HIGH_PRECISION, check_fp32_scalar

F32_SCALAR = jax.ShapeDtypeStruct((1,), jnp.float32)
NO_F32 = jax.ShapeDtypeStruct((0,), jnp.float32)


def placeholder(dtype=jnp.float32):
    """The (0,) operand that stands for "none"."""
    return jnp.zeros((0,), dtype)


def is_fp8(dtype) -> bool:
    return jnp.dtype(dtype) in [jnp.dtype(d) for d in FP8]


def out_dtype_of(out_dtype, default) -> jnp.dtype:
    """out_dtype (None: `default`), checked to be high precision or FP8."""
    dtype = jnp.dtype(default if out_dtype is None else out_dtype)
    if dtype not in [jnp.dtype(d) for d in HIGH_PRECISION + FP8]:
        raise TypeError(
            f"argument 'out_dtype' must be float32, bfloat16, float16, float8_e4m3fn or float8_e5m2, got {dtype.name}"
        )
    return dtype


class Scaling(NamedTuple):
    """The scale and amax operands of an op and their results' shapes."""

    scale: jax.Array  # (1,) for an FP8 output, else the placeholder
    amax: jax.Array  # (1,) when asked (always for FP8), else the placeholder
    scale_inv_result: jax.ShapeDtypeStruct
    amax_result: jax.ShapeDtypeStruct
    amax_asked: bool


def scaling(out_dtype, scale, amax) -> Scaling:
    """Checks scale/amax against the output type. An FP8 output needs `scale`
    (float32 (1,)) and always returns an amax (from 0 when none is given); a
    high-precision one takes no scale and returns an amax only when given one
    (then of the values as stored)."""
    fp8 = is_fp8(out_dtype)
    if fp8:
        if scale is None:
            raise ValueError(f"argument 'scale' is required for an FP8 out_dtype ({jnp.dtype(out_dtype).name})")
        check_fp32_scalar(scale, "scale")
        if amax is None:
            amax = jnp.zeros((1,), jnp.float32)
    elif scale is not None:
        raise ValueError(f"argument 'scale' is only for an FP8 out_dtype, got {jnp.dtype(out_dtype).name}")
    asked = amax is not None
    if asked:
        check_fp32_scalar(amax, "amax")
    return Scaling(
        scale if fp8 else placeholder(),
        amax if asked else placeholder(),
        F32_SCALAR if fp8 else NO_F32,
        F32_SCALAR if asked else NO_F32,
        asked,
    )


def rows(shape) -> int:
    """The product of all dims but the last: the row count of the [N, H] view."""
    return int(np.prod(shape[:-1], dtype=np.int64))
