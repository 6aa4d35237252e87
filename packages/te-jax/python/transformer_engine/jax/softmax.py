"""softmax: the fused scaled (masked) softmax with a custom VJP over te-core's kernels
(cpp_extensions.softmax; formulas there).

    y = softmax(logits * scale_factor) over the last dim
        SoftmaxFusionType.SCALED:                      no mask
        SoftmaxFusionType.SCALED_MASKED:               mask [b or 1, 1, sq, sk], True / 1 = masked out
        SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED:  causal, logits [..., s, s]

The forward saves y; the backward is dx = scale * y * (dy - sum(dy * y)) (the mask
has no gradient). Masked elements are excluded exactly; a row with nothing visible
gives zeros.
"""

from __future__ import annotations

from enum import Enum
from functools import partial

import jax

from . import cpp_extensions as _ext  # noqa: F401 - registers the FFI targets
from .cpp_extensions import softmax as tex


class SoftmaxFusionType(Enum):
    """Which fused softmax: no mask, an explicit mask, or the causal (upper-triangular) one."""

    SCALED = "scaled"
    SCALED_MASKED = "scaled_masked"
    SCALED_UPPER_TRIANG_MASKED = "scaled_upper_triang_masked"


SoftmaxType = SoftmaxFusionType
"""The enum's earlier name in the reference."""


def softmax(logits, mask=None, scale_factor=1.0, softmax_fusion_type=SoftmaxFusionType.SCALED):
    """The fused softmax of logits (float32, bfloat16 or float16) in logits' type.

    mask: required (bool or uint8) for SCALED_MASKED, None for the others."""
    if not isinstance(softmax_fusion_type, SoftmaxFusionType):
        raise TypeError(
            f"argument 'softmax_fusion_type' must be a SoftmaxFusionType, got {type(softmax_fusion_type).__name__}"
        )
    kind = softmax_fusion_type.value
    if (mask is None) == (softmax_fusion_type is SoftmaxFusionType.SCALED_MASKED):
        raise ValueError(
            "argument 'mask' is required for SoftmaxFusionType.SCALED_MASKED and must be None for "
            f"{softmax_fusion_type.name}"
        )
    tex.check_scale_factor(scale_factor)  # checked here, before tracing
    return _softmax(logits, mask, float(scale_factor), kind)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _softmax(logits, mask, scale_factor, kind):
    return _softmax_fwd(logits, mask, scale_factor, kind)[0]


def _softmax_fwd(logits, mask, scale_factor, kind):
    if kind == "scaled_masked":
        y = tex.scaled_masked_softmax_fwd(logits, mask, scale_factor)
    elif kind == "scaled_upper_triang_masked":
        y = tex.scaled_upper_triang_masked_softmax_fwd(logits, scale_factor)
    else:
        y = tex.scaled_softmax_fwd(logits, scale_factor)
    return y, y


_BACKWARD = {
    "scaled": tex.scaled_softmax_bwd,
    "scaled_masked": tex.scaled_masked_softmax_bwd,
    "scaled_upper_triang_masked": tex.scaled_upper_triang_masked_softmax_bwd,
}


def _softmax_bwd(scale_factor, kind, y, dy):
    return _BACKWARD[kind](dy.astype(y.dtype), y, scale_factor), None


_softmax.defvjp(_softmax_fwd, _softmax_bwd)
