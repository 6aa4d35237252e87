"""te_gemm on the CPU backend against float64 references.

The per-format error bounds and how they are derived are in transformer_engine.core.reference_gemm
(FP32 computation within (K + 4) u_32 of the magnitudes summed, then one
rounding to the output type; FP8 D between the FP8 roundings of the reference
minus and plus that bound, i.e. the rounded reference wherever the bound does
not reach a rounding boundary). Inputs are fresh random values on every run;
the seed is printed so a failure can be replayed.
"""

from __future__ import annotations

import secrets

import ml_dtypes
import numpy as np
import pytest

import transformer_engine.core as tec
from transformer_engine.core import lib
from transformer_engine.core._arrays import desc
from transformer_engine.core.reference_gemm import (
    assert_amax_close,
    assert_close,
    assert_fp8_close,
    bias_grad_reference,
    random_operand,
    random_operands,
    random_scale_inv,
    reference,
)

pytestmark = pytest.mark.gemm

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
HIGH_PRECISION = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
FP8_PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]
TRANS = [(False, False), (False, True), (True, False), (True, True)]
ODD_SHAPES = [(1, 1, 1), (5, 7, 3), (33, 65, 17)]  # (M, N, K)
FP8_SHAPES = [(16, 32, 48), (64, 48, 80)]
# Crosses every tile edge of the CPU kernel (kMC=120, kNC=512, kKC=256) and
# is large enough to run multithreaded.
BLOCKED_SHAPE = (257, 515, 263)


@pytest.fixture
def rng():
    seed = secrets.randbits(64)
    print(f"gemm test seed: {seed}")
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------
# Plain products, every type and layout.


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
@pytest.mark.parametrize("shape", ODD_SHAPES + [BLOCKED_SHAPE], ids=str)
def test_high_precision_product(rng, dtype, transa, transb, shape):
    m, n, k = shape
    a, b = random_operands(rng, m, n, k, transa, transb, dtype, dtype)
    for out_dtype in {dtype, np.dtype(np.float32)}:
        r = tec.gemm(a, b, transa=transa, transb=transb, out_dtype=out_dtype)
        assert r.out.shape == (m, n) and r.out.dtype == out_dtype
        ref = reference(a, b, transa=transa, transb=transb)
        assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("a_dtype,b_dtype", FP8_PAIRS, ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=str)
@pytest.mark.parametrize("out_dtype", [np.dtype(np.float32), BF16], ids=str)
def test_fp8_product(rng, a_dtype, b_dtype, transa, transb, shape, out_dtype):
    m, n, k = shape
    a, b = random_operands(rng, m, n, k, transa, transb, a_dtype, b_dtype)
    sa, sb = random_scale_inv(rng), random_scale_inv(rng, power_of_two=False)
    r = tec.gemm(a, b, transa=transa, transb=transb, a_scale_inv=sa, b_scale_inv=sb, out_dtype=out_dtype)
    ref = reference(a, b, transa=transa, transb=transb, a_scale_inv=sa, b_scale_inv=sb)
    assert_close(r.out, ref.out, ref.err32, "D")


def test_fp8_blocked_shape(rng):
    m, n, k = 272, 528, 272  # multiples of 16 across the CPU tile edges
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E5M2)
    r = tec.gemm(a, b, transb=True, a_scale_inv=0.5, b_scale_inv=0.25)
    ref = reference(a, b, transb=True, a_scale_inv=0.5, b_scale_inv=0.25)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("transa", [False, True])
def test_4d_a_is_folded(rng, transa):
    n = 9
    if transa:  # A stored [K..., M]: leading dims fold into K
        a = random_operand(rng, (2, 3, 4, 6), np.float32)
        b = random_operand(rng, (24, n), np.float32)
        expected_shape = (6, n)
    else:  # A [..., K]: leading dims fold into M, D keeps them
        a = random_operand(rng, (2, 3, 5, 7), np.float32)
        b = random_operand(rng, (7, n), np.float32)
        expected_shape = (2, 3, 5, n)
    r = tec.gemm(a, b, transa=transa)
    assert r.out.shape == expected_shape
    ref = reference(a, b, transa=transa)
    assert_close(r.out, ref.out, ref.err32, "D")


# ---------------------------------------------------------------------------
# alpha, beta and C; bias; GELU; bias_grad.


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
def test_alpha_beta_c(rng, dtype, transa, transb):
    m, n, k = 33, 65, 17
    a, b = random_operands(rng, m, n, k, transa, transb, dtype, dtype)
    c = random_operand(rng, (m, n), dtype)
    alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
    r = tec.gemm(a, b, transa=transa, transb=transb, c=c, alpha=alpha, beta=beta, out_dtype=dtype)
    ref = reference(a, b, transa=transa, transb=transb, c=c, alpha=alpha, beta=beta)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("out_dtype", [np.dtype(np.float32), BF16], ids=str)
def test_fp8_inputs_accumulate_into_c(rng, out_dtype):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    c = random_operand(rng, (m, n), out_dtype)
    r = tec.gemm(a, b, transb=True, a_scale_inv=0.5, b_scale_inv=2.0, c=c, beta=1.0, out_dtype=out_dtype)
    ref = reference(a, b, transb=True, a_scale_inv=0.5, b_scale_inv=2.0, c=c, beta=1.0)
    assert_close(r.out, ref.out, ref.err32, "D")


def test_beta_zero_does_not_read_c(rng):
    a, b = random_operands(rng, 5, 7, 3, False, False, np.float32, np.float32)
    c = np.full((5, 7), np.nan, np.float32)
    r = tec.gemm(a, b, c=c, beta=0.0)
    assert np.all(np.isfinite(r.out))


def test_c_may_alias_d(rng):
    m, n, k = 33, 65, 17
    a, b = random_operands(rng, m, n, k, False, False, np.float32, np.float32)
    d = random_operand(rng, (m, n), np.float32)
    ref = reference(a, b, c=d.copy(), beta=1.0)
    lib.gemm(desc(a), desc(b), desc(d), c=desc(d), beta=1.0)
    assert_close(d, ref.out, ref.err32, "D (in place)")


@pytest.mark.parametrize("out_dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("bias_dtype", HIGH_PRECISION, ids=str)
def test_bias(rng, out_dtype, bias_dtype):
    m, n, k = 33, 65, 17
    a, b = random_operands(rng, m, n, k, False, True, np.float32, np.float32)
    bias = random_operand(rng, (n,), bias_dtype)
    r = tec.gemm(a, b, transb=True, bias=bias, out_dtype=out_dtype)
    ref = reference(a, b, transb=True, bias=bias)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("pre_gelu_dtype", [None, np.dtype(np.float32)], ids=str)
def test_gelu_stores_pre_activation(rng, dtype, with_bias, pre_gelu_dtype):
    m, n, k = 33, 64, 17
    a, b = random_operands(rng, m, n, k, False, True, dtype, dtype)
    bias = random_operand(rng, (n,), dtype) if with_bias else None
    r = tec.gemm(a, b, transb=True, bias=bias, gelu=True, out_dtype=dtype, pre_gelu_dtype=pre_gelu_dtype)
    ref = reference(a, b, transb=True, bias=bias, gelu=True)
    pre = reference(a, b, transb=True, bias=bias)
    assert r.pre_gelu_out.dtype == (dtype if pre_gelu_dtype is None else pre_gelu_dtype)
    assert_close(r.pre_gelu_out, pre.out, pre.err32, "pre_gelu_out")
    assert_close(r.out, ref.out, ref.err32, "D = gelu")
    assert np.any(r.out.astype(np.float32) < 0), "GELU of random data has negative outputs"


def test_fp8_gelu_bias(rng):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    bias = random_operand(rng, (n,), BF16)
    r = tec.gemm(a, b, transb=True, a_scale_inv=0.25, b_scale_inv=0.5, bias=bias, gelu=True, out_dtype=BF16)
    ref = reference(a, b, transb=True, a_scale_inv=0.25, b_scale_inv=0.5, bias=bias, gelu=True)
    assert_close(r.out, ref.out, ref.err32, "D = gelu")


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("transa", [False, True])
def test_bias_grad(rng, dtype, transa):
    m, n, k = 33, 65, 17
    a, b = random_operands(rng, m, n, k, transa, False, dtype, dtype)
    r = tec.gemm(a, b, transa=transa, bias_grad=True, out_dtype=dtype)
    expected, err = bias_grad_reference(a, transa=transa)
    assert r.bias_grad.shape == (m,) and r.bias_grad.dtype == dtype
    assert_close(r.bias_grad, expected, err, "bias_grad")
    ref = reference(a, b, transa=transa)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("transa", [False, True])
def test_fp8_bias_grad(rng, transa):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, transa, False, E5M2, E4M3)
    r = tec.gemm(a, b, transa=transa, a_scale_inv=0.5, b_scale_inv=1.0, bias_grad=True, bias_grad_dtype=BF16)
    expected, err = bias_grad_reference(a, 0.5, transa=transa)
    assert_close(r.bias_grad, expected, err, "bias_grad")


# ---------------------------------------------------------------------------
# FP8 output.


@pytest.mark.parametrize("d_dtype", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
def test_fp8_output(rng, d_dtype, transa, transb):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, transa, transb, E4M3, E5M2)
    d_scale = float(rng.uniform(0.5, 4.0))
    r = tec.gemm(
        a, b, transa=transa, transb=transb, a_scale_inv=0.125, b_scale_inv=0.5, out_dtype=d_dtype, d_scale=d_scale
    )
    ref = reference(a, b, transa=transa, transb=transb, a_scale_inv=0.125, b_scale_inv=0.5)
    assert_fp8_close(r.out, ref, d_scale)
    assert_amax_close(r.amax, ref)


def test_fp8_output_saturates(rng):
    a, b = random_operands(rng, 16, 32, 48, False, True, E4M3, E4M3)
    r = tec.gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0, out_dtype=E4M3, d_scale=1e6)
    codes = r.out.view(np.uint8) & 0x7F
    assert np.all((codes == 0x7E) | (codes == 0)), "huge d_scale saturates to +-448 (0 stays 0)"


def test_fp8_output_with_c_bias_gelu(rng):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    c = random_operand(rng, (m, n), BF16)
    bias = random_operand(rng, (n,), BF16)
    r = tec.gemm(
        a,
        b,
        transb=True,
        a_scale_inv=0.25,
        b_scale_inv=0.25,
        c=c,
        beta=0.5,
        bias=bias,
        gelu=True,
        pre_gelu_dtype=BF16,
        out_dtype=E4M3,
        d_scale=2.0,
    )
    ref = reference(a, b, transb=True, a_scale_inv=0.25, b_scale_inv=0.25, c=c, beta=0.5, bias=bias, gelu=True)
    assert_fp8_close(r.out, ref, 2.0)
    assert_amax_close(r.amax, ref)
    pre = reference(a, b, transb=True, a_scale_inv=0.25, b_scale_inv=0.25, c=c, beta=0.5, bias=bias)
    assert_close(r.pre_gelu_out, pre.out, pre.err32, "pre_gelu_out")


def test_d_amax_is_max_accumulated(rng):
    a, b = random_operands(rng, 16, 32, 48, False, True, E4M3, E4M3)
    ref = reference(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)
    d = np.empty((16, 32), E4M3)
    one = np.ones((), np.float32)
    for start in (0.0, 1e9):
        amax = np.array(start, np.float32)
        lib.gemm(
            desc(a),
            desc(b),
            desc(d),
            a_scale_inv=desc(one),
            b_scale_inv=desc(one),
            d_scale=desc(one),
            d_amax=desc(amax),
            transb=True,
        )
        assert_amax_close(amax, ref, start)


# ---------------------------------------------------------------------------
# Hostile values and edge shapes.


def test_nan_and_inf_propagate(rng):
    a, b = random_operands(rng, 6, 5, 4, False, False, np.float32, np.float32)
    a[2, 1] = np.nan
    a[4, 0] = np.inf
    r = tec.gemm(a, b)
    assert np.all(np.isnan(r.out[2]))
    assert np.all(~np.isfinite(r.out[4]))
    others = [0, 1, 3, 5]
    ref = reference(a[others], b)
    assert_close(r.out[others], ref.out, ref.err32, "D (finite rows)")


def test_fp16_denormals_are_exact(rng):
    a = (rng.integers(1, 1024, size=(4, 3)) * 2.0**-24).astype(np.float16)  # subnormal FP16
    b = np.eye(3, dtype=np.float16)
    r = tec.gemm(a, b)
    np.testing.assert_array_equal(r.out, a.astype(np.float32))


def test_fp8_nan_code_propagates(rng):
    a, b = random_operands(rng, 16, 16, 16, False, True, E4M3, E4M3)
    a.view(np.uint8)[3, 5] = 0x7F  # the E4M3 NaN
    r = tec.gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)
    assert np.all(np.isnan(r.out[3])) and np.all(np.isfinite(np.delete(r.out, 3, axis=0)))


def test_zero_k_gives_beta_c_plus_bias(rng):
    a = np.empty((4, 0), np.float32)
    b = np.empty((0, 3), np.float32)
    c = random_operand(rng, (4, 3), np.float32)
    bias = random_operand(rng, (3,), np.float32)
    r = tec.gemm(a, b, c=c, beta=2.0, bias=bias, bias_grad=True)
    np.testing.assert_allclose(r.out, 2.0 * c + bias, rtol=1e-6)
    np.testing.assert_array_equal(r.bias_grad, np.zeros(4, np.float32))


def test_cpu_needs_no_workspace(rng):
    a, b = random_operands(rng, 64, 48, 80, False, True, E4M3, E4M3)
    d = np.empty((64, 48), np.float32)
    one = np.ones((), np.float32)
    assert (
        lib.gemm_workspace_size(desc(a), desc(b), desc(d), a_scale_inv=desc(one), b_scale_inv=desc(one), transb=True)
        == 0
    )
    # Descriptors without data are fine for the size query.
    a_shape = lib.TensorDesc(0, int(tec.DType.kFloat8E4M3), [64, 80])
    b_shape = lib.TensorDesc(0, int(tec.DType.kFloat8E4M3), [48, 80])
    d_shape = lib.TensorDesc(0, int(tec.DType.kFloat32), [64, 48])
    s_shape = lib.TensorDesc(0, int(tec.DType.kFloat32), [])
    assert (
        lib.gemm_workspace_size(a_shape, b_shape, d_shape, a_scale_inv=s_shape, b_scale_inv=s_shape, transb=True) == 0
    )


# ---------------------------------------------------------------------------
# Errors: ValueError for shapes and values, TypeError for types, each naming
# the argument and the rule.


def test_fp8_dims_must_be_multiples_of_16(rng):
    a, b = random_operands(rng, 100, 64, 48, False, True, E4M3, E4M3)
    with pytest.raises(ValueError, match=r"divisible by 16 \(got M=100, N=64, K=48\).*pad"):
        tec.gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)


def test_both_e5m2_rejected(rng):
    a, b = random_operands(rng, 16, 16, 16, False, True, E5M2, E5M2)
    with pytest.raises(TypeError, match="cannot both be float8_e5m2"):
        tec.gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"b": np.ones((3, 2), np.float16)}, "'a' and 'b' must have the same type"),
        ({"a": np.ones((2, 3), np.float64)}, "argument 'a' must be"),
        ({"bias": np.ones(2, np.int32)}, "argument 'bias' must be"),
        ({"c": np.ones((2, 2), np.float16), "beta": 1.0}, "argument 'c' must be float32"),
        ({"out_dtype": np.int32}, "argument 'out_dtype' must be"),
        ({"a": np.ones((16, 16), E4M3), "b": np.ones((16, 16), np.float32)}, "both be FP8"),
    ],
)
def test_type_errors_name_the_argument(kwargs, pattern):
    args = {"a": np.ones((2, 3), np.float32), "b": np.ones((3, 2), np.float32)}
    args.update(kwargs)
    a, b = args.pop("a"), args.pop("b")
    if a.dtype == E4M3:
        args["a_scale_inv"] = 1.0
    with pytest.raises(TypeError, match=pattern):
        tec.gemm(a, b, **args)


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"b": np.ones((4, 2), np.float32)}, "inner dimensions differ"),
        ({"bias": np.ones(3, np.float32)}, r"'bias' must have shape \[N\] = \[2\]"),
        ({"c": np.ones((2, 3), np.float32), "beta": 1.0}, r"'c' must be a \[2, 2\] matrix"),
        ({"beta": 1.0}, "'beta' is 1 but 'c' is NULL"),
        ({"a_scale_inv": 1.0}, "'a_scale_inv' is only for an FP8 'a'"),
        ({"alpha": float("nan")}, "must be finite"),
    ],
)
def test_value_errors_name_the_argument(kwargs, pattern):
    b = kwargs.pop("b", np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match=pattern):
        tec.gemm(np.ones((2, 3), np.float32), b, **kwargs)


def test_fp8_scales_are_required(rng):
    a, b = random_operands(rng, 16, 16, 16, False, True, E4M3, E4M3)
    with pytest.raises(ValueError, match="'b_scale_inv' is required when 'b' is FP8"):
        tec.gemm(a, b, transb=True, a_scale_inv=1.0)
    with pytest.raises(ValueError, match="'d_scale' is required when 'd' is FP8"):
        tec.gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0, out_dtype=E4M3)


def test_workspace_too_small_on_cpu_is_fine_but_wrong_type_is_not(rng):
    a, b = random_operands(rng, 5, 7, 3, False, False, np.float32, np.float32)
    d = np.empty((5, 7), np.float32)
    ws = np.empty(16, np.float32)
    with pytest.raises(TypeError, match="argument 'workspace' must be byte"):
        lib.gemm(desc(a), desc(b), desc(d), workspace=desc(ws))
    lib.gemm(desc(a), desc(b), desc(d), workspace=desc(np.empty(0, np.uint8)))
