"""softmax: the fused scaled (masked) softmax with a custom VJP over te-core's kernels
(cpp_extensions.softmax; formulas there).

    y = softmax(logits * scale_factor) over the last dim
        SoftmaxFusionType.SCALED:                      no mask
        SoftmaxFusionType.SCALED_MASKED:               mask [b or 1, 1, sq, sk], True / 1 = masked out
        SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED:  causal, logits [..., s, s]

The forward saves y; the backward is dx = scale * y * (dy - sum(dy * y)) (the mask
has no gradient). Under a mesh (transformer_engine.jax.sharding) the rows split over the
batch and head axes, with no collective. Masked elements are excluded exactly; a row with nothing visible
gives zeros.
"""

from __future__ import annotations

from enum import Enum
from functools import partial

import jax

from . import cpp_extensions as _ext  # noqa: F401 - registers the FFI targets
from ._partition import active_mesh
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
    mesh = active_mesh()
    if mesh is not None and logits.ndim >= 3:
        return _sharded_softmax(mesh, logits, mask, float(scale_factor), kind)
    return _softmax(logits, mask, float(scale_factor), kind)


def _sharded_softmax(mesh, logits, mask, scale_factor, kind):
    """Each row is independent: logits [b, h, sq, sk] split over the batch (dp / fsdp) and the
    heads (tp), [n, s, s] over the batch; the mask [b or 1, 1, sq, sk] follows the batch."""
    from jax.sharding import PartitionSpec as P

    from . import _partition as pt
    from . import sharding

    default = (sharding.BATCH_AXES, sharding.HEAD_AXES if logits.ndim == 4 else None)
    spec = pt.resolve_spec(None, logits.shape, default + (None,) * (logits.ndim - 2))
    specs = (P(*spec),)
    args = (logits,)
    if mask is not None:
        specs += (P(spec[0] if mask.shape[0] == logits.shape[0] else None),)
        args += (mask,)

    def local_fwd(x, m=None):
        return _softmax_fwd(x, m, scale_factor, kind)

    def local_bwd(y, dy):
        return (_softmax_bwd(scale_factor, kind, y, dy)[0],) + ((None,) if mask is not None else ())

    return pt.sharded_vjp(mesh, local_fwd, local_bwd, specs, P(*spec))(*args)


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
