"""LayerNorm / RMSNorm statistics of finite rows whose FP32 sums overflow (issue 15):
values around 1e20 (squares above FLT_MAX), one 1.7e38 outlier, sums of x above
FLT_MAX. The core retries such a sum on terms scaled by 2^-100 (docs/numerics.md),
so the results stay within the usual bounds of the float64 oracle."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import transformer_engine.core as tc
from transformer_engine.core import reference_norm as nref

BF16 = ml_dtypes.bfloat16


def huge_rows(rng, rows: int, h: int, dtype) -> np.ndarray:
    """Rows whose sum of squares (and, for some, sum) overflows FP32, plus one ordinary row."""
    x = rng.standard_normal((rows, h)) * 10.0 ** rng.uniform(19, 21, (rows, h))  # ~1e20: squares ~1e40
    x[1] = rng.standard_normal(h)
    x[1, h // 3] = 1.7e38  # one outlier in an ordinary row
    x[2, :2] = 2.0e38  # S(x) itself overflows
    x[2, 2:] = rng.standard_normal(h - 2)
    x[3] = rng.standard_normal(h)  # an ordinary row: the usual path
    # partial sums of both signs may overflow to +-inf (NaN); |x - mu| stays below FLT_MAX
    x[4, ::2] = 2e38 * np.where(np.arange(x[4, ::2].size) % 3 == 2, -1.0, 1.0)
    return x.astype(np.float32).astype(dtype)


def forward(layernorm, x, gamma, beta, **kw):
    if layernorm:
        return tc.layernorm_fwd(x, gamma, beta, 1e-5, **kw)
    return tc.rmsnorm_fwd(x, gamma, 1e-5, **kw)


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("h", [5, 160, 1024])
def test_overflowing_rows_match_the_float64_oracle(rng, layernorm, dtype, h):
    x = huge_rows(rng, 6, h, dtype)
    gamma = rng.uniform(0.5, 2.0, h).astype(dtype)
    beta = rng.uniform(-1, 1, h).astype(dtype)
    out = forward(layernorm, x, gamma, beta, out_dtype=np.float32)
    assert np.all(np.isfinite(out.rsigma)) and np.all(out.rsigma > 0), "rsigma collapsed to 0 or NaN"
    assert np.all(np.isfinite(out.y))
    if layernorm:
        y, mu, rsigma = nref.layernorm_fwd(x, gamma, beta, 1e-5)
    else:
        (y, rsigma), mu = nref.rmsnorm_fwd(x, gamma, 1e-5), None
    by, bmu, brs = nref.forward_bounds(layernorm, x, gamma, beta, 1e-5, False, y, mu, rsigma, np.float32)
    nref.assert_within(out.y, y, by, "y")
    nref.assert_within(out.rsigma, rsigma, brs, "rsigma")
    if layernorm:
        nref.assert_within(out.mu, mu, bmu, "mu")
    # y is normalized: unit RMS around the mean (the symptom was y = beta, 0 or NaN).
    centered = (out.y - (beta.astype(np.float64) if layernorm else 0.0)) / gamma.astype(np.float64)
    np.testing.assert_allclose(np.sqrt((centered**2).mean(axis=-1)), 1.0, rtol=1e-3)


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fused_fp8_output_of_overflowing_rows(rng, layernorm, fmt):
    x = huge_rows(rng, 6, 64, np.float32)
    gamma = rng.uniform(0.5, 2.0, 64).astype(np.float32)
    beta = rng.uniform(-1, 1, 64).astype(np.float32)
    fp32 = forward(layernorm, x, gamma, beta, out_dtype=np.float32)
    fused = forward(layernorm, x, gamma, beta, out_dtype=fmt, scale=4.0)
    expected = tc.quantize_fp8(fp32.y, 4.0, fmt)
    assert np.array_equal(fused.y.view(np.uint8), expected.rowwise.view(np.uint8))
    assert fused.amax == np.abs(fp32.y).max()
    current = forward(layernorm, x, gamma, beta, out_dtype=fmt)  # current scaling
    assert np.isfinite(current.scale) and current.scale > 0


def test_rows_with_inf_keep_their_documented_results():
    x = np.array([[1.0, np.inf, 2.0, 3.0], [1e20, -1e20, np.inf, 5.0]], np.float32)
    g = np.ones(4, np.float32)
    rms = tc.rmsnorm_fwd(x, g, 1e-5)
    assert np.all(rms.rsigma == 0)  # inf in the row: rsigma 0, as before
    ln = tc.layernorm_fwd(x, g, np.zeros(4, np.float32), 1e-5)
    assert np.all(np.isnan(ln.y))


def test_backward_of_overflowing_rows_is_finite_and_matches_the_oracle(rng):
    x = huge_rows(rng, 6, 96, np.float32)
    gamma = rng.uniform(0.5, 2.0, 96).astype(np.float32)
    beta = np.zeros(96, np.float32)
    dz = rng.standard_normal(x.shape).astype(np.float32)
    fwd = tc.layernorm_fwd(x, gamma, beta, 1e-5)
    dx, dgamma, dbeta = tc.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, gamma)
    assert np.all(np.isfinite(dx)) and np.all(np.isfinite(dgamma))
    ref_dx, ref_dg, ref_db = nref.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, gamma)
    b_dx, b_dg, b_db = nref.backward_bounds(True, dz, x, fwd.mu, fwd.rsigma, gamma, False, dx, np.float32, np.float32)
    nref.assert_within(dx, ref_dx, b_dx, "dx")
    nref.assert_within(dgamma, ref_dg, b_dg, "dgamma")
