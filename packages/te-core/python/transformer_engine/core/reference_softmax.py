"""Float64 oracle of the fused softmax family and the error bounds the core must meet.

Forward: the logits are v = x * scale rounded to FP32 (the spec computes them in FP32;
the product of two FP32 numbers is exact in float64, so rounding it once is that FP32
product), then the exact float64 softmax over the visible elements. Backward: the exact
dx = scale * y * (dy - sum(dy * y)) of the given (stored) y and dy.

Bounds (u = 2^-24, C = ceil(sk / 32) + 6 additions per row sum, m the row max, first
order doubled by SAFETY; docs/numerics.md, "Fused softmax"):
    forward:  |y_j - y*_j| <= y*_j u (|v_j - m| + W + C + 9) + 4 TINY,  W = sum_k y*_k |v_k - m|
              (fl(v - m) perturbs the exponent by |v - m| u; expf is within 2 ulp)
    backward: |dx_j - dx*_j| <= |scale| |y_j| u ((C + 2) sum_k |dy_k y_k| + 3 |dy_j - D|)
              + TINY terms,  D = sum_k dy_k y_k
plus the final rounding to the output type.
"""

from __future__ import annotations

import math

import numpy as np

from .norm_reference import OUTPUT_ROUNDING, SAFETY, TINY32, U32

KINDS = ("plain", "masked", "causal", "bottom_right")


def visible(shape, kind: str, mask=None) -> np.ndarray:
    """Boolean array of x's shape: True where the element takes part in its row."""
    if kind == "plain":
        return np.ones(shape, bool)
    if kind == "masked":
        return np.broadcast_to(np.asarray(mask) == 0, shape)
    sq, sk = shape[-2], shape[-1]
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    limit = i + (sk - sq if kind == "bottom_right" else 0)
    return np.broadcast_to(j <= limit, shape)


def _out_bound(b32, exact, dtype):
    unit, tiny = OUTPUT_ROUNDING[np.dtype(dtype)]
    return b32 * (1 + unit) + unit * np.abs(exact) + tiny


def _c(sk: int) -> int:
    return math.ceil(sk / 32) + 6


def forward(x, scale, kind="plain", mask=None):
    """(exact y float64, bound) for the softmax of x * scale."""
    x = np.asarray(x)
    vis = visible(x.shape, kind, mask)
    v = (x.astype(np.float64) * np.float64(np.float32(scale))).astype(np.float32).astype(np.float64)
    v = np.where(vis, v, -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        m = v.max(axis=-1, keepdims=True)  # NaN propagates, as in the core
        dead = m == -np.inf  # nothing visible, or every visible logit -inf
        shifted = np.where(vis & ~dead, v - np.where(dead, 0.0, m), -np.inf)
        e = np.exp(shifted)
        y = e / e.sum(axis=-1, keepdims=True)
        y = np.where(dead, 0.0, y)
        dist = np.where(vis & ~dead & np.isfinite(v), np.abs(v - m), 0.0)  # exp(-inf) = 0 exactly
        w = np.nansum(np.where(vis, y * dist, 0.0), axis=-1, keepdims=True)
        b32 = SAFETY * (y * U32 * (dist + w + _c(x.shape[-1]) + 9) + 4 * TINY32)
    b32 = np.where(dead, 0.0, b32)
    return y, _out_bound(b32, y, x.dtype)


def backward(dy, y, scale):
    """(exact dx float64, bound) for the output gradient dy and forward output y."""
    dtype = np.asarray(y).dtype
    dy = np.asarray(dy).astype(np.float64)
    y = np.asarray(y).astype(np.float64)
    s = float(np.float32(scale))
    sk = y.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):
        dot = (dy * y).sum(axis=-1, keepdims=True)
        dx = s * y * (dy - dot)
        mag = np.abs(dy * y).sum(axis=-1, keepdims=True)
        b32 = SAFETY * (
            abs(s) * np.abs(y) * (U32 * ((_c(sk) + 2) * mag + 3 * np.abs(dy - dot)) + (sk + 2) * TINY32)
            + U32 * np.abs(dx)
            + 2 * TINY32
        )
    return dx, _out_bound(b32, dx, dtype)
