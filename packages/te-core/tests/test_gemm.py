"""te_gemm against float64 references: products, hostile values, edge shapes,
streams and graphs, on the CPU backend and on every backend (the `device` fixture).
Epilogues (C, bias, GELU, bias_grad, FP8 D): test_gemm_epilogues.py; errors:
test_gemm_errors.py.

The per-format error bounds and how they are derived are in transformer_engine.core.reference_gemm
(FP32 computation within (K + 4) u_32 of the magnitudes summed, then one
rounding to the output type; FP8 D between the FP8 roundings of the reference
minus and plus that bound, i.e. the rounded reference wherever the bound does
not reach a rounding boundary). Inputs are fresh random values on every run;
TE_TEST_SEED=<seed> replays a failure.
"""

from __future__ import annotations

import core_device
import gemm_device as gm
import numpy as np
import pytest
from conftest import CUDA_ONLY
from gemm_device import BF16, E4M3, E5M2, F16, F32, FP8_PAIRS, HIGH_PRECISION, TRANS

import transformer_engine.core as tec
from transformer_engine.core import lib
from transformer_engine.core._arrays import desc
from transformer_engine.core.reference_gemm import (
    U32,
    UNIT_ROUNDOFF,
    assert_close,
    is_fp8,
    random_operand,
    random_operands,
    random_scale_inv,
    reference,
)

pytestmark = pytest.mark.gemm

ODD_SHAPES = [(1, 1, 1), (5, 7, 3), (33, 65, 17)]  # (M, N, K)
FP8_SHAPES = [(16, 32, 48), (64, 48, 80)]
# Crosses every tile edge of the CPU kernel (kMC=120, kNC=512, kKC=256) and
# is large enough to run multithreaded.
BLOCKED_SHAPE = (257, 515, 263)


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
# Every backend, raw buffers on the test's device (the `device` fixture,
# gemm_device): the same float64 references and per-format bounds, plus on CUDA
# the documented CUDA terms (Hopper's FP8 tensor-core accumulation, the fused
# BIAS epilogue's rounding with a 16-bit output: gemm_device.device_reference).


# ---------------------------------------------------------------------------
# Products on the test's device.


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
@pytest.mark.parametrize("shape", gm.DEVICE_ODD_SHAPES, ids=str)
def test_device_high_precision_product(device, rng, dtype, transa, transb, shape):
    m, n, k = shape
    a, b = random_operands(rng, m, n, k, transa, transb, dtype, dtype)
    ref = reference(a, b, transa=transa, transb=transb)
    for out_dtype in {dtype, F32}:
        r = gm.device_gemm(a, b, transa=transa, transb=transb, out_dtype=out_dtype)
        assert_close(r.out, ref.out, ref.err32, f"D ({out_dtype})")


@pytest.mark.parametrize("a_dtype,b_dtype", FP8_PAIRS, ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
@pytest.mark.parametrize("shape", gm.DEVICE_FP8_SHAPES, ids=str)
@pytest.mark.parametrize("out_dtype", [F32, BF16, F16], ids=str)
def test_device_fp8_product(device, rng, a_dtype, b_dtype, transa, transb, shape, out_dtype):
    m, n, k = shape
    a, b = random_operands(rng, m, n, k, transa, transb, a_dtype, b_dtype)
    sa, sb = random_scale_inv(rng), random_scale_inv(rng, power_of_two=False)
    if out_dtype == F16:  # keep sums of ~K products of |q| ~ 64 well below 65504
        sa = np.float32(sa / 64)
    r = gm.device_gemm(a, b, transa=transa, transb=transb, a_scale_inv=sa, b_scale_inv=sb, out_dtype=out_dtype)
    ref = gm.device_reference(
        a, b, transa=transa, transb=transb, a_scale_inv=sa, b_scale_inv=sb, extra_roundings=gm.FP8_EXTRA_ROUNDINGS
    )
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("out_dtype", [F32, BF16], ids=str)
@CUDA_ONLY
def test_cuda_fp8_matches_torch_scaled_mm(device, rng, out_dtype):
    torch = pytest.importorskip("torch")
    m, n, k = 272, 528, 272
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)  # "TN": B stored [N, K]
    sa, sb = random_scale_inv(rng), random_scale_inv(rng)
    ours = gm.device_gemm(a, b, transb=True, a_scale_inv=sa, b_scale_inv=sb, out_dtype=out_dtype).out
    da, db = gm.DeviceArray.of(a), gm.DeviceArray.of(b)
    torch_out = {F32: torch.float32, BF16: torch.bfloat16}[out_dtype]
    theirs = torch._scaled_mm(
        da.typed(torch.float8_e4m3fn),
        db.typed(torch.float8_e4m3fn).t(),
        scale_a=torch.tensor(float(sa), device="cuda"),
        scale_b=torch.tensor(float(sb), device="cuda"),
        out_dtype=torch_out,
    )
    theirs = theirs.float().cpu().numpy()
    ref = gm.device_reference(a, b, transb=True, a_scale_inv=sa, b_scale_inv=sb)
    assert_close(ours, ref.out, ref.err32, "D")
    # Both are within the bound of the reference (torch._scaled_mm runs the same
    # cuBLASLt FP8 kernels, split accumulator), so within twice of it of each other.
    u = UNIT_ROUNDOFF[out_dtype]
    assert_close(ours, theirs.astype(np.float64), 2 * ref.err32 + 2 * u * np.abs(ref.out), "D vs torch._scaled_mm")


def test_device_fp8_fast_accumulation_is_close(device, rng):
    m, n, k = 256, 256, 1024
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    r = gm.device_gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0, use_split_accumulator=False)
    ref = reference(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)
    # Fast accumulation keeps fewer accumulator bits: only a loose check.
    rel = np.linalg.norm(r.out - ref.out) / np.linalg.norm(ref.out)
    assert rel < 1e-2, f"relative Frobenius error {rel:.2e}"


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_device_unaligned_pointers(device, rng, dtype):
    m, n, k = 33, 65, 17
    a, b = random_operands(rng, m, n, k, False, True, dtype, dtype)
    r = gm.device_gemm(a, b, transb=True, out_dtype=dtype, offset_bytes=dtype.itemsize)
    ref = reference(a, b, transb=True)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
def test_device_unaligned_output_through_our_epilogue(device, rng, dtype):
    """16-bit GELU runs our epilogue kernel; N % 4 == 0 but D 2 bytes off its
    alignment takes its one-element path (the aligned case is test_gelu_*)."""
    m, n, k = 33, 64, 17
    a, b = random_operands(rng, m, n, k, False, True, dtype, dtype)
    bias = random_operand(rng, (n,), dtype)
    r = gm.device_gemm(a, b, transb=True, bias=bias, gelu=True, out_dtype=dtype, offset_bytes=dtype.itemsize)
    pre = reference(a, b, transb=True, bias=bias)
    ref = reference(a, b, transb=True, bias=bias, gelu=True)
    assert_close(r.pre_gelu_out, pre.out, pre.err32, "pre_gelu_out")
    assert_close(r.out, ref.out, ref.err32, "D = gelu")


@pytest.mark.parametrize("dtype", [F32, BF16, E4M3], ids=str)
@pytest.mark.gpu_scale
def test_device_1024_cubed(device, rng, dtype):
    m = n = k = 1024
    a, b = random_operands(rng, m, n, k, False, True, dtype, dtype)
    scales = {"a_scale_inv": 0.5, "b_scale_inv": 0.25} if is_fp8(dtype) else {}
    out_dtype = BF16 if is_fp8(dtype) else dtype
    r = gm.device_gemm(a, b, transb=True, out_dtype=out_dtype, **scales)
    ref = gm.device_reference(a, b, transb=True, **scales)
    assert_close(r.out, ref.out, ref.err32, "D")


# ---------------------------------------------------------------------------
# Edge shapes, workspace, streams and graphs on the test's device.


def test_device_zero_k_and_empty_outputs(device, rng):
    c = random_operand(rng, (4, 3), F32)
    bias = random_operand(rng, (3,), F32)
    r = gm.device_gemm(
        np.empty((4, 0), np.float32), np.empty((0, 3), np.float32), c=c, beta=2.0, bias=bias, bias_grad=True
    )
    np.testing.assert_allclose(r.out, 2.0 * c + bias, rtol=1e-6)
    np.testing.assert_array_equal(r.bias_grad, np.zeros(4, np.float32))
    r = gm.device_gemm(np.empty((0, 5), np.float32), np.ones((5, 3), np.float32))
    assert r.out.shape == (0, 3)


@CUDA_ONLY
def test_cuda_workspace_size_and_check(device, rng):
    a, b = random_operands(rng, 64, 48, 80, True, False, E4M3, E4M3)  # "NT": both need a copy
    da, db = gm.DeviceArray.of(a), gm.DeviceArray.of(b)
    d = gm.DeviceArray((64, 48), BF16)
    one = gm.DeviceArray.of(np.array(1.0, np.float32))
    kw = {"a_scale_inv": one.desc(), "b_scale_inv": one.desc(), "transa": True}
    size = lib.gemm_workspace_size(da.desc(), db.desc(), d.desc(), **kw)
    assert size >= (32 << 20) + 64 * 80 + 48 * 80
    small = gm.DeviceArray((size - 1,), np.uint8)
    with pytest.raises(ValueError, match="'workspace' must hold at least"):
        lib.gemm(da.desc(), db.desc(), d.desc(), workspace=small.desc(), **kw)


@CUDA_ONLY
def test_cuda_side_stream_and_graph_capture(device, rng):
    torch = pytest.importorskip("torch")
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    ref = gm.device_reference(a, b, transb=True, a_scale_inv=0.5, b_scale_inv=0.5)
    side = torch.cuda.Stream()
    r = gm.device_gemm(a, b, transb=True, a_scale_inv=0.5, b_scale_inv=0.5, stream=side)
    assert_close(r.out, ref.out, ref.err32, "D (side stream)")

    da, db, d = gm.DeviceArray.of(a), gm.DeviceArray.of(b), gm.DeviceArray((m, n), F32)
    scale = gm.DeviceArray.of(np.array(0.5, np.float32))
    kw = {"a_scale_inv": scale.desc(), "b_scale_inv": scale.desc(), "transb": True}
    ws = gm.DeviceArray((lib.gemm_workspace_size(da.desc(), db.desc(), d.desc(), **kw),), np.uint8)

    def run(stream):
        lib.gemm(da.desc(), db.desc(), d.desc(), workspace=ws.desc(), stream=stream.cuda_stream, **kw)

    run(torch.cuda.current_stream())  # warm-up: handle and heuristic outside the capture
    core_device.sync()
    d.bytes().zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(torch.cuda.current_stream())
    graph.replay()
    assert_close(d.numpy(), ref.out, ref.err32, "D (graph replay)")


def test_bound_is_not_vacuous():
    """The FP32 term of the bound is tiny next to the values it bounds."""
    assert (17 + 4) * U32 < 2e-6


@CUDA_ONLY
def test_cuda_fp8_scales_at_unaligned_addresses(device, rng):
    """scale_inv tensors 4 bytes past a 16-byte boundary (e.g. element 1 of a stats
    tensor): cuBLASLt needs 16-byte aligned scale pointers, so the core stages them
    in the workspace; the result must equal the call with aligned scales exactly."""
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    sa, sb = np.array(0.37, np.float32), np.array(0.011, np.float32)
    da, db = gm.DeviceArray.of(a), gm.DeviceArray.of(b)
    outs = []
    for offset in (4, 0):
        scale_a, scale_b = gm.DeviceArray.of(sa, offset), gm.DeviceArray.of(sb, offset)
        d = gm.DeviceArray((m, n), BF16)
        args = dict(a_scale_inv=scale_a.desc(), b_scale_inv=scale_b.desc(), transb=True)
        size = lib.gemm_workspace_size(da.desc(), db.desc(), d.desc(), **args)
        ws = gm.DeviceArray((size,), np.uint8)
        lib.gemm(da.desc(), db.desc(), d.desc(), workspace=ws.desc(), stream=core_device.stream(), **args)
        assert (scale_a.storage.data_ptr() + scale_a.offset) % 16 == offset
        outs.append(d.numpy().astype(np.float32))
    np.testing.assert_array_equal(outs[0], outs[1])
    ref = gm.device_reference(a, b, transb=True, a_scale_inv=sa, b_scale_inv=sb, out_dtype=BF16)
    assert_close(outs[0].astype(BF16), ref.out, ref.err32, "D (unaligned scales)")
