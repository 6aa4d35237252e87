"""The fused scaled softmax family on JAX arrays, through te-core's kernels (XLA FFI;
te/softmax.h). The reference's cpp_extensions names:

    y = softmax(x * scale) over the last dim, masked elements weighted 0
        scaled:                       x [..., sk]
        scaled_masked:                x [b, h, sq, sk], mask [b or 1, 1, sq, sk] (True / nonzero = masked)
        scaled_upper_triang_masked:   x [..., s, s], causal (j <= i)
    backward (every variant):         dx = scale * y * (dy - sum(dy * y))

FP32 arithmetic; x, y, dy, dx of one type (float32, bfloat16, float16). A row with
nothing visible gives zeros.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from . import _registry  # noqa: F401 - registers the FFI targets
from ._checks import HIGH_PRECISION, check_dtype

KINDS = {"scaled": 0, "scaled_masked": 1, "scaled_upper_triang_masked": 2}
_NO_MASK = np.zeros((0,), np.uint8)


def check_scale_factor(scale_factor) -> np.float32:
    if isinstance(scale_factor, bool) or not isinstance(scale_factor, (int, float, np.floating, np.integer)):
        raise TypeError(f"argument 'scale_factor' must be a Python number, got {type(scale_factor).__name__}")
    if not np.isfinite(scale_factor):
        raise ValueError(f"argument 'scale_factor' must be finite, got {scale_factor}")
    return np.float32(scale_factor)


def _fwd(kind: str, x, mask, scale_factor):
    call = jax.ffi.ffi_call("te_jax_softmax_fwd", jax.ShapeDtypeStruct(x.shape, x.dtype), vmap_method="sequential")
    return call(x, mask, kind=np.int32(KINDS[kind]), scale=check_scale_factor(scale_factor))


def _check_logits(x, min_ndim: int, layout: str) -> None:
    check_dtype(x, "logits", HIGH_PRECISION)
    if x.ndim < min_ndim:
        raise ValueError(f"argument 'logits' must be {layout}, got shape {tuple(x.shape)}")


def scaled_softmax_fwd(logits, scale_factor):
    """softmax(logits * scale_factor) over the last dim; logits [..., sk]."""
    _check_logits(logits, 1, "at least 1-d [..., sk]")
    return _fwd("scaled", logits, _NO_MASK, scale_factor)


def scaled_masked_softmax_fwd(logits, mask, scale_factor):
    """logits [b, h, sq, sk]; mask [b or 1, 1, sq, sk], bool or uint8 (True / nonzero = masked out)."""
    _check_logits(logits, 4, "[b, h, sq, sk]")
    if logits.ndim != 4:
        raise ValueError(f"argument 'logits' must be [b, h, sq, sk], got shape {tuple(logits.shape)}")
    if jnp.dtype(mask.dtype) not in (jnp.dtype(jnp.bool_), jnp.dtype(jnp.uint8)):
        raise TypeError(f"argument 'mask' must be bool or uint8 (nonzero = masked), got {jnp.dtype(mask.dtype).name}")
    b, _, sq, sk = logits.shape
    if mask.ndim != 4 or mask.shape[0] not in (1, b) or tuple(mask.shape[1:]) != (1, sq, sk):
        raise ValueError(
            f"argument 'mask' must be [{b} or 1, 1, {sq}, {sk}] for logits {tuple(logits.shape)}, "
            f"got {tuple(mask.shape)}"
        )
    return _fwd("scaled_masked", logits, mask.astype(jnp.uint8), scale_factor)


def scaled_upper_triang_masked_softmax_fwd(logits, scale_factor):
    """Causal softmax (j <= i) of logits [..., s, s] (the core's [attn_batches, s, s])."""
    _check_logits(logits, 2, "[..., s, s]")
    sq, sk = logits.shape[-2:]
    if sq != sk:
        raise ValueError(
            f"argument 'logits' must be square in its last two dims for the upper-triangular mask, got {sq} x {sk}"
        )
    y = _fwd("scaled_upper_triang_masked", logits.reshape(-1, sq, sk), _NO_MASK, scale_factor)
    return y.reshape(logits.shape)


def _bwd(kind: str, dz, softmax_out, scale_factor):
    check_dtype(dz, "dz", HIGH_PRECISION)
    if dz.shape != softmax_out.shape or dz.dtype != softmax_out.dtype:
        raise ValueError(
            f"arguments 'dz' and 'softmax_out' must have one shape and type, got {dz.dtype} {tuple(dz.shape)} "
            f"and {softmax_out.dtype} {tuple(softmax_out.shape)}"
        )
    shape = dz.shape
    if kind == "scaled_upper_triang_masked":  # the core's [attn_batches, s, s]
        dz, softmax_out = dz.reshape(-1, *shape[-2:]), softmax_out.reshape(-1, *shape[-2:])
    call = jax.ffi.ffi_call("te_jax_softmax_bwd", jax.ShapeDtypeStruct(dz.shape, dz.dtype), vmap_method="sequential")
    return call(dz, softmax_out, kind=np.int32(KINDS[kind]), scale=check_scale_factor(scale_factor)).reshape(shape)


def scaled_softmax_bwd(dz, softmax_out, scale_factor):
    """dx = scale * y * (dz - sum(dz * y)) over the last dim (y = softmax_out)."""
    return _bwd("scaled", dz, softmax_out, scale_factor)


def scaled_masked_softmax_bwd(dz, softmax_out, scale_factor):
    return _bwd("scaled_masked", dz, softmax_out, scale_factor)


def scaled_upper_triang_masked_softmax_bwd(dz, softmax_out, scale_factor):
    return _bwd("scaled_upper_triang_masked", dz, softmax_out, scale_factor)
