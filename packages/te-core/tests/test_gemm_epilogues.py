"""te_gemm's epilogues against float64 references: alpha, beta and C, bias,
GELU (with its pre-activation), bias_grad, and FP8 D with its amax, on the CPU
backend and on every backend (the `device` fixture; the bounds are those of
transformer_engine.core.reference_gemm, see test_gemm.py)."""

from __future__ import annotations

import gemm_device as gm
import numpy as np
import pytest
from gemm_device import BF16, E4M3, E5M2, F16, F32, FP8_PAIRS, HIGH_PRECISION, TRANS

import transformer_engine.core as tec
from transformer_engine.core import lib
from transformer_engine.core._arrays import desc
from transformer_engine.core.reference_gemm import (
    assert_amax_close,
    assert_close,
    assert_fp8_close,
    bias_grad_reference,
    is_fp8,
    random_operand,
    random_operands,
    reference,
)

pytestmark = pytest.mark.gemm


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
# Every backend, raw buffers on the test's device (the `device` fixture,
# gemm_device): the same float64 references and per-format bounds, plus on CUDA
# the documented CUDA terms (Hopper's FP8 tensor-core accumulation, the fused
# BIAS epilogue's rounding with a 16-bit output: gemm_device.device_reference).


# ---------------------------------------------------------------------------
# alpha, beta, C; bias; GELU; bias_grad on the test's device (CUDA: fused in cuBLASLt or our kernels).


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
def test_device_alpha_beta_c(device, rng, dtype, transa, transb):
    m, n, k = 33, 65, 17
    a, b = random_operands(rng, m, n, k, transa, transb, dtype, dtype)
    c = random_operand(rng, (m, n), dtype)
    alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
    ref = reference(a, b, transa=transa, transb=transb, c=c, alpha=alpha, beta=beta)
    for in_place in (False, True):
        r = gm.device_gemm(
            a, b, transa=transa, transb=transb, c=c, alpha=alpha, beta=beta, out_dtype=dtype, c_in_place=in_place
        )
        assert_close(r.out, ref.out, ref.err32, f"D (C in place: {in_place})")


@pytest.mark.parametrize("out_dtype", [F32, BF16, F16], ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
def test_device_fp8_inputs_accumulate_into_c(device, rng, out_dtype, transa, transb):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, transa, transb, E4M3, E5M2)
    c = random_operand(rng, (m, n), out_dtype)
    r = gm.device_gemm(
        a, b, transa=transa, transb=transb, a_scale_inv=0.5, b_scale_inv=2.0, c=c, beta=1.0, out_dtype=out_dtype
    )
    ref = gm.device_reference(
        a, b, transa=transa, transb=transb, a_scale_inv=0.5, b_scale_inv=2.0, c=c, beta=1.0, out_dtype=out_dtype
    )
    assert_close(r.out, ref.out, ref.err32, "D")


def test_device_beta_zero_does_not_read_c(device, rng):
    a, b = random_operands(rng, 33, 65, 17, False, False, F32, F32)
    r = gm.device_gemm(a, b, c=np.full((33, 65), np.nan, np.float32), beta=0.0)
    assert np.all(np.isfinite(r.out))


@pytest.mark.parametrize("in_dtype", [F32, BF16, E4M3], ids=str)
@pytest.mark.parametrize("out_dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("bias_dtype", HIGH_PRECISION, ids=str)
def test_device_bias(device, rng, in_dtype, out_dtype, bias_dtype):
    m, n, k = (64, 48, 80) if is_fp8(in_dtype) else (33, 65, 17)
    a, b = random_operands(rng, m, n, k, False, True, in_dtype, in_dtype)
    scales = {"a_scale_inv": 0.5, "b_scale_inv": 0.5} if is_fp8(in_dtype) else {}
    bias = random_operand(rng, (n,), bias_dtype)
    r = gm.device_gemm(a, b, transb=True, bias=bias, out_dtype=out_dtype, **scales)
    ref = gm.device_reference(a, b, transb=True, bias=bias, out_dtype=out_dtype, **scales)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("dtype", HIGH_PRECISION + [E4M3], ids=str)
@pytest.mark.parametrize("n", [64, 65])  # 64: fused GELU_AUX for FP32 (N % 8 == 0); else our kernel
@pytest.mark.parametrize("with_bias", [False, True])
def test_device_gelu_stores_pre_activation(device, rng, dtype, n, with_bias):
    if is_fp8(dtype) and n % 16:
        pytest.skip("FP8 needs N % 16 == 0")
    m, k = (64, 80) if is_fp8(dtype) else (33, 17)
    a, b = random_operands(rng, m, n, k, False, True, dtype, dtype)
    scales = {"a_scale_inv": 0.5, "b_scale_inv": 0.25} if is_fp8(dtype) else {}
    out_dtype = BF16 if is_fp8(dtype) else dtype
    bias = random_operand(rng, (n,), out_dtype) if with_bias else None
    r = gm.device_gemm(a, b, transb=True, bias=bias, gelu=True, out_dtype=out_dtype, **scales)
    ref = gm.device_reference(a, b, transb=True, bias=bias, gelu=True, out_dtype=out_dtype, **scales)
    # pre_gelu_out comes from the GELU plan (fused for FP32, else our kernel), never from a
    # BIAS-only epilogue: no fused-bias rounding term.
    pre = reference(a, b, transb=True, bias=bias, tensor_core_fp8=True, **scales)
    assert_close(r.pre_gelu_out, pre.out, pre.err32, "pre_gelu_out")
    assert_close(r.out, ref.out, ref.err32, "D = gelu")


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("transa", [False, True])  # A [K, M] (the wgrad layout) or [M, K]
@pytest.mark.parametrize("grad_dtype", [None, F32], ids=str)
def test_device_bias_grad(device, rng, dtype, transa, grad_dtype):
    m, n, k = 40, 64, 96
    a, b = random_operands(rng, m, n, k, transa, False, dtype, dtype)
    r = gm.device_gemm(a, b, transa=transa, bias_grad=True, out_dtype=dtype, bias_grad_dtype=grad_dtype)
    expected, err = bias_grad_reference(a, transa=transa)
    assert_close(r.bias_grad, expected, err, "bias_grad")
    ref = reference(a, b, transa=transa)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("transa", [False, True])
def test_device_fp8_bias_grad(device, rng, transa):
    m, n, k = 64, 48, 4096  # long K: many partial sums per output
    a, b = random_operands(rng, m, n, k, transa, False, E5M2, E4M3)
    r = gm.device_gemm(a, b, transa=transa, a_scale_inv=0.5, b_scale_inv=1.0, bias_grad=True, bias_grad_dtype=F32)
    expected, err = bias_grad_reference(a, 0.5, transa=transa)
    assert_close(r.bias_grad, expected, err, "bias_grad")


@pytest.mark.parametrize("dtype", HIGH_PRECISION + [E4M3], ids=str)
@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("shape", [(37, 16, 5000), (48, 32, 8208), (64, 16, 100)], ids=str)
@pytest.mark.parametrize("offset", [0, 1])  # 1: A one element off 16 bytes (scalar loads)
def test_device_bias_grad_parts_and_layouts(device, rng, dtype, transa, shape, offset):
    """The bias_grad kernels' paths: K cut into several parts or one, 16-byte
    vectors or single elements (row or column length not a multiple of the
    vector, or A misaligned), A stored [K, M] or [M, K], any output type."""
    m, n, k = shape
    if is_fp8(dtype) and (m % 16 or k % 16 or offset):
        pytest.skip("FP8 GEMMs need multiples of 16 and 16-byte aligned operands")
    a, b = random_operands(rng, m, n, k, transa, False, dtype, dtype)
    scales = {"a_scale_inv": 0.75, "b_scale_inv": 0.5} if is_fp8(dtype) else {}
    out_dtype = F32 if is_fp8(dtype) else dtype  # offset_bytes moves D too: D of A's type
    for grad_dtype in (F32, BF16):
        r = gm.device_gemm(
            a,
            b,
            transa=transa,
            bias_grad=True,
            bias_grad_dtype=grad_dtype,
            out_dtype=out_dtype,
            offset_bytes=offset * dtype.itemsize,
            **scales,
        )
        expected, err = bias_grad_reference(a, scales.get("a_scale_inv"), transa=transa)
        assert_close(r.bias_grad, expected, err, f"bias_grad ({grad_dtype})")


@pytest.mark.parametrize("transa", [False, True])
def test_device_bias_grad_with_empty_output(device, rng, transa):
    m, k = 40, 3000
    a = random_operand(rng, (k, m) if transa else (m, k), BF16)
    b = np.empty((k, 0), BF16)
    r = gm.device_gemm(a, b, transa=transa, bias_grad=True, out_dtype=BF16)
    assert r.out.shape == (m, 0)
    expected, err = bias_grad_reference(a, transa=transa)
    assert_close(r.bias_grad, expected, err, "bias_grad")


# ---------------------------------------------------------------------------
# FP8 output on the test's device.


@pytest.mark.parametrize("a_dtype,b_dtype", FP8_PAIRS, ids=str)
@pytest.mark.parametrize("d_dtype", [E4M3, E5M2], ids=str)  # E5M2 from E4M3 x E4M3: our kernel
@pytest.mark.parametrize("transa,transb", TRANS)
def test_device_fp8_output(device, rng, a_dtype, b_dtype, d_dtype, transa, transb):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, transa, transb, a_dtype, b_dtype)
    d_scale = float(rng.uniform(0.5, 4.0))
    r = gm.device_gemm(
        a, b, transa=transa, transb=transb, a_scale_inv=0.125, b_scale_inv=0.5, out_dtype=d_dtype, d_scale=d_scale
    )
    ref = gm.device_reference(
        a,
        b,
        transa=transa,
        transb=transb,
        a_scale_inv=0.125,
        b_scale_inv=0.5,
        extra_roundings=gm.FP8_EXTRA_ROUNDINGS,
        out_dtype=d_dtype,
    )
    assert_fp8_close(r.out, ref, d_scale)
    assert_amax_close(r.amax, ref)


@pytest.mark.parametrize("c_dtype", [None, BF16, F32], ids=str)
@pytest.mark.parametrize("bias_dtype", [None, BF16, F16, F32], ids=str)
@pytest.mark.parametrize("gelu", [False, True])
def test_device_fp8_output_epilogues(device, rng, c_dtype, bias_dtype, gelu):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    c = None if c_dtype is None else random_operand(rng, (m, n), c_dtype)
    bias = None if bias_dtype is None else random_operand(rng, (n,), bias_dtype)
    beta = 0.5 if c is not None else 0.0
    kwargs = {"transb": True, "a_scale_inv": 0.25, "b_scale_inv": 0.25, "c": c, "beta": beta, "bias": bias}
    r = gm.device_gemm(a, b, gelu=gelu, out_dtype=E4M3, d_scale=2.0, **kwargs)
    ref = gm.device_reference(a, b, gelu=gelu, out_dtype=E4M3, **kwargs)
    assert_fp8_close(r.out, ref, 2.0)
    assert_amax_close(r.amax, ref)


def test_device_d_amax_is_max_accumulated(device, rng):
    a, b = random_operands(rng, 64, 48, 80, False, True, E4M3, E4M3)
    for gelu in (False, True):  # fused (cuBLASLt amax + our combine) and our epilogue kernel
        ref = gm.device_reference(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0, gelu=gelu, out_dtype=E4M3)
        for start in (0.0, 1e9):
            r = gm.device_gemm(
                a,
                b,
                transb=True,
                a_scale_inv=1.0,
                b_scale_inv=1.0,
                out_dtype=E4M3,
                d_scale=1.0,
                amax_start=start,
                gelu=gelu,
            )
            assert_amax_close(r.amax, ref, start)
