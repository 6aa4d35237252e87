"""LayerNorm / RMSNorm: bad arguments are errors naming the argument and the rule."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_engine.core as tc

pytestmark = pytest.mark.norm

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
