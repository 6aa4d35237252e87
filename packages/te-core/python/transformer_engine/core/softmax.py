"""Fused scaled / masked softmax on NumPy arrays (the core's CPU backend).

The reference's fused softmax kernels (core/include/te/softmax.h): a softmax over the
last dimension of x * scale in FP32, masked elements (mask != 0, the causal upper
triangle, or the bottom-right aligned causal one) weighted 0, rows with nothing visible
all zeros. Backward: dx = scale * y * (dy - sum(dy * y)).
"""

from __future__ import annotations

import numpy as np

from ._arrays import as_high_precision, desc
from ._checks import contiguous, real
from ._native import lib


def _forward(entry, x, scale, *extra):
    x = as_high_precision(x, "x")
    y = np.empty_like(x)
    entry(desc(x), *extra, real(scale, "scale"), desc(y))
    return y


def _backward(entry, output_grads, softmax_results, scale):
    dy = as_high_precision(output_grads, "output_grads")
    y = as_high_precision(softmax_results, "softmax_results")
    dx = np.empty_like(y)
    entry(desc(dy), desc(y), real(scale, "scale"), desc(dx))
    return dx


def scaled_softmax_forward(x, scale) -> np.ndarray:
    """softmax(x * scale) over the last dimension."""
    return _forward(lib.scaled_softmax_fwd, x, scale)


def scaled_softmax_backward(output_grads, softmax_results, scale) -> np.ndarray:
    """scale * y * (dy - sum(dy * y)) over the last dimension."""
    return _backward(lib.scaled_softmax_bwd, output_grads, softmax_results, scale)


def scaled_masked_softmax_forward(x, mask, scale) -> np.ndarray:
    """x [b, h, sq, sk]; mask [b or 1, 1, sq, sk] (bool or uint8; True / nonzero = masked)."""
    m = np.asarray(mask)
    if m.dtype != np.bool_ and m.dtype != np.uint8:
        raise TypeError(f"argument 'mask' must be bool or uint8, got {m.dtype}")
    m = contiguous(m.astype(np.uint8, copy=False), "mask")
    return _forward(lib.scaled_masked_softmax_fwd, x, scale, desc(m))


def scaled_masked_softmax_backward(output_grads, softmax_results, scale) -> np.ndarray:
    return _backward(lib.scaled_masked_softmax_bwd, output_grads, softmax_results, scale)


def scaled_upper_triang_masked_softmax_forward(x, scale) -> np.ndarray:
    """Causal (j <= i) softmax of x [attn_batches, s, s]."""
    return _forward(lib.scaled_upper_triang_masked_softmax_fwd, x, scale)


def scaled_upper_triang_masked_softmax_backward(output_grads, softmax_results, scale) -> np.ndarray:
    return _backward(lib.scaled_upper_triang_masked_softmax_bwd, output_grads, softmax_results, scale)


def scaled_aligned_causal_masked_softmax_forward(x, scale) -> np.ndarray:
    """Bottom-right aligned causal (j <= i + sk - sq) softmax of x [b, h, sq, sk]."""
    return _forward(lib.scaled_aligned_causal_masked_softmax_fwd, x, scale)


def scaled_aligned_causal_masked_softmax_backward(output_grads, softmax_results, scale) -> np.ndarray:
    return _backward(lib.scaled_aligned_causal_masked_softmax_bwd, output_grads, softmax_results, scale)
