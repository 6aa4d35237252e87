"""The targets of the bad-input campaign (fuzz_runner.py): each public function of
transformer_engine.core's NumPy API, with a generator of valid arguments, the
kind of each argument (which decides the bad values it may get instead), and an
oracle that checks a result. The raw-binding targets are in fuzz_raw.py.

An oracle returns True (the result is right), or None when it cannot judge
the arguments it got (an accepted odd input); it raises AssertionError for a
wrong result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import activation_helpers as ah
import ml_dtypes
import numpy as np

import transformer_engine.core as tc
from transformer_engine.core import reference as ref
from transformer_engine.core import reference_activation as ra
from transformer_engine.core import reference_fp8_block as rfb
from transformer_engine.core import reference_mxfp8 as rmx
from transformer_engine.core import reference_norm as nref
from transformer_engine.core.activation import GATED_ACTIVATIONS

HP = [np.float32, ml_dtypes.bfloat16, np.float16]
FMTS = ["e4m3", "e5m2"]


@dataclass
class Target:
    name: str
    call: Callable
    make: Callable  # rng -> dict of keyword arguments (all valid)
    kinds: dict  # argument -> kind (fuzz_runner.BAD_VALUES keys)
    oracle: Callable | None = None  # (kwargs, result) -> True | None, or AssertionError


def hostile(rng, shape, dtype=np.float32, specials=True):
    """Random values of mixed magnitude, with NaN, infinities, 3e38 and denormals."""
    n = int(np.prod(shape, dtype=np.int64))
    x = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 30.0, 1e3], n)
    if specials and n:
        pool = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-40, 0.0, -0.0])
        mask = rng.random(n) < 0.1
        x[mask] = rng.choice(pool, int(mask.sum()))
    with np.errstate(over="ignore"):
        return x.reshape(shape).astype(np.float32).astype(dtype)


def shape2d(rng, k_multiple=1, m_multiple=1, max_rows=40, max_cols=96):
    m = int(rng.integers(1, max_rows // m_multiple + 1)) * m_multiple
    k = int(rng.integers(1, max_cols // k_multiple + 1)) * k_multiple
    if rng.random() < 0.3:  # a leading dimension split in two
        return (1, m, k) if rng.random() < 0.5 else (m, 1, k)
    return (m, k)


def _bytes(a):
    return None if a is None else np.asarray(a).view(np.uint8)


def _same_values(a, b) -> bool:
    """Equal values, signed zeros included; any NaN matches any NaN (NaN bytes are per backend)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all(both_nan | ((a == b) & (np.signbit(a) == np.signbit(b)))))


def _fp8_oracle(kw, out):
    x, scale, fmt = kw["x"], kw["scale"], kw.get("fp8_dtype", "e4m3")
    if not isinstance(x, np.ndarray) or x.dtype not in [np.dtype(d) for d in HP] or not np.isscalar(scale):
        return None
    expected = ref.quantize_fp8(x, float(scale), ref.fp8_name(fmt))
    if kw.get("rowwise", True):
        assert np.array_equal(_bytes(out.rowwise), expected), "quantize_fp8 bytes"
    if kw.get("columnwise", False):
        assert np.array_equal(_bytes(out.columnwise), ref.columnwise(expected)), "columnwise bytes"
    return True


def _amax_oracle(kw, out):
    x = kw["x"]
    if not isinstance(x, np.ndarray) or x.dtype not in [np.dtype(d) for d in HP]:
        return None
    assert np.float32(out) == ref.amax(x), "amax"
    return True


def _scale_oracle(kw, out):
    amax = kw["amax"]
    if not isinstance(amax, float):
        return None
    fmt = kw.get("fp8_dtype", "e4m3")
    expected = ref.scale_from_amax(amax, fmt, kw.get("force_pow_2_scales", False), kw.get("amax_epsilon", 0.0))
    assert np.array_equal(np.float32(out[0]), expected, equal_nan=True), "scale_from_amax"
    return True


def _dequantize_oracle(kw, out):
    q, s = kw["q"], kw["scale_inv"]
    if not isinstance(q, np.ndarray) or not np.isscalar(s) or q.dtype.name not in ("float8_e4m3fn", "float8_e5m2"):
        return None
    fmt = "e4m3" if q.dtype.name == "float8_e4m3fn" else "e5m2"
    expected = ref.dequantize_fp8(q.view(np.uint8), float(s), fmt, kw.get("out_dtype", np.float32))
    assert _same_values(out, expected), "dequantize values"
    return True


def _transpose_oracle(kw, out):
    x = kw["x"]
    if not isinstance(x, np.ndarray):
        return None
    k = x.shape[-1] if x.ndim else 1
    assert np.array_equal(out.view(np.uint8), x.reshape(-1, k).T.copy().view(np.uint8)), "transpose"
    return True


def _mxfp8_oracle(kw, out):
    x = kw["x"]
    if not isinstance(x, np.ndarray) or kw.get("use_2d_blocks") or not kw.get("rowwise", True):
        return None
    q, scales = rmx.quantize_mxfp8(x, kw.get("fp8_dtype", "e4m3"), swizzled=kw.get("swizzled_scales", False))
    assert np.array_equal(_bytes(out.rowwise), q), "mxfp8 data"
    assert np.array_equal(_bytes(out.rowwise_scale_inv), _bytes(scales)), "mxfp8 scales"
    return True


def _block_oracle(kw, out):
    x = kw["x"]
    if not isinstance(x, np.ndarray) or not kw.get("rowwise", True) or kw.get("layout", "gemm_ready") != "gemm_ready":
        return None
    eps = kw.get("amax_epsilon", 0.0)
    fmt = kw.get("fp8_dtype", "e4m3")
    expected = rfb.quantize(x, fmt, kw.get("block_dim", 1), "gemm_ready", kw.get("force_pow_2_scales", True), eps)
    assert np.array_equal(_bytes(out.rowwise), expected["rowwise"]), "fp8 block data"
    return True


def _norm_oracle(kw, out, layernorm):
    x, gamma = kw["x"], kw["gamma"]
    if not all(isinstance(a, np.ndarray) for a in (x, gamma)) or kw.get("out_dtype") is not None:
        return None
    eps, zcg = kw.get("eps", 1e-5), kw.get("zero_centered_gamma", False)
    if layernorm:
        y, mu, rsigma = nref.layernorm_fwd(x, gamma, kw["beta"], eps, zcg)
    else:
        (y, rsigma), mu = nref.rmsnorm_fwd(x, gamma, eps, zcg), None
    by, _, brs = nref.forward_bounds(layernorm, x, gamma, kw.get("beta"), eps, zcg, y, mu, rsigma, x.dtype)
    nref.assert_within(out.y, y, by, "y")
    nref.assert_within(out.rsigma, rsigma, brs, "rsigma")
    return True


def _activation_oracle(kw, out):
    """The bounds of test_activation.py: float64 within the derived bound, NaN and inf
    where FP32 arithmetic (with or without an underflowed factor) has them."""
    x, kind = kw["x"], kw["kind"]
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or not isinstance(out, np.ndarray):
        return None
    p = ra.params()
    staged = (ah.staged_forward(kind, x, p), ah.staged_forward(kind, x, p, True))
    ah.assert_close_to_oracle(out, ra.forward(x, kind), ah.forward_bound(kind, x, p), staged)
    return True


def _activation_backward_oracle(kw, out):
    x, g, kind = kw["x"], kw["grad"], kw["kind"]
    arrays = all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in (x, g))
    if not arrays or kw.get("out_dtype") is not None or not isinstance(kind, str):
        return None
    p = ra.params()
    staged = (ah.staged_backward(kind, g, x, p), ah.staged_backward(kind, g, x, p, True))
    ah.assert_close_to_oracle(out.grad_input, ra.backward(g, x, kind), ah.backward_bound(kind, g, x, p), staged)
    return True


def targets() -> list[Target]:
    """Every fuzzed function of the NumPy API."""

    def hp(rng, shape):
        return hostile(rng, shape, HP[rng.integers(3)])

    return [
        Target(
            "quantize_fp8",
            lambda **k: tc.quantize_fp8(**k),
            lambda r: {
                "x": hp(r, shape2d(r)),
                "scale": float(r.choice([1.0, 0.5, 64.0, 1e-3])),
                "fp8_dtype": r.choice(FMTS),
                "rowwise": True,
                "columnwise": bool(r.random() < 0.5),
            },
            {
                "x": "array",
                "scale": "scalar",
                "fp8_dtype": "fmt",
                "rowwise": "flag",
                "columnwise": "flag",
                "amax": "scalar",
            },
            _fp8_oracle,
        ),
        Target(
            "quantize_fp8_current_scaling",
            lambda **k: tc.quantize_fp8_current_scaling(**k),
            lambda r: {
                "x": hp(r, shape2d(r)),
                "fp8_dtype": r.choice(FMTS),
                "force_pow_2_scales": bool(r.random() < 0.5),
            },
            {
                "x": "array",
                "fp8_dtype": "fmt",
                "force_pow_2_scales": "flag",
                "amax_epsilon": "real",
                "columnwise": "flag",
            },
        ),
        Target(
            "compute_amax",
            lambda **k: tc.compute_amax(**k),
            lambda r: {"x": hp(r, shape2d(r))},
            {"x": "array"},
            _amax_oracle,
        ),
        Target(
            "compute_scale_from_amax",
            lambda **k: tc.compute_scale_from_amax(**k),
            lambda r: {"amax": float(r.choice([0.0, 1.0, 448.0, 3e38, 1e-40, np.inf])), "fp8_dtype": r.choice(FMTS)},
            {"amax": "scalar", "fp8_dtype": "fmt", "force_pow_2_scales": "flag", "amax_epsilon": "real"},
            _scale_oracle,
        ),
        Target(
            "dequantize_fp8",
            lambda **k: tc.dequantize_fp8(**k),
            lambda r: {
                "q": r.integers(0, 256, shape2d(r), dtype=np.uint8).view(
                    ml_dtypes.float8_e4m3fn if r.random() < 0.5 else ml_dtypes.float8_e5m2
                ),
                "scale_inv": float(r.choice([1.0, 0.25, 3.0])),
                "out_dtype": HP[r.integers(3)],
            },
            {"q": "array", "scale_inv": "scalar", "out_dtype": "dtype"},
            _dequantize_oracle,
        ),
        Target(
            "transpose",
            lambda **k: tc.transpose(**k),
            lambda r: {"x": hp(r, shape2d(r))},
            {"x": "array"},
            _transpose_oracle,
        ),
        Target(
            "quantize_mxfp8",
            lambda **k: tc.quantize_mxfp8(**k),
            lambda r: {
                "x": hp(r, shape2d(r, 32, 32, 96, 128)),
                "fp8_dtype": r.choice(FMTS),
                "columnwise": bool(r.random() < 0.5),
            },
            {
                "x": "array",
                "fp8_dtype": "fmt",
                "rowwise": "flag",
                "columnwise": "flag",
                "use_2d_blocks": "flag",
                "swizzled_scales": "flag",
            },
            _mxfp8_oracle,
        ),
        Target(
            "quantize_fp8_block",
            lambda **k: tc.quantize_fp8_block(**k),
            lambda r: {
                "x": hp(r, shape2d(r, 16, 1, 40, 256)),
                "block_dim": int(r.choice([1, 2])),
                "fp8_dtype": r.choice(FMTS),
            },
            {
                "x": "array",
                "block_dim": "int",
                "layout": "choice",
                "rowwise": "flag",
                "columnwise": "flag",
                "amax_epsilon": "real",
            },
            _block_oracle,
        ),
        Target(
            "quantize_nvfp4",
            lambda **k: tc.quantize_nvfp4(**k),
            lambda r: {
                "x": hp(r, shape2d(r, 16, 16, 64, 64)),
                "stochastic_rounding": bool(r.random() < 0.3),
                "seed": 7,
            },
            {
                "x": "array",
                "rowwise": "flag",
                "columnwise": "flag",
                "block_2d": "flag",
                "stochastic_rounding": "flag",
                "seed": "int",
                "offset": "int",
                "random_hadamard": "flag",
                "rht_sign_mask": "int",
                "amax_rowwise": "scalar",
            },
        ),
        Target(
            "layernorm_fwd",
            lambda **k: tc.layernorm_fwd(**k),
            lambda r: _norm_args(r, True),
            {
                "x": "array",
                "gamma": "array",
                "beta": "array",
                "eps": "real",
                "zero_centered_gamma": "flag",
                "scale": "scalar",
            },
            lambda kw, out: _norm_oracle(kw, out, True),
        ),
        Target(
            "rmsnorm_fwd",
            lambda **k: tc.rmsnorm_fwd(**k),
            lambda r: _norm_args(r, False),
            {"x": "array", "gamma": "array", "eps": "real", "zero_centered_gamma": "flag", "out_dtype": "dtype"},
            lambda kw, out: _norm_oracle(kw, out, False),
        ),
        Target(
            "activation_forward",
            lambda **k: tc.activation_forward(**k),
            lambda r: {
                "x": hp(r, (int(r.integers(1, 9)), 2 * int(r.integers(1, 33)))),
                "kind": str(r.choice(tc.ACTIVATIONS)),
            },
            {
                "x": "array",
                "kind": "int",
                "out_dtype": "dtype",
                "scale": "scalar",
                "rowwise": "flag",
                "columnwise": "flag",
            },
            _activation_oracle,
        ),
        Target(
            "activation_backward",
            lambda **k: tc.activation_backward(**k),
            _activation_backward_args,
            {"grad": "array", "x": "array", "kind": "int", "dbias": "flag", "out_dtype": "dtype"},
            _activation_backward_oracle,
        ),
        Target(
            "delayed_scaling_update",
            lambda **k: tc.delayed_scaling_update(**k),
            _delayed_args,
            {
                "amax_histories": "list",
                "scales": "list",
                "margin": "real",
                "amax_compute_algo": "choice",
                "fp8_dtype": "fmt",
            },
        ),
        Target(
            "scaled_softmax_forward",
            lambda **k: tc.scaled_softmax_forward(**k),
            lambda r: {
                "x": hp(r, (2, 2, int(r.integers(1, 9)), int(r.integers(1, 33)))),
                "scale": float(r.uniform(0.1, 2)),
            },
            {"x": "array", "scale": "real"},
        ),
        Target(
            "swizzle_block_scales",
            lambda **k: tc.swizzle_block_scales(**k),
            lambda r: {
                "scales": r.integers(0, 256, (128 * int(r.integers(1, 3)), 4 * int(r.integers(1, 3))), dtype=np.uint8)
            },
            {"scales": "array", "columnwise": "flag"},
        ),
        Target(
            "gemm",
            lambda **k: tc.gemm(**k),
            _gemm_args,
            {"a": "array", "b": "array", "transa": "flag", "transb": "flag", "alpha": "real", "beta": "real"},
        ),
        Target(
            "numpy_dtype",
            lambda **k: tc.numpy_dtype(**k),
            lambda r: {"dtype": int(r.integers(0, 10))},
            {"dtype": "int"},
        ),
        Target(
            "pack_fp4",
            lambda **k: tc.pack_fp4(**k),
            lambda r: {"values": r.integers(0, 16, (int(r.integers(1, 5)), 2 * int(r.integers(1, 9))), dtype=np.uint8)},
            {"values": "array"},
        ),
    ]


def _norm_args(r, layernorm):
    dtype = HP[r.integers(3)]
    shape = shape2d(r)
    kw = {
        "x": hostile(r, shape, dtype, specials=r.random() < 0.3),
        "gamma": hostile(r, shape[-1:], dtype, specials=False),
        "eps": 1e-5,
        "zero_centered_gamma": bool(r.random() < 0.3),
    }
    if layernorm:
        kw["beta"] = hostile(r, shape[-1:], dtype, specials=False)
    return kw


def _activation_backward_args(r):
    kind = str(r.choice(tc.ACTIVATIONS))
    rows, h = int(r.integers(1, 9)), int(r.integers(1, 33))
    x = hostile(r, (rows, 2 * h), np.float32)
    out = (rows, h) if kind in GATED_ACTIVATIONS else (rows, 2 * h)
    return {"grad": hostile(r, out, np.float32), "x": x, "kind": kind}


def _delayed_args(r):
    length, n = int(r.integers(1, 6)), int(r.integers(1, 4))
    return {
        "amax_histories": [np.abs(hostile(r, (length, n))) for _ in range(2)],
        "scales": [np.ones(n, np.float32) for _ in range(2)],
        "margin": float(r.choice([0.0, 1.0])),
    }


def _gemm_args(r):
    m, n, k = (16 * int(r.integers(1, 4)) for _ in range(3))
    dtype = HP[r.integers(3)]
    return {
        "a": hostile(r, (m, k), dtype, specials=False),
        "b": hostile(r, (n, k), dtype, specials=False),
        "transb": True,
    }
