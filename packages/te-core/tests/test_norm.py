"""LayerNorm / RMSNorm on the CPU backend against the float64 oracle (reference_norm),
and on every backend (the `device` fixture, last section). Errors: test_norm_errors.py.

The core computes in FP32, so results are checked within the derived per-element bounds
of reference_norm; the fused FP8 output is checked byte for byte against te_quantize_fp8
of the same backend's FP32 output.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import core_device
import norm_device as nd
import numpy as np
import pytest
from conftest import CUDA_ONLY, gpu_scale
from norm_inputs import FLOAT_DTYPES, NORM_SHAPES, grad_input, norm_input, weights

import transformer_engine.core as tc
from transformer_engine.core import reference as ref
from transformer_engine.core import reference_norm as nref

pytestmark = pytest.mark.norm
lib = tc.lib

DTYPE_COMBOS = list(itertools.product(FLOAT_DTYPES, FLOAT_DTYPES, FLOAT_DTYPES))  # x, gamma, y
NAMES = {np.dtype(d): np.dtype(d).name for d in FLOAT_DTYPES}


def combo_id(combo):
    return "-".join(NAMES[np.dtype(d)] for d in combo)


def run_forward(layernorm, x, gamma, beta, eps, zcg, **kw):
    if layernorm:
        return tc.layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma=zcg, **kw)
    return tc.rmsnorm_fwd(x, gamma, eps, zero_centered_gamma=zcg, **kw)


def check_forward(layernorm, x, gamma, beta, eps, zcg, out, out_dtype):
    if layernorm:
        y, mu, rsigma = nref.layernorm_fwd(x, gamma, beta, eps, zcg)
    else:
        (y, rsigma), mu = nref.rmsnorm_fwd(x, gamma, eps, zcg), None
    by, bmu, brs = nref.forward_bounds(layernorm, x, gamma, beta, eps, zcg, y, mu, rsigma, out_dtype)
    assert out.y.dtype == np.dtype(out_dtype) and out.y.shape == x.shape
    assert out.rsigma.dtype == np.float32 and out.rsigma.shape == x.shape[:-1]
    nref.assert_within(out.y, y, by, "y")
    nref.assert_within(out.rsigma, rsigma, brs, "rsigma")
    if layernorm:
        assert out.mu.dtype == np.float32 and out.mu.shape == x.shape[:-1]
        nref.assert_within(out.mu, mu, bmu, "mu")
    else:
        assert out.mu is None


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=combo_id)
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_forward_within_bounds(rng, layernorm, combo, shape):
    x_dtype, w_dtype, y_dtype = combo
    x = norm_input(rng, shape, x_dtype)
    gamma, beta = weights(rng, shape[-1], w_dtype)
    out = run_forward(layernorm, x, gamma, beta, 1e-5, False, out_dtype=y_dtype)
    check_forward(layernorm, x, gamma, beta, 1e-5, False, out, y_dtype)


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-3, 0.5])
def test_zero_centered_gamma_and_eps(rng, layernorm, dtype, eps):
    shape = (37, 96)
    x = norm_input(rng, shape, dtype, constant_row=eps > 0)  # eps = 0: a constant row is 0/0
    gamma, beta = weights(rng, shape[-1], dtype, zero_centered=True)
    out = run_forward(layernorm, x, gamma, beta, eps, True)
    check_forward(layernorm, x, gamma, beta, eps, True, out, dtype)
    # Zero-centred gamma is the plain norm with weight 1 + gamma (exact in FP32 here).
    plain = run_forward(
        layernorm, x, 1.0 + gamma.astype(np.float32), beta.astype(np.float32), eps, False, out_dtype=dtype
    )
    np.testing.assert_array_equal(out.y.view(np.uint8), plain.y.view(np.uint8))


def test_propagates_nan_and_inf_per_row(rng):
    x = rng.standard_normal((4, 32)).astype(np.float32)
    x[1, 5], x[2, 7] = np.inf, np.nan
    gamma, beta = weights(rng, 32, np.float32)
    ln = tc.layernorm_fwd(x, gamma, beta)  # mu = inf / NaN: whole rows NaN
    assert np.isnan(ln.y[1:3]).all() and np.isfinite(ln.y[[0, 3]]).all()
    rms = tc.rmsnorm_fwd(x, gamma)  # rsigma = 0 for the inf row: x * 0, NaN only at the inf
    assert rms.rsigma[1] == 0 and np.isnan(rms.y[2]).all() and np.isfinite(rms.y[[0, 3]]).all()
    assert np.isnan(rms.y[1, 5]) and not np.delete(rms.y[1], 5).any()


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_fused_fp8_equals_quantize_of_fp32_output(rng, layernorm, x_dtype, fmt, shape):
    x = norm_input(rng, shape, x_dtype)
    gamma, beta = weights(rng, shape[-1], np.float32)
    zcg = bool(rng.integers(2))
    scale = np.float32(rng.choice([1.0, 37.5, 300.0, 2.0**-3]))
    old_amax = np.float32(rng.choice([0.0, 1e4]))
    y32 = run_forward(layernorm, x, gamma, beta, 1e-5, zcg, out_dtype=np.float32)
    fused = run_forward(layernorm, x, gamma, beta, 1e-5, zcg, out_dtype=fmt, scale=scale, amax=old_amax)
    expected = tc.quantize_fp8(y32.y, scale, fmt, amax=old_amax)
    np.testing.assert_array_equal(fused.y.view(np.uint8), expected.rowwise.view(np.uint8))
    np.testing.assert_array_equal(fused.y.view(np.uint8), ref.quantize_fp8(y32.y, scale, fmt))
    assert fused.amax == expected.amax == max(old_amax, ref.amax(y32.y))
    assert fused.scale_inv == np.float32(1.0) / scale
    np.testing.assert_array_equal(fused.rsigma, y32.rsigma)


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_current_scaling_is_fp32_norm_then_quantize(rng, layernorm, fmt):
    x = norm_input(rng, (9, 200), ml_bf16(), specials=False)
    gamma, beta = weights(rng, 200, ml_bf16())
    out = run_forward(layernorm, x, gamma, beta, 1e-5, False, out_dtype=fmt)
    y32 = run_forward(layernorm, x, gamma, beta, 1e-5, False, out_dtype=np.float32).y
    amax = ref.amax(y32)
    scale = ref.scale_from_amax(amax, fmt)
    assert out.amax == amax and out.scale == scale and out.scale_inv == np.float32(1) / scale
    np.testing.assert_array_equal(out.y.view(np.uint8), ref.quantize_fp8(y32, scale, fmt))


def ml_bf16():
    return FLOAT_DTYPES[1]


# ---------------------------------------------------------------------------------------
# Backward


def run_backward(layernorm, dz, x, fwd, gamma, zcg):
    if layernorm:
        return tc.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, gamma, zero_centered_gamma=zcg)
    return tc.rmsnorm_bwd(dz, x, fwd.rsigma, gamma, zero_centered_gamma=zcg) + (None,)


def check_backward(layernorm, dz, x, fwd, gamma, zcg, grads):
    dx, dgamma, dbeta = grads
    if layernorm:
        e_dx, e_dg, e_db = nref.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, gamma, zcg)
    else:
        (e_dx, e_dg), e_db = nref.rmsnorm_bwd(dz, x, fwd.rsigma, gamma, zcg), None
    b_dx, b_dg, b_db = nref.backward_bounds(
        layernorm, dz, x, fwd.mu, fwd.rsigma, gamma, zcg, e_dx, x.dtype, gamma.dtype
    )
    assert dx.dtype == x.dtype and dx.shape == x.shape
    assert dgamma.dtype == gamma.dtype and dgamma.shape == gamma.shape
    nref.assert_within(dx, e_dx, b_dx, "dx")
    nref.assert_within(dgamma, e_dg, b_dg, "dgamma")
    if layernorm:
        assert dbeta.dtype == gamma.dtype
        nref.assert_within(dbeta, e_db, b_db, "dbeta")


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize(
    "x_dtype,w_dtype", list(itertools.product(FLOAT_DTYPES, FLOAT_DTYPES)), ids=lambda d: NAMES[np.dtype(d)]
)
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_backward_within_bounds(rng, layernorm, zcg, x_dtype, w_dtype, shape):
    x = norm_input(rng, shape, x_dtype, specials=False)
    gamma, beta = weights(rng, shape[-1], w_dtype, zero_centered=zcg)
    dz = grad_input(rng, shape, x_dtype)
    fwd = run_forward(layernorm, x, gamma, beta, 1e-5, zcg, out_dtype=np.float32)
    grads = run_backward(layernorm, dz, x, fwd, gamma, zcg)
    check_backward(layernorm, dz, x, fwd, gamma, zcg, grads)


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zcg", [False, True])
def test_reference_backward_matches_finite_differences(rng, layernorm, zcg):
    """The oracle's analytic backward against central differences of its own forward."""
    x = rng.standard_normal((3, 8)) + 0.5
    gamma = rng.standard_normal(8) * 0.5 + (0.0 if zcg else 1.0)
    beta = rng.standard_normal(8)
    dz = rng.standard_normal((3, 8))
    eps, h = 1e-3, 1e-6

    def loss(x_, g_, b_):
        y = nref.layernorm_fwd(x_, g_, b_, eps, zcg)[0] if layernorm else nref.rmsnorm_fwd(x_, g_, eps, zcg)[0]
        return float((dz * y).sum())

    def numeric(arg):
        args = [x, gamma, beta]
        grad = np.zeros_like(args[arg])
        for i in np.ndindex(grad.shape):
            up = [a.copy() for a in args]
            down = [a.copy() for a in args]
            up[arg][i] += h
            down[arg][i] -= h
            grad[i] = (loss(*up) - loss(*down)) / (2 * h)
        return grad

    if layernorm:
        _, mu, rsigma = nref.layernorm_fwd(x, gamma, beta, eps, zcg)
        analytic = nref.layernorm_bwd(dz, x, mu, rsigma, gamma, zcg)
    else:
        _, rsigma = nref.rmsnorm_fwd(x, gamma, eps, zcg)
        analytic = nref.rmsnorm_bwd(dz, x, rsigma, gamma, zcg)
    for arg, grad in enumerate(analytic):
        np.testing.assert_allclose(grad, numeric(arg), rtol=1e-6, atol=1e-7)


def test_backward_propagates_nan_rows(rng):
    x = rng.standard_normal((4, 32)).astype(np.float32)
    x[2, 3] = np.nan
    gamma, beta = weights(rng, 32, np.float32)
    fwd = tc.layernorm_fwd(x, gamma, beta)
    dx, dgamma, dbeta = tc.layernorm_bwd(np.ones_like(x), x, fwd.mu, fwd.rsigma, gamma)
    assert np.isnan(dx[2]).all() and np.isfinite(dx[[0, 1, 3]]).all()
    assert np.isnan(dgamma).all() and np.isfinite(dbeta).all()


def test_empty_batch(rng):
    x = np.zeros((0, 16), np.float32)
    gamma, beta = weights(rng, 16, np.float32)
    out = tc.layernorm_fwd(x, gamma, beta, out_dtype="e4m3", scale=4.0)
    assert out.y.shape == (0, 16) and out.scale_inv == 0.25 and out.amax == 0
    dx, dgamma, dbeta = tc.layernorm_bwd(x, x, out.mu, out.rsigma, gamma)
    assert dx.shape == (0, 16) and not dgamma.any() and not dbeta.any()


def test_one_dimensional_input_is_one_row(rng):
    x = norm_input(rng, (48,), np.float32)
    gamma, beta = weights(rng, 48, np.float32)
    out = tc.layernorm_fwd(x, gamma, beta)
    assert out.mu.shape == () and out.rsigma.shape == ()
    two_d = tc.layernorm_fwd(x[None], gamma, beta)
    np.testing.assert_array_equal(out.y, two_d.y[0])


def test_results_do_not_depend_on_thread_count(rng, tmp_path):
    """Same bytes with TE_NUM_THREADS=1 as with the default worker count."""
    x = norm_input(rng, (300, 96), np.float32, specials=False)
    gamma, beta = weights(rng, 96, np.float32)
    dz = grad_input(rng, (300, 96), np.float32)
    np.savez(tmp_path / "in.npz", x=x, gamma=gamma, beta=beta, dz=dz)
    script = (
        "import numpy as np, sys, transformer_engine.core as tc\n"
        "d = np.load(sys.argv[1]); f = tc.layernorm_fwd(d['x'], d['gamma'], d['beta'])\n"
        "g = tc.layernorm_bwd(d['dz'], d['x'], f.mu, f.rsigma, d['gamma'])\n"
        "np.savez(sys.argv[2], y=f.y, dx=g[0], dgamma=g[1], dbeta=g[2])\n"
    )
    results = []
    for threads in ("1", "3"):
        out = tmp_path / f"out{threads}.npz"
        env = dict(os.environ, TE_NUM_THREADS=threads)
        subprocess.run([sys.executable, "-c", script, str(tmp_path / "in.npz"), str(out)], env=env, check=True)
        results.append(np.load(out))
    for key in ("y", "dx", "dgamma", "dbeta"):
        np.testing.assert_array_equal(results[0][key], results[1][key])


# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# Every backend, raw buffers on the test's device (the `device` fixture):
# - against the float64 oracle within the derived bounds of reference_norm, and against
#   the CPU backend (the NumPy API) within the sum of both backends' bounds (CUDA's
#   summation orders differ, so the backends agree within rounding, not bit for bit);
# - the fused FP8 output byte for byte equal to te_quantize_fp8 (same device) of its FP32 y;
# - deterministic: two runs give the same bytes (dgamma/dbeta included);
# - buffers that are not 16-byte aligned (shifted by whole elements: the API rejects
#   addresses that are not a multiple of the element size) take the element-wise path and
#   give the same bytes as aligned ones, whichever buffer is shifted.

# Beyond the CPU shapes: long rows (8192; 16384 is the last register-resident forward
# shape, 10000 and 20000 take the looped kernels of the backward / both), rows whose
# length is no multiple of 8 (100, 1000: the scalar path), many rows. The long and
# many-row shapes run on CUDA only (gpu_scale): on the CPU they repeat the same loops.
CUDA_SHAPES = [(64, 8192), (3, 16384), (4, 10000), (3, 20000), (2048, 512)]
DEVICE_SHAPES = NORM_SHAPES + [(33, 100), (17, 1000)] + gpu_scale(*CUDA_SHAPES)
# (shape, offset in elements): every shape aligned, and two shifted ones.
OFFSET_CASES = (
    [(s, 0) for s in NORM_SHAPES + [(33, 100), (17, 1000)]]
    + [pytest.param(s, 0, marks=pytest.mark.gpu_scale) for s in CUDA_SHAPES]
    + [((40, 256), 2), ((9, 1000), 4)]
)


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize(
    "combo",
    list(itertools.product(FLOAT_DTYPES, FLOAT_DTYPES, FLOAT_DTYPES)),
    ids=lambda c: "-".join(np.dtype(d).name for d in c),
)
@pytest.mark.parametrize("shape", DEVICE_SHAPES)
def test_device_forward_vs_oracle_and_cpu(device, rng, layernorm, combo, shape):
    x_dtype, w_dtype, y_dtype = combo
    zcg = bool(rng.integers(2))
    x = norm_input(rng, shape, x_dtype)
    gamma, beta = weights(rng, shape[-1], w_dtype, zero_centered=zcg)
    got = nd.device_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype)
    (y, mu, rsigma), (by, bmu, brs) = nd.oracle_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype)
    nref.assert_within(got["y"], y, by, f"{device} y vs oracle")
    nref.assert_within(got["rsigma"], rsigma, brs, f"{device} rsigma vs oracle")
    cpu = nd.numpy_api_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype)
    # Both backends are within the bound of the oracle, so within twice it of each other.
    nref.assert_within(got["y"], cpu.y.astype(np.float64), 2 * by, f"{device} y vs cpu")
    nref.assert_within(got["rsigma"], cpu.rsigma, 2 * brs, f"{device} rsigma vs cpu")
    if layernorm:
        nref.assert_within(got["mu"], mu, bmu, f"{device} mu vs oracle")
        nref.assert_within(got["mu"], cpu.mu, 2 * bmu, f"{device} mu vs cpu")


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
# offset: x and y shifted by that many elements (2: no 16-byte alignment for any x type).
@pytest.mark.parametrize("shape,offset", OFFSET_CASES)
def test_device_fused_fp8_equals_quantize_of_its_fp32_output(device, rng, layernorm, x_dtype, fmt, shape, offset):
    x = norm_input(rng, shape, x_dtype)
    gamma, beta = weights(rng, shape[-1], np.dtype(np.float32))
    zcg = bool(rng.integers(2))
    scale = np.float32(rng.choice([1.0, 37.5, 300.0, 2.0**-3]))
    amax0 = np.float32(rng.choice([0.0, 1e4]))
    fused = nd.device_forward(layernorm, x, gamma, beta, 1e-5, zcg, fmt, scale=scale, amax=amax0, offset=offset)
    y32 = nd.device_forward(layernorm, x, gamma, beta, 1e-5, zcg, np.float32, offset=offset)["y"]
    # te_quantize_fp8 on the device copy of the device's FP32 y.
    dy, q = nd.Dev(y32), nd.Dev(shape=shape, dtype=np.uint8, code=nd.FP8_CODES[fmt])
    ds, dsi, dam = nd.Dev(np.array(scale)), nd.Dev(np.array(0.0, np.float32)), nd.Dev(np.array(amax0))
    lib.quantize_fp8(dy.desc, ds.desc, q.desc, None, dsi.desc, dam.desc, core_device.stream())
    nd.same_bytes(fused["y"], q.numpy(), "fused FP8 y vs te_quantize_fp8(FP32 y)")
    assert fused["amax"] == dam.numpy()[()]
    assert fused["scale_inv"] == dsi.numpy()[()] == np.float32(1) / scale


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("y_dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,offset", OFFSET_CASES)
def test_device_high_precision_y_amax_is_that_of_the_stored_y(device, rng, layernorm, x_dtype, y_dtype, shape, offset):
    """y_amax with a FP32/BF16/FP16 y: max(start, max|y|) of the y the kernel stored (NaN
    rows skipped), exactly; the y bytes are those of the same call without y_amax."""
    x = norm_input(rng, shape, x_dtype)
    gamma, beta = weights(rng, shape[-1], np.dtype(np.float32))
    zcg = bool(rng.integers(2))
    amax0 = np.float32(rng.choice([0.0, 0.5, 1e4]))
    fused = nd.device_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype, amax=amax0, offset=offset)
    plain = nd.device_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype, offset=offset)
    nd.same_bytes(fused["y"], plain["y"], "y with and without y_amax")
    stored = np.abs(fused["y"].astype(np.float32))
    want = max(amax0, np.float32(np.max(stored, initial=0.0, where=~np.isnan(stored))))
    assert fused["amax"] == want, (fused["amax"], want)


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize(
    "x_dtype,w_dtype", list(itertools.product(FLOAT_DTYPES, FLOAT_DTYPES)), ids=lambda d: np.dtype(d).name
)
@pytest.mark.parametrize("shape", DEVICE_SHAPES)
def test_device_backward_vs_oracle_and_cpu(device, rng, layernorm, x_dtype, w_dtype, shape):
    zcg = bool(rng.integers(2))
    x = norm_input(rng, shape, x_dtype, specials=False)
    gamma, beta = weights(rng, shape[-1], w_dtype, zero_centered=zcg)
    dz = grad_input(rng, shape, x_dtype)
    fwd = nd.numpy_api_forward(layernorm, x, gamma, beta, 1e-5, zcg, np.float32)  # the saved statistics
    dx, dgamma, dbeta = nd.device_backward(layernorm, dz, x, fwd.mu, fwd.rsigma, gamma, zcg)
    if layernorm:
        e_dx, e_dg, e_db = nref.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, gamma, zcg)
        c_dx, c_dg, c_db = tc.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, gamma, zero_centered_gamma=zcg)
    else:
        (e_dx, e_dg), e_db = nref.rmsnorm_bwd(dz, x, fwd.rsigma, gamma, zcg), None
        (c_dx, c_dg), c_db = tc.rmsnorm_bwd(dz, x, fwd.rsigma, gamma, zero_centered_gamma=zcg), None
    b_dx, b_dg, b_db = nref.backward_bounds(
        layernorm, dz, x, fwd.mu, fwd.rsigma, gamma, zcg, e_dx, x.dtype, gamma.dtype
    )
    assert dx.dtype == x.dtype and dgamma.dtype == gamma.dtype
    nref.assert_within(dx, e_dx, b_dx, f"{device} dx vs oracle")
    nref.assert_within(dgamma, e_dg, b_dg, f"{device} dgamma vs oracle")
    nref.assert_within(dx, c_dx.astype(np.float64), 2 * b_dx, f"{device} dx vs cpu")
    nref.assert_within(dgamma, c_dg.astype(np.float64), 2 * b_dg, f"{device} dgamma vs cpu")
    if layernorm:
        nref.assert_within(dbeta, e_db, b_db, f"{device} dbeta vs oracle")
        nref.assert_within(dbeta, c_db.astype(np.float64), 2 * b_db, f"{device} dbeta vs cpu")


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape", [*gpu_scale((4096, 1024), (1000, 4096), (300, 8192), (2, 20000)), (77, 1000)])
def test_device_deterministic_run_to_run(device, rng, layernorm, shape):
    bf16 = FLOAT_DTYPES[1]
    x = norm_input(rng, shape, bf16, specials=False)
    gamma, beta = weights(rng, shape[-1], bf16)
    dz = grad_input(rng, shape, bf16)
    runs = []
    for _ in range(2):
        f = nd.device_forward(layernorm, x, gamma, beta, 1e-5, False, bf16)
        b = nd.device_backward(layernorm, dz, x, f["mu"], f["rsigma"], gamma, False)
        runs.append([f["y"], f["rsigma"], *[a for a in b if a is not None]])
    for first, second in zip(*runs):
        nd.same_bytes(first, second, "second run")


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_device_unaligned_buffers_give_the_aligned_bytes(device, rng, layernorm, x_dtype):
    """The scalar path (misaligned rows) adds in the same order as the vector path."""
    shape = (37, 512)
    x = norm_input(rng, shape, x_dtype, specials=False)
    gamma, beta = weights(rng, 512, x_dtype)
    dz = grad_input(rng, shape, x_dtype)
    aligned = nd.device_forward(layernorm, x, gamma, beta, 1e-5, True, x_dtype)
    shifted = nd.device_forward(layernorm, x, gamma, beta, 1e-5, True, x_dtype, offset=1)
    for key in ("y", "rsigma"):
        nd.same_bytes(aligned[key], shifted[key], key)
    mu = aligned["mu"] if layernorm else None
    for a, b in zip(
        nd.device_backward(layernorm, dz, x, mu, aligned["rsigma"], gamma, True),
        nd.device_backward(layernorm, dz, x, mu, aligned["rsigma"], gamma, True, offset=1),
    ):
        if a is not None:
            nd.same_bytes(a, b, "backward")


F32, BF16, F16 = FLOAT_DTYPES


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize(
    "x_dtype,y_dtype",
    [(BF16, BF16), (BF16, "e4m3"), (F32, F32), (F32, "e5m2"), (F16, F32)],
    ids=lambda d: d if isinstance(d, str) else np.dtype(d).name,
)
@pytest.mark.parametrize("shape", [(37, 512), *gpu_scale((300, 4096), (5, 8192))])
def test_device_each_misaligned_buffer_gives_the_aligned_bytes(device, rng, layernorm, x_dtype, y_dtype, shape):
    """Every pointer's alignment is checked before a vector path is taken: shifting any one
    buffer by one element (x, y, gamma, beta; dz, x, dx, gamma) must neither fault nor
    change a byte. The shapes take the one-warp and multi-warp row kernels."""
    x = norm_input(rng, shape, x_dtype, specials=False)
    gamma, beta = weights(rng, shape[-1], BF16)
    dz = grad_input(rng, shape, x_dtype)
    # (a high-precision y with y_amax: the stored y's amax must not depend on the path either)
    kw = dict(scale=np.float32(8.0)) if isinstance(y_dtype, str) else dict(amax=np.float32(0.0))
    aligned = nd.device_forward(layernorm, x, gamma, beta, 1e-5, False, y_dtype, **kw)
    for name in ("x", "y", "gamma", "beta"):
        shifted = nd.device_forward(layernorm, x, gamma, beta, 1e-5, False, y_dtype, offsets={name: 1}, **kw)
        for key in ("y", "mu", "rsigma", "amax", "scale_inv"):
            if aligned.get(key) is not None:
                nd.same_bytes(aligned[key], shifted[key], f"forward, {name} shifted: {key}")
    mu = aligned["mu"] if layernorm else None
    ref = nd.device_backward(layernorm, dz, x, mu, aligned["rsigma"], gamma, False)
    for name in ("dz", "x", "dx", "gamma"):
        got = nd.device_backward(layernorm, dz, x, mu, aligned["rsigma"], gamma, False, offsets={name: 1})
        for a, b in zip(ref, got):
            if a is not None:
                nd.same_bytes(a, b, f"backward, {name} shifted")


def test_device_misaligned_element_address_is_rejected(device, rng):
    """An FP32 buffer 2 bytes off its element alignment is refused before any kernel runs."""
    x = norm_input(rng, (4, 64), np.float32, specials=False)
    gamma, beta = weights(rng, 64, np.dtype(np.float32))
    bad = nd.Dev(x, offset=2)
    args = [nd.Dev(gamma), nd.Dev(beta)]
    y = nd.Dev(shape=x.shape, dtype=np.float32)
    with pytest.raises(
        ValueError,
        match=r"argument 'x' must be aligned to its element size \(4 bytes "
        r"for float32\), got an address 2 bytes past a multiple of 4",
    ):
        lib.layernorm_fwd(
            bad.desc,
            args[0].desc,
            args[1].desc,
            1e-5,
            False,
            y.desc,
            None,
            None,
            None,
            None,
            None,
            core_device.stream(),
        )
    core_device.sync()  # (CUDA: the context is still healthy)


def test_device_empty_batch(device, rng):
    gamma, beta = weights(rng, 64, np.dtype(np.float32))
    x = np.zeros((0, 64), np.float32)
    out = nd.device_forward(True, x, gamma, beta, 1e-5, False, "e4m3", scale=4.0, amax=3.0)
    assert out["scale_inv"] == 0.25 and out["amax"] == 3.0
    _, dgamma, dbeta = nd.device_backward(True, x, x, np.zeros(0), np.zeros(0), gamma, False)
    assert not dgamma.any() and not dbeta.any()


@CUDA_ONLY
def test_cuda_workspace_checks(device, rng):
    """(The CPU backward needs no workspace: its size is 0.)"""
    gamma = weights(rng, 64, np.dtype(np.float32))[0]
    x = rng.standard_normal((8, 64)).astype(np.float32)
    dxin = nd.Dev(x)
    need = lib.layernorm_bwd_workspace_size(dxin.desc)
    small = nd.Dev(shape=(need - 1,), dtype=np.uint8)
    args = [nd.Dev(x), dxin, nd.Dev(np.zeros(8, np.float32)), nd.Dev(np.ones(8, np.float32)), nd.Dev(gamma)]
    outs = [nd.Dev(shape=x.shape, dtype=np.float32), nd.Dev(gamma), nd.Dev(gamma)]
    with pytest.raises(ValueError, match=f"argument 'workspace' must hold at least {need} bytes"):
        lib.layernorm_bwd(*[a.desc for a in args], False, *[o.desc for o in outs], small.desc, core_device.stream())
    with pytest.raises(ValueError, match="argument 'workspace' is required"):
        lib.layernorm_bwd(*[a.desc for a in args], False, *[o.desc for o in outs], None, core_device.stream())
