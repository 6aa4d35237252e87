"""Per-tensor FP8 ops on JAX arrays, through te-core's kernels (XLA FFI).

Each function is traceable (jit, grad of surrounding code, vmap runs the
op once per batch element). What te-core updates in place comes back as a
new array: the amax of a delayed-scaling quantize, the history and scale of
the recipe update. Formulas (te/cast.h, te/recipe.h; docs/numerics.md):

    q = saturate(round_to_nearest_even(float32(x) * scale))   (+-448 E4M3, +-57344 E5M2, NaN -> NaN)
    dequantize: float32(q) * scale_inv, rounded to the output type
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from transformer_engine.core import DType

from . import _registry  # noqa: F401 - registers the FFI targets
from ._checks import HIGH_PRECISION, check_dtype, check_fp8_dtype, check_fp32_scalar, matrix_t_shape

_F32_SCALAR = jax.ShapeDtypeStruct((1,), jnp.float32)
_ALGOS = {"max": 0, "most_recent": 1}


def _fp8_results(x, fp8_dtype, rowwise: bool, columnwise: bool):
    """Result shapes of a quantize; a (0,) placeholder stands for a copy not asked for."""
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    none = jax.ShapeDtypeStruct((0,), fp8_dtype)
    row = jax.ShapeDtypeStruct(x.shape, fp8_dtype) if rowwise else none
    col = jax.ShapeDtypeStruct(matrix_t_shape(x.shape), fp8_dtype) if columnwise else none
    return row, col


def quantize_fp8(x, scale, amax, fp8_dtype=jnp.float8_e4m3fn, *, rowwise=True, columnwise=False):
    """Delayed-scaling quantize with a given scale (float32, shape (1,)).

    Returns (rowwise | None, columnwise [K, M] | None, scale_inv (1,), new_amax (1,)) where
    new_amax = max(amax, max|x|) (NaN ignored) and scale_inv = 1 / scale.
    """
    check_dtype(x, "x", HIGH_PRECISION)
    check_fp32_scalar(scale, "scale")
    check_fp32_scalar(amax, "amax")
    fp8_dtype = check_fp8_dtype(fp8_dtype)
    row, col = _fp8_results(x, fp8_dtype, rowwise, columnwise)
    call = jax.ffi.ffi_call(
        "te_jax_quantize_fp8",
        (row, col, _F32_SCALAR, _F32_SCALAR),
        input_output_aliases={2: 3},
        vmap_method="sequential",
    )
    q_row, q_col, scale_inv, new_amax = call(x, scale, amax)
    return (q_row if rowwise else None), (q_col if columnwise else None), scale_inv, new_amax


def quantize_fp8_current_scaling(
    x, fp8_dtype=jnp.float8_e4m3fn, *, rowwise=True, columnwise=False, force_pow_2_scales=False, amax_epsilon=0.0
):
    """amax(x) -> scale -> quantize, in one pass over x.

    scale = fp8_max / max(amax, amax_epsilon) (1 for a zero or non-finite amax; the
    largest finite value of x's type where the division overflows; a power of 2
    with force_pow_2_scales). Returns (rowwise | None, columnwise | None, scale,
    scale_inv, amax), the last three float32 (1,).
    """
    check_dtype(x, "x", HIGH_PRECISION)
    fp8_dtype = check_fp8_dtype(fp8_dtype)
    if not np.isfinite(amax_epsilon) or amax_epsilon < 0:
        raise ValueError(f"argument 'amax_epsilon' must be finite and >= 0, got {amax_epsilon}")
    row, col = _fp8_results(x, fp8_dtype, rowwise, columnwise)
    call = jax.ffi.ffi_call(
        "te_jax_quantize_fp8_current_scaling",
        (row, col, _F32_SCALAR, _F32_SCALAR, _F32_SCALAR),
        vmap_method="sequential",
    )
    q_row, q_col, scale, scale_inv, amax = call(
        x, force_pow_2_scales=np.bool_(force_pow_2_scales), amax_epsilon=np.float32(amax_epsilon)
    )
    return (q_row if rowwise else None), (q_col if columnwise else None), scale, scale_inv, amax


def dequantize_fp8(data, scale_inv, out_dtype=jnp.float32):
    """float32(data) * scale_inv rounded to out_dtype (float32, bfloat16 or float16)."""
    check_fp8_dtype(data.dtype)
    check_fp32_scalar(scale_inv, "scale_inv")
    if jnp.dtype(out_dtype) not in [jnp.dtype(d) for d in HIGH_PRECISION]:
        raise TypeError(f"argument 'out_dtype' must be float32, bfloat16 or float16, got {jnp.dtype(out_dtype).name}")
    out = jax.ShapeDtypeStruct(data.shape, out_dtype)
    return jax.ffi.ffi_call("te_jax_dequantize_fp8", out, vmap_method="sequential")(data, scale_inv)


def compute_amax(x):
    """max|x| over the non-NaN elements (0 when there are none), float32 (1,)."""
    check_dtype(x, "x", HIGH_PRECISION)
    return jax.ffi.ffi_call("te_jax_compute_amax", _F32_SCALAR, vmap_method="sequential")(x)


def delayed_scaling_update(amax_history, scale, fp8_dtype=jnp.float8_e4m3fn, *, margin=0.0, amax_compute_algo="max"):
    """The delayed-scaling recipe step for one group (te/recipe.h; reference §3.3).

    amax_history [L, n] (row 0: the amaxes recorded since the last update),
    scale [n]. Returns (new_history, new_scale, new_scale_inv): the history
    rolled (no roll for a column whose newest amax is 0), and
    scale = (fp8_max * 2^-margin) / amax, amax the window max ("max") or the
    newest ("most_recent"); the old scale where amax is 0 or not finite.
    """
    fp8_dtype = check_fp8_dtype(fp8_dtype)
    if amax_history.ndim != 2 or jnp.dtype(amax_history.dtype) != jnp.float32:
        raise ValueError(
            f"argument 'amax_history' must be float32 [L, n], got {amax_history.dtype} {amax_history.shape}"
        )
    n = amax_history.shape[1]
    if jnp.dtype(scale.dtype) != jnp.float32 or tuple(scale.shape) != (n,):
        raise ValueError(f"argument 'scale' must be float32 of shape ({n},), got {scale.dtype} {tuple(scale.shape)}")
    if amax_compute_algo not in _ALGOS:
        raise ValueError(f"argument 'amax_compute_algo' must be 'max' or 'most_recent', got {amax_compute_algo!r}")
    if not np.isfinite(margin) or margin < 0:
        raise ValueError(f"argument 'margin' must be finite and >= 0, got {margin}")
    code = DType.kFloat8E4M3 if fp8_dtype == jnp.float8_e4m3fn else DType.kFloat8E5M2
    results = (
        jax.ShapeDtypeStruct(amax_history.shape, jnp.float32),
        jax.ShapeDtypeStruct(scale.shape, jnp.float32),
        jax.ShapeDtypeStruct(scale.shape, jnp.float32),
    )
    call = jax.ffi.ffi_call(
        "te_jax_delayed_scaling_update", results, input_output_aliases={0: 0, 1: 1}, vmap_method="sequential"
    )
    return call(
        amax_history,
        scale,
        algo=np.int32(_ALGOS[amax_compute_algo]),
        fp8_dtype=np.int32(int(code)),
        margin=np.float32(margin),
    )
