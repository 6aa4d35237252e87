"""te_gemm_block rejects bad input with a message naming the argument and the rule."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from gemm_block_cases import linear_cases, random_linear

import transformer_engine.core as tec
from transformer_engine.core import BlockOperand, lib
from transformer_engine.core._arrays import desc
from transformer_engine.core.gemm_block import _prepare
from transformer_engine.core.testing.seeds import draw_seed

pytestmark = pytest.mark.gemm_block


@pytest.fixture
def cases():
    rng = np.random.default_rng(draw_seed())
    x, w, dy = random_linear(rng, 32, 64, 96)
    return {fmt: linear_cases(fmt, x, w, dy) for fmt in ("fp8_block", "mxfp8", "nvfp4")}


def test_fp8_block_needs_the_tn_form(cases):
    case = cases["fp8_block"]["fprop"]
    with pytest.raises(
        ValueError,
        match=r"FP8 block \(1x128\) GEMMs take the TN form only .* "
        r"got transa = 1; pass the columnwise copy of 'a'",
    ):
        tec.gemm_block(case.a, case.b, transa=True)


def test_nvfp4_needs_the_tn_form(cases):
    case = cases["nvfp4"]["fprop"]
    with pytest.raises(ValueError, match="NVFP4 GEMMs take the TN form only .* got transb = 0"):
        tec.gemm_block(case.a, case.b, transb=False)


def test_operands_from_one_family(cases):
    with pytest.raises(
        ValueError, match="operands 'a' and 'b' must use one family of scaling, got FP8 block \\(1x128\\) and MXFP8"
    ):
        tec.gemm_block(cases["fp8_block"]["fprop"].a, cases["mxfp8"]["fprop"].b)


def test_block_scales_are_required(cases):
    a = cases["mxfp8"]["fprop"].a._replace(scale_inv=None)
    with pytest.raises(ValueError, match="argument 'a_scale_inv' is required for MXFP8 operands"):
        tec.gemm_block(a, cases["mxfp8"]["fprop"].b)


def test_scale_shape_is_checked(cases):
    case = cases["fp8_block"]["fprop"]
    b = case.b._replace(scale_inv=case.b.scale_inv[:, :1].copy())
    with pytest.raises(
        ValueError,
        match=r"argument 'b_scale_inv' must have shape \[1, 96\] "
        r"\(FP32 GEMM-ready 1-D scales of 'b' stored as \[96, 64\]\)",
    ):
        tec.gemm_block(case.a, b)


def test_scale_type_is_checked(cases):
    case = cases["nvfp4"]["fprop"]
    a = case.a._replace(scale_inv=case.a.scale_inv.view(np.uint8))
    with pytest.raises(TypeError, match="argument 'a_scale_inv' must be float8_e4m3, got byte"):
        tec.gemm_block(a, case.b)


def test_nvfp4_needs_its_amax(cases):
    case = cases["nvfp4"]["fprop"]
    with pytest.raises(ValueError, match="argument 'b_amax' is required for NVFP4 operands"):
        tec.gemm_block(case.a, case.b._replace(amax=None))


def test_amax_only_for_nvfp4(cases):
    case = cases["mxfp8"]["fprop"]
    with pytest.raises(ValueError, match="argument 'a_amax' is only for NVFP4 operands"):
        tec.gemm_block(case.a._replace(amax=np.float32(1)), case.b, transb=case.transb)


def test_swizzled_flag_only_for_mxfp8_and_nvfp4(cases):
    case = cases["fp8_block"]["fprop"]
    with pytest.raises(ValueError, match="'a.swizzled_scales' is only for MXFP8 and NVFP4"):
        tec.gemm_block(case.a._replace(swizzled_scales=True), case.b)


def test_mxfp8_columnwise_rows(cases):
    q = tec.quantize_mxfp8(np.ones((32, 64), np.float32), rowwise=True, columnwise=True)
    a = tec.operand(q, columnwise=True)
    bad = a._replace(data=a.data[:16].copy())  # 16 rows: not whole 32x1 blocks
    with pytest.raises(ValueError, match="MXFP8 columnwise \\(32x1\\) blocks need the rows of 'a'"):
        tec.gemm_block(bad, tec.operand(q), transa=True)


def test_last_dimension_rule(cases):
    op = BlockOperand(
        np.zeros((32, 40), ml_dtypes.float8_e4m3fn), "mxfp8", np.zeros((128, 4), ml_dtypes.float8_e8m0fnu)
    )
    with pytest.raises(ValueError, match="MXFP8 needs the last dimension of 'a' divisible by 32, got 40"):
        tec.gemm_block(op, op)


def test_inner_dimensions_must_agree(cases):
    case = cases["fp8_block"]["fprop"]
    with pytest.raises(ValueError, match="inner dimensions differ"):
        tec.gemm_block(case.a, cases["fp8_block"]["dgrad"].b)


def test_output_must_be_high_precision(cases):
    case = cases["fp8_block"]["fprop"]
    with pytest.raises(
        TypeError, match="argument 'd' must be float32, bfloat16 or float16 \\(te_gemm_block writes high precision\\)"
    ):
        tec.gemm_block(case.a, case.b, out_dtype=ml_dtypes.float8_e4m3fn)


def test_declared_scaling_must_match_the_data():
    fp8 = np.zeros((16, 16), ml_dtypes.float8_e4m3fn)
    with pytest.raises(
        TypeError, match="argument 'a' must be float32, bfloat16 or float16 \\(TE_SCALING_NONE\\), got float8_e4m3"
    ):
        tec.gemm_block(BlockOperand(fp8, "none"), np.zeros((16, 16), np.float32))


def test_unknown_scaling_value():
    x = np.zeros((16, 16), np.float32)
    a = lib.GemmOperandDesc(desc(x), 9)
    params = lib.GemmBlockParams(a, a, desc(np.zeros((16, 16), np.float32)))
    with pytest.raises(ValueError, match="argument 'a.scaling' must be a te_scaling_mode \\(0 to 5\\), got 9"):
        lib.gemm_block(params)


def test_c_is_required_with_beta(cases):
    case = cases["fp8_block"]["fprop"]
    with pytest.raises(ValueError, match="argument 'beta' is 0.5 but 'c' is NULL"):
        tec.gemm_block(case.a, case.b, beta=0.5)


def test_grouped_names_the_group(cases):
    good, bad = cases["fp8_block"]["fprop"], cases["fp8_block"]["dgrad"]
    with pytest.raises(ValueError, match="te_gemm_block_grouped: group 1: inner dimensions differ"):
        tec.gemm_block_grouped([good.a, good.a], [good.b, bad.b])


def test_grouped_groups_share_formats(cases):
    fp8, mx = cases["fp8_block"]["fprop"], cases["mxfp8"]["fprop"]
    with pytest.raises(
        ValueError, match="group 1: a.scaling differs from group 0's; the groups of a grouped GEMM share"
    ):
        tec.gemm_block_grouped([fp8.a, mx.a], [fp8.b, mx.b])


def test_grouped_groups_share_output_type(cases):
    case = cases["fp8_block"]["fprop"]
    g0 = _prepare(case.a, case.b)
    g1 = _prepare(case.a, case.b, out_dtype=ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="group 1: the type of 'd' differs from group 0's"):
        lib.gemm_block_grouped([g0.params, g1.params])


def test_grouped_lists_must_match():
    with pytest.raises(ValueError, match="must list the same number of groups"):
        tec.gemm_block_grouped([np.zeros((2, 2), np.float32)], [])


def test_cuda_operands_without_cuda_backend():
    if tec.built_with_cuda():
        pytest.skip("this build has the CUDA backend")
    x = np.zeros((16, 16), np.float32)
    cuda = lib.TensorDesc(x.ctypes.data, int(tec.DType.kFloat32), [16, 16], 1, 0)
    a = lib.GemmOperandDesc(cuda, 0)
    params = lib.GemmBlockParams(a, a, lib.TensorDesc(x.ctypes.data, int(tec.DType.kFloat32), [16, 16], 1, 0))
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match="CUDA"):
        lib.gemm_block_plan(params)
