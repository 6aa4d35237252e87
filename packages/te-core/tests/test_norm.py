"""LayerNorm / RMSNorm on the CPU backend against the float64 oracle (reference_norm).

The core computes in FP32, so results are checked within the derived per-element bounds
of reference_norm; the fused FP8 output is checked byte for byte against te_quantize_fp8
of the same backend's FP32 output.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from norm_inputs import FLOAT_DTYPES, NORM_SHAPES, grad_input, norm_input, weights

import transformer_engine.core as tc
from transformer_engine.core import reference as ref
from transformer_engine.core import reference_norm as nref

pytestmark = pytest.mark.norm

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
# Errors: each names the argument and the rule

lib = tc.lib


def desc(a):
    return tc._arrays.desc(a)


def f32(*shape):
    return np.ones(shape, np.float32)


def ln_fwd(x=None, gamma=None, beta=None, eps=1e-5, y=None, y_scale=None, mu=None, rsigma=None):
    x = f32(4, 16) if x is None else x
    gamma = f32(16) if gamma is None else gamma
    beta = f32(16) if beta is None else beta
    y = f32(*x.shape) if y is None else y
    opt = lambda a: None if a is None else desc(a)  # noqa: E731
    lib.layernorm_fwd(
        desc(x), desc(gamma), desc(beta), eps, False, desc(y), opt(y_scale), None, None, opt(mu), opt(rsigma)
    )


def test_gamma_shape_must_match_last_dim():
    with pytest.raises(
        ValueError,
        match=r"argument 'gamma' must have 16 elements \(the last dimension "
        r"of 'x'\), got shape \[15\]",
    ):
        ln_fwd(gamma=f32(15))
    with pytest.raises(ValueError, match="argument 'beta' must have 16 elements"):
        ln_fwd(beta=f32(17))
    with pytest.raises(ValueError, match="argument 'gamma' must have 8 elements"):
        tc.rmsnorm_fwd(f32(2, 8), f32(2, 8))


def test_wrong_dtypes_are_type_errors():
    with pytest.raises(TypeError, match="argument 'x' must be float32, bfloat16 or float16, got float64"):
        tc.layernorm_fwd(np.ones((2, 8)), f32(8), f32(8))
    with pytest.raises(TypeError, match="argument 'gamma' must be float32, bfloat16 or float16, got int32"):
        ln_fwd(gamma=np.ones(16, np.int32))
    with pytest.raises(TypeError, match=r"argument 'beta' must have the type of 'gamma' \(float32\), got float16"):
        ln_fwd(beta=np.ones(16, np.float16))
    with pytest.raises(
        TypeError, match="argument 'y' must be float32, bfloat16, float16, float8_e4m3 or float8_e5m2, got int16"
    ):
        ln_fwd(y=np.ones((4, 16), np.int16))
    with pytest.raises(TypeError, match="argument 'mu' must be float32, got float16"):
        ln_fwd(mu=np.ones(4, np.float16))


def test_eps_must_be_finite_and_non_negative():
    for eps in (-1e-5, np.nan, np.inf):
        with pytest.raises(ValueError, match="argument 'eps' must be finite and >= 0"):
            tc.layernorm_fwd(f32(2, 8), f32(8), f32(8), eps)
    with pytest.raises(ValueError, match="argument 'eps' must be finite and >= 0, got -1"):
        tc.rmsnorm_fwd(f32(2, 8), f32(8), -1.0)


def test_output_shapes_checked():
    with pytest.raises(ValueError, match=r"argument 'y' must have the shape of 'x' \[4, 16\], got \[16, 4\]"):
        ln_fwd(y=f32(16, 4))
    with pytest.raises(ValueError, match=r"argument 'rsigma' must have 4 elements \(one per row"):
        ln_fwd(rsigma=f32(5))
    with pytest.raises(ValueError, match="argument 'x' must have at least 1 dimension"):
        ln_fwd(x=np.ones((), np.float32), gamma=f32(1), beta=f32(1))
    with pytest.raises(ValueError, match="argument 'x' must have a non-empty last dimension"):
        ln_fwd(x=f32(3, 0), gamma=f32(0), beta=f32(0))


def test_fp8_output_needs_scale_and_only_fp8_takes_one():
    y8 = np.zeros((4, 16), tc.numpy_dtype(tc.DType.kFloat8E4M3))
    with pytest.raises(ValueError, match=r"argument 'y_scale' is required when 'y' is FP8 \(float8_e4m3\)"):
        ln_fwd(y=y8)
    with pytest.raises(ValueError, match="argument 'y_scale' must have 1 element"):
        ln_fwd(y=y8, y_scale=f32(2))
    with pytest.raises(ValueError, match="are only for an FP8 'y'; 'y' is float32"):
        ln_fwd(y_scale=f32())


def test_backward_argument_checks():
    x, gamma = f32(4, 16), f32(16)
    mu, rsigma = f32(4), f32(4)
    with pytest.raises(TypeError, match=r"argument 'dz' must have the type of 'x' \(float32\), got float16"):
        tc.layernorm_bwd(np.ones((4, 16), np.float16), x, mu, rsigma, gamma)
    with pytest.raises(ValueError, match=r"argument 'dz' must have the shape of 'x' \[4, 16\]"):
        tc.layernorm_bwd(f32(4, 15), x, mu, rsigma, gamma)
    with pytest.raises(ValueError, match="argument 'mu' must have 4 elements"):
        tc.layernorm_bwd(x, x, f32(3), rsigma, gamma)
    with pytest.raises(ValueError, match="argument 'gamma' must have 16 elements"):
        tc.rmsnorm_bwd(x, x, rsigma, f32(4))
    with pytest.raises(TypeError, match=r"argument 'dgamma' must have the type of 'gamma' \(float32\), got float16"):
        lib.rmsnorm_bwd(
            desc(x), desc(x), desc(rsigma), desc(gamma), False, desc(f32(4, 16)), desc(np.ones(16, np.float16)), None
        )
    with pytest.raises(TypeError, match="argument 'workspace' must be byte, got float32"):
        lib.rmsnorm_bwd(
            desc(x), desc(x), desc(rsigma), desc(gamma), False, desc(f32(4, 16)), desc(f32(16)), desc(f32(8))
        )
    assert lib.layernorm_bwd_workspace_size(desc(x)) == 0  # the CPU backend needs none


def test_buffers_must_be_aligned_to_their_element_size():
    raw = np.zeros(4 * 16 * 4 + 8, np.uint8)  # keeps the memory alive
    base = raw.ctypes.data

    def at(misalign, dtype, shape, item):  # a descriptor `misalign` bytes past a multiple of item
        ptr = base + (misalign - base) % item
        return lib.TensorDesc(ptr, int(tc.te_dtype(dtype)), list(shape), 0, 0)

    x, gamma, beta, y = f32(4, 16), f32(16), f32(16), f32(4, 16)
    with pytest.raises(
        ValueError,
        match=r"argument 'x' must be aligned to its element size \(4 bytes "
        r"for float32\), got an address 2 bytes past a multiple of 4",
    ):
        lib.layernorm_fwd(
            at(2, np.float32, (4, 16), 4), desc(gamma), desc(beta), 1e-5, False, desc(y), None, None, None, None, None
        )
    bf16 = tc.numpy_dtype(tc.DType.kBFloat16)
    with pytest.raises(
        ValueError,
        match=r"argument 'y' must be aligned to its element size \(2 bytes "
        r"for bfloat16\), got an address 1 bytes past a multiple of 2",
    ):
        lib.rmsnorm_fwd(desc(x), desc(gamma), 1e-5, False, at(1, bf16, (4, 16), 2), None, None, None, None)
    with pytest.raises(ValueError, match="argument 'beta' must be aligned to its element size"):
        lib.layernorm_fwd(
            desc(x), desc(gamma), at(3, np.float32, (16,), 4), 1e-5, False, desc(y), None, None, None, None, None
        )
    rsigma = f32(4)
    with pytest.raises(ValueError, match="argument 'dx' must be aligned to its element size"):
        lib.rmsnorm_bwd(
            desc(x), desc(x), desc(rsigma), desc(gamma), False, at(2, np.float32, (4, 16), 4), desc(f32(16)), None
        )
    # One byte per element: any address will do.
    y8 = lib.TensorDesc(base + 1, int(tc.DType.kFloat8E4M3), [4, 16], 0, 0)
    lib.layernorm_fwd(
        desc(x), desc(gamma), desc(beta), 1e-5, False, y8, desc(np.array(1.0, np.float32)), None, None, None, None
    )
