"""te_gemm_block on the CPU: block formats take the emulated path.

Every case quantizes fresh random inputs with the core's quantizers and
checks two things:
  * D is bit for bit te_gemm (`gemm`) on the FP32 dequantized operands, which
    is what the emulated path is defined to compute (te/gemm_block.h);
  * D is within reference_gemm's FP32 bound of the float64 product of those
    dequantized operands (finite inputs; hostile inputs only for the first).
Grouped GEMMs must equal the single GEMMs of their groups.
"""

from __future__ import annotations

import secrets

import ml_dtypes
import numpy as np
import pytest
from conftest import hostile
from gemm_block_cases import FORMATS, dequantized, linear_cases, random_linear, same_bits

import transformer_engine.core as tec
from transformer_engine.core.reference_gemm import assert_close, random_operand, reference

pytestmark = pytest.mark.gemm_block

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
# (T, In, Out): multiples of 32 (MXFP8 columnwise blocks need them), off the
# 128-element FP8 blocks, one crossing the CPU GEMM's tile edges.
LINEAR_SHAPES = [(32, 64, 96), (96, 160, 224), (160, 288, 544)]


@pytest.fixture
def rng():
    seed = secrets.randbits(64)
    print(f"gemm_block test seed: {seed}")
    return np.random.default_rng(seed)


def dense_twin(case, **kwargs):
    """te_gemm on the FP32 dequantized operands: the emulated path's definition."""
    return tec.gemm(case.a_deq, case.b_deq, transa=case.transa, transb=case.transb, **kwargs).out


def check(case, result, what, **epilogue):
    """Bitwise against te_gemm on the dequantized operands, and within the bound."""
    assert result.path == "emulated"
    out_dtype = epilogue.pop("out_dtype", F32)
    twin = dense_twin(case, out_dtype=out_dtype, **epilogue)
    assert same_bits(result.out, twin), f"{what}: differs from te_gemm on the dequantized operands"
    if np.all(np.isfinite(case.a_deq)) and np.all(np.isfinite(case.b_deq)):
        ref = reference(case.a_deq, case.b_deq, transa=case.transa, transb=case.transb, **epilogue)
        assert_close(result.out, ref.out, ref.err32, what)


# ---------------------------------------------------------------------------
# The three GEMMs of a Linear layer, every format.


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", LINEAR_SHAPES, ids=str)
@pytest.mark.parametrize("weight_2d", [False, True], ids=["w1d", "w2d"])
def test_linear_gemms(rng, fmt, shape, weight_2d):
    x, w, dy = random_linear(rng, *shape)
    for name, case in linear_cases(fmt, x, w, dy, weight_2d=weight_2d).items():
        r = tec.gemm_block(case.a, case.b, **case.kwargs())
        check(case, r, f"{fmt} {name}")


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_swizzled_scales_give_the_same_result(rng, fmt):
    x, w, dy = random_linear(rng, 64, 96, 128)
    compact = linear_cases(fmt, x, w, dy)
    swizzled = linear_cases(fmt, x, w, dy, swizzled=True)
    for name in compact:
        assert swizzled[name].a.swizzled_scales
        r1 = tec.gemm_block(compact[name].a, compact[name].b, **compact[name].kwargs())
        r2 = tec.gemm_block(swizzled[name].a, swizzled[name].b, **swizzled[name].kwargs())
        assert same_bits(r1.out, r2.out), name
        check(swizzled[name], r2, f"{fmt} {name} (swizzled)")


@pytest.mark.parametrize("fmt", FORMATS)
def test_hostile_inputs_match_te_gemm_bitwise(rng, fmt):
    """0, denormals, +-inf, NaN, huge values: the quantized operands carry them
    (saturated, NaN codes) and the GEMM still equals te_gemm on their values."""
    x, w, dy = random_linear(rng, 64, 128, 96, hostile=lambda r, s: hostile(r, s, np.float32))
    for name, case in linear_cases(fmt, x, w, dy).items():
        check(case, tec.gemm_block(case.a, case.b, **case.kwargs()), f"{fmt} {name} (hostile)")


def test_nvfp4_wgrad_with_hadamard_transform(rng):
    """Both wgrad operands carry the same RHT, so (dY H)^T (X H)... = dY^T X up
    to quantization; the GEMM itself just multiplies the stored values."""
    x, w, dy = random_linear(rng, 64, 96, 48)
    case = linear_cases("nvfp4", x, w, dy, rht=True)["wgrad"]
    r = tec.gemm_block(case.a, case.b, **case.kwargs())
    check(case, r, "nvfp4 wgrad (RHT)")
    exact = dy.T.astype(np.float64) @ x.astype(np.float64)
    assert np.abs(r.out - exact).max() <= 0.5 * np.abs(exact).max()  # the transform cancels


@pytest.mark.parametrize("fmt", FORMATS)
def test_mxfp8_and_fp8_transposes_are_the_copies(rng, fmt):
    """The transposed operand of each format is its columnwise copy."""
    x, w, dy = random_linear(rng, 32, 64, 64)
    case = linear_cases(fmt, x, w, dy)["wgrad"]
    assert case.transa == (fmt == "mxfp8") and case.transb == (fmt != "mxfp8")


# ---------------------------------------------------------------------------
# Epilogue: alpha, beta * C, bias, output types.


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [F32, BF16, F16], ids=str)
def test_alpha_beta_c_bias(rng, fmt, out_dtype):
    x, w, dy = random_linear(rng, 64, 96, 160)
    case = linear_cases(fmt, x, w, dy)["fprop"]
    m, n = 64, 160
    c = random_operand(rng, (m, n), out_dtype)
    bias = random_operand(rng, (n,), BF16)
    alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
    if out_dtype == F16:  # rows of magnitude ~30 give sums near FP16's 65504
        alpha /= 64
    r = tec.gemm_block(case.a, case.b, c=c, alpha=alpha, beta=beta, bias=bias, out_dtype=out_dtype, **case.kwargs())
    assert r.out.dtype == out_dtype and r.out.shape == (m, n)
    check(case, r, f"{fmt} epilogue", c=c, alpha=alpha, beta=beta, bias=bias, out_dtype=out_dtype)


def test_beta_zero_does_not_read_c(rng):
    x, w, dy = random_linear(rng, 32, 64, 32)
    case = linear_cases("fp8_block", x, w, dy)["fprop"]
    c = np.full((32, 32), np.nan, np.float32)
    r = tec.gemm_block(case.a, case.b, c=c, beta=0.0, **case.kwargs())
    assert np.all(np.isfinite(r.out))


# ---------------------------------------------------------------------------
# The formats of te_gemm through te_gemm_block.


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
def test_high_precision_is_te_gemm(rng, dtype):
    a = random_operand(rng, (33, 17), dtype)
    b = random_operand(rng, (65, 17), dtype)
    r = tec.gemm_block(a, b, out_dtype=dtype)
    assert r.path == "native"
    assert same_bits(r.out, tec.gemm(a, b, transb=True, out_dtype=dtype).out)


def test_per_tensor_fp8_is_te_gemm(rng):
    x = rng.standard_normal((48, 64)).astype(np.float32)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    qx = tec.quantize_fp8_current_scaling(x, "e4m3")
    qw = tec.quantize_fp8_current_scaling(w, "e4m3")
    r = tec.gemm_block(qx, qw, out_dtype=BF16)
    twin = tec.gemm(
        qx.rowwise, qw.rowwise, transb=True, a_scale_inv=qx.scale_inv, b_scale_inv=qw.scale_inv, out_dtype=BF16
    )
    assert r.path == "native" and same_bits(r.out, twin.out)


def test_plan_on_the_cpu_needs_no_workspace(rng):
    x, w, dy = random_linear(rng, 32, 64, 32)
    case = linear_cases("nvfp4", x, w, dy)["fprop"]
    assert tec.plan_gemm_block(case.a, case.b) == ("emulated", 0)
    assert tec.plan_gemm_block(x, w) == ("native", 0)


# ---------------------------------------------------------------------------
# Grouped GEMMs.


@pytest.mark.parametrize("fmt", FORMATS + ("none", "tensor"))
def test_grouped_equals_single_gemms(rng, fmt):
    shapes = [(32, 64, 96), (64, 128, 32), (96, 64, 64)]  # experts with their own token counts
    a_list, b_list, cs, alphas, betas = [], [], [], [], []
    for t, k_in, n_out in shapes:
        x, w, dy = random_linear(rng, t, k_in, n_out)
        if fmt in FORMATS:
            case = linear_cases(fmt, x, w, dy)["fprop"]
            a_list.append(case.a)
            b_list.append(case.b)
        elif fmt == "tensor":
            a_list.append(tec.quantize_fp8_current_scaling(x, "e4m3"))
            b_list.append(tec.quantize_fp8_current_scaling(w, "e4m3"))
        else:
            a_list.append(x.astype(BF16))
            b_list.append(w.astype(BF16))
        cs.append(random_operand(rng, (t, n_out), F32))
        alphas.append(float(rng.uniform(0.5, 2)))
        betas.append(float(rng.uniform(-1, 1)))
    results = tec.gemm_block_grouped(a_list, b_list, c=cs, alpha=alphas, beta=betas)
    expected_path = "native" if fmt in ("none", "tensor") else "emulated"
    for i, r in enumerate(results):
        single = tec.gemm_block(a_list[i], b_list[i], c=cs[i], alpha=alphas[i], beta=betas[i])
        assert r.path == single.path == expected_path
        assert same_bits(r.out, single.out), f"group {i}"


def test_grouped_of_nothing():
    assert tec.gemm_block_grouped([], []) == []


def test_dequantized_helper_matches_the_reference_for_fp8_block(rng):
    """The helper's FP8-block dequantization is q * scale_inv of each block."""
    x = rng.standard_normal((48, 272)).astype(np.float32)
    q = tec.quantize_fp8_block(x, block_dim=1)
    op = tec.operand(q)
    values = op.data.astype(np.float32)
    scales = np.repeat(op.scale_inv[:, :48].T, 128, axis=1)[:, :272]
    assert same_bits(dequantized(op), (values * scales).astype(np.float32))
