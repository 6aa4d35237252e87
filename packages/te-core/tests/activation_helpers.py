"""Shared pieces of the activation tests: shapes, inputs and the error bounds of
the FP32 evaluation against the float64 oracle.

The bound of one element is 2^-17 * (1 + min(|z|, 110)) * M + 2^-140, where z
is the argument of the sigmoid (the exp's input: its rounding error is
amplified |z| times) and M the sum of the magnitudes of the terms of the
result (what a rounding error of each term is relative to). 2^-17 is about 64
FP32 ulps: generous enough for a dozen roundings and the exp, tight enough to
catch a wrong constant or a wrong term. 2^-140 covers subnormal results.
"""

from __future__ import annotations

import numpy as np

from transformer_engine.core import reference_activation as ra
from transformer_engine.core.testing.shapes import GATED_SHAPES

PLAIN_KINDS = [k for k in ra.ACTIVATIONS if k not in ra.GATED]
GATED_KINDS = [k for k in ra.ACTIVATIONS if k in ra.GATED]
REL = 2.0**-17
ABS = 2.0**-140


def shapes_for(kind: str):
    from conftest import SHAPES

    return GATED_SHAPES if kind in ra.GATED else SHAPES


def sigmoid_argument(base: str, x, p) -> np.ndarray:
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if base == "gelu":
            z = 2.0 * ra.GELU_K * (x + ra.GELU_C * x**3)
        elif base in ("silu", "sigmoid"):
            z = x
        elif base == "qgelu":
            z = ra.QGELU_ALPHA * x
        elif base == "clamped":
            z = p["alpha"] * np.minimum(x, p["limit"])
        else:
            z = np.zeros_like(x)
    return np.nan_to_num(np.abs(z), nan=0.0, posinf=110.0)


def slope_magnitude(base: str, x, p) -> np.ndarray:
    """Sum of |terms| of f'(x): what its rounding errors scale with."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if base == "gelu":
            z = 2.0 * ra.GELU_K * (x + ra.GELU_C * x**3)
            s = ra.sigmoid(z)
            dz = 2.0 * ra.GELU_K * (1 + 3 * ra.GELU_C * x * x)
            m = s + np.abs(x * s * (1 - s) * dz)
        elif base in ("silu", "qgelu", "clamped"):
            alpha = {"silu": 1.0, "qgelu": ra.QGELU_ALPHA}.get(base, p["alpha"])
            c = np.minimum(x, p["limit"]) if base == "clamped" else x
            s = ra.sigmoid(alpha * c)
            m = s + np.abs(alpha * c * s * (1 - s))
        else:
            m = np.abs(ra.df(base, x, p))
    # At +-inf the terms are inf * 0; the slope itself (1 or 0) is exact there.
    return np.nan_to_num(np.where(np.isnan(m), np.abs(ra.df(base, x, p)), m), nan=0.0)


def _factor(base, x, p):
    return REL * (1.0 + np.minimum(sigmoid_argument(base, x, p), 110.0))


def _floor(base, x, p):
    """Absolute error floor of f(x) or f'(x): a subnormal sigmoid (spacing
    2^-149) multiplied by x and by the sigmoid's argument."""
    z = np.minimum(sigmoid_argument(base, x, p), 110.0)
    x = np.nan_to_num(np.abs(np.asarray(x, np.float64)), nan=0.0, posinf=0.0)
    return TINY * (1.0 + x) * (1.0 + z)


def _linear_magnitude(kind, b, p):
    b = np.asarray(b, np.float64)
    if kind != "clamped_swiglu":
        return np.abs(b)
    return np.abs(np.clip(b, -p["limit"], p["limit"])) + abs(p["glu_linear_offset"])


TINY = 2.0**-149  # absolute error floor of an FP32 factor (subnormal spacing)


def forward_bound(kind: str, x, p) -> np.ndarray:
    base = ra.BASE[kind]
    x = np.asarray(x).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if kind not in ra.GATED:
            return _factor(base, x, p) * np.abs(ra.f(base, x, p)) + _floor(base, x, p) + ABS
        a, b = ra.split(x)
        lin = _linear_magnitude(kind, b, p)
        return (_factor(base, a, p) * np.abs(ra.f(base, a, p)) + _floor(base, a, p)) * lin + ABS


def backward_bound(kind: str, grad, x, p) -> np.ndarray:
    base = ra.BASE[kind]
    x = np.asarray(x).astype(np.float64)
    g = np.abs(np.asarray(grad).astype(np.float64))
    with np.errstate(over="ignore", invalid="ignore"):
        if kind not in ra.GATED:
            floor = _floor(base, x, p)
            return _factor(base, x, p) * g * slope_magnitude(base, x, p) + floor * g + TINY + ABS
        a, b = ra.split(x)
        fa, floor = _factor(base, a, p), _floor(base, a, p)
        lin = _linear_magnitude(kind, b, p)
        da = (fa * g * slope_magnitude(base, a, p) + floor * g + TINY) * lin
        db = fa * g * np.abs(ra.f(base, a, p)) + floor * g + TINY
    return np.concatenate([da, db], axis=-1) + ABS


def _f32(v, flush=False):
    """v rounded to FP32; with flush, values below 2^-100 in magnitude become
    signed zeros (an FP32 evaluation whose sigmoid underflowed gives 0 there)."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.asarray(v, np.float64).astype(np.float32)
    if flush:
        r = np.where(np.abs(r) < np.float32(2.0**-100), np.copysign(np.float32(0), r), r)
    return r


def staged_forward(kind: str, x, p, flush=False) -> np.ndarray:
    """The oracle's factors rounded to FP32 and combined in FP32: which results
    are NaN or infinite in FP32 arithmetic (0 * inf after an underflow, ...)."""
    base = ra.BASE[kind]
    x = np.asarray(x).astype(np.float64)
    if kind not in ra.GATED:
        return _f32(ra.f(base, x, p), flush)
    a, b = ra.split(x)
    with np.errstate(over="ignore", invalid="ignore"):
        fa, lin = _f32(ra.f(base, a, p), flush), _f32(ra.linear(kind, b, p))
        return np.where(np.isinf(lin), ra.times_infinite_linear(1.0, fa, ra.f_sign(base, a, p), lin), fa * lin)


def staged_backward(kind: str, grad, x, p, flush=False) -> np.ndarray:
    base = ra.BASE[kind]
    x = np.asarray(x).astype(np.float64)
    g = _f32(np.asarray(grad).astype(np.float64))
    with np.errstate(over="ignore", invalid="ignore"):
        if kind not in ra.GATED:
            return g * _f32(ra.df(base, x, p), flush)
        a, b = ra.split(x)
        d, lin = _f32(ra.df(base, a, p), flush), _f32(ra.linear(kind, b, p))
        # An infinite linear half gives the limit, not 0 * inf (numerics.md).
        da = np.where(np.isinf(lin), ra.times_infinite_linear(g, d, ra.df_sign(base, a, p), lin), (g * d) * lin)
        fa = _f32(ra.f(base, a, p), flush)
        db = np.where(ra.linear_slope(kind, b, p) == 0, np.float32(0), g * fa)
    return np.concatenate([da, db], axis=-1)


def assert_close_to_oracle(out, ref64, bound, staged_pair):
    """NaN and infinities where the FP32-staged oracle has them; every other
    value within bound of the float64 oracle. staged_pair holds the staged
    oracle without and with tiny factors flushed; where the two disagree (a
    factor's FP32 evaluation may underflow first), either outcome is accepted."""
    out = np.asarray(out).astype(np.float64)
    kept, flushed = (np.asarray(v).astype(np.float64) for v in staged_pair)
    for name, pick in (("NaN", np.isnan), ("inf", np.isinf)):
        ok = (pick(out) == pick(kept)) | (pick(out) == pick(flushed))
        assert ok.all(), f"{name} positions differ at {np.argwhere(~ok)[:5].tolist()}"
    inf = np.isinf(out)
    same_inf = (out[inf] == kept[inf]) | (out[inf] == flushed[inf])
    assert same_inf.all(), "infinities of the wrong sign"
    finite = np.isfinite(out) & np.isfinite(kept) & np.isfinite(flushed)
    ref = np.asarray(ref64, np.float64)[finite]
    bound = np.nan_to_num(np.asarray(bound, np.float64), nan=np.inf)[finite]
    got = out[finite]
    bad = ~(np.abs(got - ref) <= bound)
    if bad.any():
        i = np.flatnonzero(bad)[0]
        raise AssertionError(
            f"{bad.sum()} of {bad.size} values outside the bound; first: got {got[i]!r}, "
            f"float64 {ref[i]!r}, bound {bound[i]!r}"
        )
    # The finite results that must be finite are.
    must_be_finite = np.isfinite(kept) & np.isfinite(flushed)
    assert np.isfinite(out[must_be_finite]).all()


def assert_same_float_bits(a, b):
    """Bitwise equality of two float arrays of the same dtype."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    view = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    np.testing.assert_array_equal(a.view(view), b.view(view))


def smooth_inputs(rng, shape, kind, p):
    """Random inputs away from the kinks (relu at 0, the clamps at +-limit)."""
    x = (rng.standard_normal(shape) * 2.5).astype(np.float32)
    base = ra.BASE[kind]
    if base in ("relu", "srelu"):
        x = np.where(np.abs(x) < 1e-2, np.float32(0.5), x)
    if kind == "clamped_swiglu":
        near = np.abs(np.abs(x) - p["limit"]) < 1e-2
        x = np.where(near, np.float32(0.25), x)
    return x.astype(np.float32)
