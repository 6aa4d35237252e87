"""Float64 NumPy oracle of the activation family: forward values and analytic derivatives.

Written from the formulas of core/include/te/activation.h (docs/numerics.md),
not from the C++ sources. gelu is the tanh approximation
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), with 0.5 (1 + tanh u) evaluated
as sigmoid(2u) so that its negative tail keeps full float64 precision (tests
check the identity against np.tanh). The documented special values
are applied explicitly: f(-inf) = -0 for the sigmoid-based kinds, the slopes at
+-inf are 1 and 0, NaN propagates through every term that reads it, and the
clamped_swiglu slopes are 0 strictly outside +-limit.

Gated kinds: a = x[..., :H] (activated), b = x[..., H:] (linear),
forward f(a) * lin(b); backward [(g f'(a)) lin(b), (g f(a)) lin'(b)].
"""

from __future__ import annotations

import numpy as np

from . import activation as _table

# The kinds, their gated flags and the default parameters are the core's table
# (te/activation.h, an interface fact, not a formula); the formulas below are
# the oracle's own, keyed by name, so a kind added to the table without its
# oracle formula fails the tests (BASE has no entry for it).
ACTIVATIONS = _table.ACTIVATIONS
GATED = _table.GATED_ACTIVATIONS
DEFAULT_PARAMS = _table.DEFAULT_PARAMS

# The activated function of each kind.
BASE = {
    "gelu": "gelu",
    "geglu": "gelu",
    "relu": "relu",
    "reglu": "relu",
    "silu": "silu",
    "swiglu": "silu",
    "qgelu": "qgelu",
    "qgeglu": "qgelu",
    "srelu": "srelu",
    "sreglu": "srelu",
    "glu": "sigmoid",
    "clamped_swiglu": "clamped",
}
GELU_K = np.sqrt(2.0 / np.pi)
GELU_C = 0.044715
QGELU_ALPHA = 1.702
CHUNK_ROWS = 64  # the bias-gradient reduction order (te/activation.h)
GROUP_ROWS = 4


def sigmoid(z):
    """1 / (1 + exp(-z)) without overflow: exp of a non-positive number only."""
    z = np.asarray(z, np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _swish(x, alpha):
    with np.errstate(invalid="ignore", over="ignore"):
        y = x * sigmoid(alpha * x)
    return np.where(np.isneginf(x), -0.0, y)


def _dswish(x, alpha):
    s, sbar = sigmoid(alpha * x), sigmoid(-alpha * x)  # sbar = 1 - s without cancellation
    with np.errstate(invalid="ignore", over="ignore"):
        d = s + alpha * x * s * sbar
    return np.where(np.isinf(x), np.where(x > 0, 1.0, 0.0), d)


def _gelu_half(x):
    """0.5 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), as sigmoid(2u): the
    same number, without the cancellation of 1 + tanh(u) in float64 for u << 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        return sigmoid(2.0 * GELU_K * (x + GELU_C * x**3))


def _gelu(x):
    with np.errstate(invalid="ignore", over="ignore"):
        y = x * _gelu_half(x)
    return np.where(np.isneginf(x), -0.0, y)


def _dgelu(x):
    # d/dx 0.5 x (1 + tanh u) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u', with
    # 0.5 (1 + tanh u) = h and 1 - tanh^2 u = 4 h (1 - h).
    h, hbar = _gelu_half(x), _gelu_half(-x)  # hbar = 1 - h (the argument is odd in x)
    with np.errstate(invalid="ignore", over="ignore"):
        d = h + 2.0 * x * h * hbar * GELU_K * (1.0 + 3.0 * GELU_C * x * x)
    return np.where(np.isinf(x), np.where(x > 0, 1.0, 0.0), d)


def _clamp_above(x, limit):
    return np.where(x > limit, limit, x)  # NaN stays NaN


def f(base: str, x, p) -> np.ndarray:
    """The activated function in float64."""
    x = np.asarray(x, np.float64)
    nan = np.isnan(x)
    if base == "gelu":
        return _gelu(x)
    if base == "relu":
        return np.where(nan | (x > 0), x, 0.0)
    if base == "silu":
        return _swish(x, 1.0)
    if base == "qgelu":
        return _swish(x, QGELU_ALPHA)
    if base == "srelu":
        with np.errstate(over="ignore"):
            return np.where(nan | (x > 0), x * x, 0.0)
    if base == "sigmoid":
        return sigmoid(x)
    if base == "clamped":
        return _swish(_clamp_above(x, p["limit"]), p["alpha"])
    raise ValueError(base)


def df(base: str, x, p) -> np.ndarray:
    """Its derivative in float64."""
    x = np.asarray(x, np.float64)
    nan = np.isnan(x)
    if base == "gelu":
        return _dgelu(x)
    if base == "relu":
        return np.where(nan, x, (x > 0).astype(np.float64))
    if base == "silu":
        return _dswish(x, 1.0)
    if base == "qgelu":
        return _dswish(x, QGELU_ALPHA)
    if base == "srelu":
        return np.where(nan | (x > 0), 2.0 * x, 0.0)
    if base == "sigmoid":
        return sigmoid(x) * sigmoid(-x)
    if base == "clamped":
        return np.where(x > p["limit"], 0.0, _dswish(x, p["alpha"]))
    raise ValueError(base)


def df_sign(base: str, x, p) -> np.ndarray:
    """Sign of the exact f'(x) where a float f'(x) underflows to 0 (te/activation.h):
    0 for slopes that are exactly zero (relu, srelu at x <= 0, above the clamp, at
    +-inf), 1 for the sigmoid, -1 in the negative tails of the swish and gelu kinds."""
    x = np.asarray(x, np.float64)
    if base in ("relu", "srelu"):
        return np.zeros_like(x)
    tail = np.where(np.isinf(x), 0.0, 1.0 if base == "sigmoid" else -1.0)
    return np.where(x > p["limit"], 0.0, tail) if base == "clamped" else tail


def f_sign(base: str, x, p) -> np.ndarray:
    """Sign of the exact f(x) where a float f(x) is 0 (0 at x = +-inf and for exact zeros)."""
    x = np.asarray(x, np.float64)
    if base == "relu":
        return np.zeros_like(x)
    if base == "srelu":
        return (x > 0).astype(np.float64)
    if base == "sigmoid":
        return np.where(np.isinf(x), 0.0, 1.0)
    c = _clamp_above(x, p["limit"]) if base == "clamped" else x
    return np.where(np.isinf(c), 0.0, np.sign(c))


def times_infinite_linear(g, d, sign, lin) -> np.ndarray:
    """g * f'(a) * lin(b) where lin(b) is +-inf: the limit (0 for an exactly zero
    factor, else +-inf by the signs), NaN where g or f'(a) is NaN."""
    slope = np.where(d != 0, d, sign)
    zero = (g == 0) | (slope == 0)
    limit = np.where(zero, 0.0, np.sign(g) * np.sign(slope) * lin)
    return np.where(np.isnan(g) | np.isnan(d), np.nan, limit)


def linear(kind: str, b, p) -> np.ndarray:
    b = np.asarray(b, np.float64)
    if kind != "clamped_swiglu":
        return b
    limit = p["limit"]
    return np.where(b > limit, limit, np.where(b < -limit, -limit, b)) + p["glu_linear_offset"]


def linear_slope(kind: str, b, p) -> np.ndarray:
    """1 where the gradient flows into b, 0 where the clamp cuts it (NaN counts as 1)."""
    b = np.asarray(b, np.float64)
    if kind != "clamped_swiglu":
        return np.ones_like(b)
    return np.where((b > p["limit"]) | (b < -p["limit"]), 0.0, 1.0)


def params(**overrides) -> dict:
    p = dict(DEFAULT_PARAMS)
    p.update({k: v for k, v in overrides.items() if v is not None})
    return p


def split(x: np.ndarray):
    """(a, b) halves of the last dimension."""
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:]


def forward(x, kind: str, **overrides) -> np.ndarray:
    """The activation output in float64 (gated kinds halve the last dimension)."""
    p = params(**overrides)
    x = np.asarray(x).astype(np.float64)
    if kind not in GATED:
        return f(BASE[kind], x, p)
    a, b = split(x)
    base, lin = BASE[kind], linear(kind, b, p)
    fa = f(base, a, p)
    with np.errstate(invalid="ignore"):
        # An infinite linear half gives the limit, not 0 * inf (numerics.md).
        return np.where(np.isinf(lin), times_infinite_linear(1.0, fa, f_sign(base, a, p), lin), fa * lin)


def backward(grad, x, kind: str, **overrides) -> np.ndarray:
    """d(output)/d(input) applied to grad, in float64, with the input's shape."""
    p = params(**overrides)
    x = np.asarray(x).astype(np.float64)
    g = np.asarray(grad).astype(np.float64)
    base = BASE[kind]
    with np.errstate(invalid="ignore", over="ignore"):
        if kind not in GATED:
            return g * df(base, x, p)
        a, b = split(x)
        d, lin = df(base, a, p), linear(kind, b, p)
        da = np.where(np.isinf(lin), times_infinite_linear(g, d, df_sign(base, a, p), lin), g * d * lin)
        db = np.where(linear_slope(kind, b, p) == 0, 0.0, g * f(base, a, p))
    return np.concatenate([da, db], axis=-1)


def chunked_column_sum(values_fp32: np.ndarray) -> np.ndarray:
    """dbias in the documented FP32 order: rows in groups of 4, each summed in
    row order; the groups of a 64-row chunk added in order; the chunk sums
    added in chunk order. Every sum starts from +0."""
    v = np.asarray(values_fp32, np.float32)
    k = v.shape[-1] if v.ndim else 1
    v = v.reshape(-1, k)
    total = np.zeros(k, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, v.shape[0], CHUNK_ROWS):
            chunk = np.zeros(k, np.float32)
            for group_start in range(start, min(start + CHUNK_ROWS, v.shape[0]), GROUP_ROWS):
                group = np.zeros(k, np.float32)
                for row in v[group_start : min(group_start + GROUP_ROWS, start + CHUNK_ROWS)]:
                    group = group + row
                chunk = chunk + group
            total = total + chunk
    return total
