"""te_gemm on the CUDA backend (cuBLASLt + the gemm kernels) against the same
float64 references and per-format bounds as the CPU tests (see
transformer_engine.core.reference_gemm), plus the two documented CUDA terms: Hopper's FP8
tensor-core accumulation (every GEMM with FP8 operands) and the rounding of a
fused BIAS epilogue with a 16-bit output (see `gpu_reference`). Also
torch._scaled_mm for FP8 "TN" GEMMs, CUDA graph capture and a 1024^3 check.
Every array lives in a CUDA byte buffer made by torch; descriptors carry the
element type, so no torch dtype is needed except for torch._scaled_mm.

Run on a GPU machine:  pytest -m gpu packages/te-core/tests/gpu
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transformer_engine.core as tec  # noqa: E402
from transformer_engine.core import lib  # noqa: E402
from transformer_engine.core._arrays import desc as cpu_desc  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_gpu_helpers import (  # noqa: E402
    BF16,
    E4M3,
    E5M2,
    F16,
    F32,
    FP8_EXTRA_ROUNDINGS,
    FP8_PAIRS,
    FP8_SHAPES,
    HIGH_PRECISION,
    ODD_SHAPES,
    TRANS,
    DeviceArray,
    gpu_gemm,
    gpu_reference,
)

from transformer_engine.core.reference_gemm import (  # noqa: E402
    U32,
    UNIT_ROUNDOFF,
    assert_amax_close,
    assert_close,
    assert_fp8_close,
    bias_grad_reference,
    is_fp8,
    random_operand,
    random_operands,
    random_scale_inv,
    reference,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not tec.built_with_cuda(), reason="te-core was built without CUDA"),
    pytest.mark.gemm,
]


@pytest.fixture
def rng():
    seed = secrets.randbits(64)
    print(f"gemm GPU test seed: {seed}")
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------
# Products.


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
def test_high_precision_product(rng, dtype, transa, transb, shape):
    m, n, k = shape
    a, b = random_operands(rng, m, n, k, transa, transb, dtype, dtype)
    ref = reference(a, b, transa=transa, transb=transb)
    for out_dtype in {dtype, F32}:
        r = gpu_gemm(a, b, transa=transa, transb=transb, out_dtype=out_dtype)
        assert_close(r.out, ref.out, ref.err32, f"D ({out_dtype})")


@pytest.mark.parametrize("a_dtype,b_dtype", FP8_PAIRS, ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=str)
@pytest.mark.parametrize("out_dtype", [F32, BF16, F16], ids=str)
def test_fp8_product(rng, a_dtype, b_dtype, transa, transb, shape, out_dtype):
    m, n, k = shape
    a, b = random_operands(rng, m, n, k, transa, transb, a_dtype, b_dtype)
    sa, sb = random_scale_inv(rng), random_scale_inv(rng, power_of_two=False)
    if out_dtype == F16:  # keep sums of ~K products of |q| ~ 64 well below 65504
        sa = np.float32(sa / 64)
    r = gpu_gemm(a, b, transa=transa, transb=transb, a_scale_inv=sa, b_scale_inv=sb, out_dtype=out_dtype)
    ref = gpu_reference(
        a, b, transa=transa, transb=transb, a_scale_inv=sa, b_scale_inv=sb, extra_roundings=FP8_EXTRA_ROUNDINGS
    )
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("out_dtype", [F32, BF16], ids=str)
def test_fp8_matches_torch_scaled_mm(rng, out_dtype):
    m, n, k = 272, 528, 272
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)  # "TN": B stored [N, K]
    sa, sb = random_scale_inv(rng), random_scale_inv(rng)
    ours = gpu_gemm(a, b, transb=True, a_scale_inv=sa, b_scale_inv=sb, out_dtype=out_dtype).out
    da, db = DeviceArray.of(a), DeviceArray.of(b)
    torch_out = {F32: torch.float32, BF16: torch.bfloat16}[out_dtype]
    theirs = torch._scaled_mm(
        da.typed(torch.float8_e4m3fn),
        db.typed(torch.float8_e4m3fn).t(),
        scale_a=torch.tensor(float(sa), device="cuda"),
        scale_b=torch.tensor(float(sb), device="cuda"),
        out_dtype=torch_out,
    )
    theirs = theirs.float().cpu().numpy()
    ref = gpu_reference(a, b, transb=True, a_scale_inv=sa, b_scale_inv=sb)
    assert_close(ours, ref.out, ref.err32, "D")
    # Both are within the bound of the reference (torch._scaled_mm runs the same
    # cuBLASLt FP8 kernels, split accumulator), so within twice of it of each other.
    u = UNIT_ROUNDOFF[out_dtype]
    assert_close(ours, theirs.astype(np.float64), 2 * ref.err32 + 2 * u * np.abs(ref.out), "D vs torch._scaled_mm")


def test_fp8_fast_accumulation_is_close(rng):
    m, n, k = 256, 256, 1024
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    r = gpu_gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0, use_split_accumulator=False)
    ref = reference(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)
    # Fast accumulation keeps fewer accumulator bits: only a loose check.
    rel = np.linalg.norm(r.out - ref.out) / np.linalg.norm(ref.out)
    assert rel < 1e-2, f"relative Frobenius error {rel:.2e}"


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_unaligned_pointers(rng, dtype):
    m, n, k = 33, 65, 17
    a, b = random_operands(rng, m, n, k, False, True, dtype, dtype)
    r = gpu_gemm(a, b, transb=True, out_dtype=dtype, offset_bytes=dtype.itemsize)
    ref = reference(a, b, transb=True)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
def test_unaligned_output_through_our_epilogue(rng, dtype):
    """16-bit GELU runs our epilogue kernel; N % 4 == 0 but D 2 bytes off its
    alignment takes its one-element path (the aligned case is test_gelu_*)."""
    m, n, k = 33, 64, 17
    a, b = random_operands(rng, m, n, k, False, True, dtype, dtype)
    bias = random_operand(rng, (n,), dtype)
    r = gpu_gemm(a, b, transb=True, bias=bias, gelu=True, out_dtype=dtype, offset_bytes=dtype.itemsize)
    pre = reference(a, b, transb=True, bias=bias)
    ref = reference(a, b, transb=True, bias=bias, gelu=True)
    assert_close(r.pre_gelu_out, pre.out, pre.err32, "pre_gelu_out")
    assert_close(r.out, ref.out, ref.err32, "D = gelu")


@pytest.mark.parametrize("dtype", [F32, BF16, E4M3], ids=str)
def test_1024_cubed(rng, dtype):
    m = n = k = 1024
    a, b = random_operands(rng, m, n, k, False, True, dtype, dtype)
    scales = {"a_scale_inv": 0.5, "b_scale_inv": 0.25} if is_fp8(dtype) else {}
    out_dtype = BF16 if is_fp8(dtype) else dtype
    r = gpu_gemm(a, b, transb=True, out_dtype=out_dtype, **scales)
    ref = gpu_reference(a, b, transb=True, **scales)
    assert_close(r.out, ref.out, ref.err32, "D")


# ---------------------------------------------------------------------------
# alpha, beta, C; bias; GELU; bias_grad (fused in cuBLASLt or our kernels).


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
def test_alpha_beta_c(rng, dtype, transa, transb):
    m, n, k = 33, 65, 17
    a, b = random_operands(rng, m, n, k, transa, transb, dtype, dtype)
    c = random_operand(rng, (m, n), dtype)
    alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
    ref = reference(a, b, transa=transa, transb=transb, c=c, alpha=alpha, beta=beta)
    for in_place in (False, True):
        r = gpu_gemm(
            a, b, transa=transa, transb=transb, c=c, alpha=alpha, beta=beta, out_dtype=dtype, c_in_place=in_place
        )
        assert_close(r.out, ref.out, ref.err32, f"D (C in place: {in_place})")


@pytest.mark.parametrize("out_dtype", [F32, BF16, F16], ids=str)
@pytest.mark.parametrize("transa,transb", TRANS)
def test_fp8_inputs_accumulate_into_c(rng, out_dtype, transa, transb):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, transa, transb, E4M3, E5M2)
    c = random_operand(rng, (m, n), out_dtype)
    r = gpu_gemm(
        a, b, transa=transa, transb=transb, a_scale_inv=0.5, b_scale_inv=2.0, c=c, beta=1.0, out_dtype=out_dtype
    )
    ref = gpu_reference(
        a, b, transa=transa, transb=transb, a_scale_inv=0.5, b_scale_inv=2.0, c=c, beta=1.0, out_dtype=out_dtype
    )
    assert_close(r.out, ref.out, ref.err32, "D")


def test_beta_zero_does_not_read_c(rng):
    a, b = random_operands(rng, 33, 65, 17, False, False, F32, F32)
    r = gpu_gemm(a, b, c=np.full((33, 65), np.nan, np.float32), beta=0.0)
    assert np.all(np.isfinite(r.out))


@pytest.mark.parametrize("in_dtype", [F32, BF16, E4M3], ids=str)
@pytest.mark.parametrize("out_dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("bias_dtype", HIGH_PRECISION, ids=str)
def test_bias(rng, in_dtype, out_dtype, bias_dtype):
    m, n, k = (64, 48, 80) if is_fp8(in_dtype) else (33, 65, 17)
    a, b = random_operands(rng, m, n, k, False, True, in_dtype, in_dtype)
    scales = {"a_scale_inv": 0.5, "b_scale_inv": 0.5} if is_fp8(in_dtype) else {}
    bias = random_operand(rng, (n,), bias_dtype)
    r = gpu_gemm(a, b, transb=True, bias=bias, out_dtype=out_dtype, **scales)
    ref = gpu_reference(a, b, transb=True, bias=bias, out_dtype=out_dtype, **scales)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("dtype", HIGH_PRECISION + [E4M3], ids=str)
@pytest.mark.parametrize("n", [64, 65])  # 64: fused GELU_AUX for FP32 (N % 8 == 0); else our kernel
@pytest.mark.parametrize("with_bias", [False, True])
def test_gelu_stores_pre_activation(rng, dtype, n, with_bias):
    if is_fp8(dtype) and n % 16:
        pytest.skip("FP8 needs N % 16 == 0")
    m, k = (64, 80) if is_fp8(dtype) else (33, 17)
    a, b = random_operands(rng, m, n, k, False, True, dtype, dtype)
    scales = {"a_scale_inv": 0.5, "b_scale_inv": 0.25} if is_fp8(dtype) else {}
    out_dtype = BF16 if is_fp8(dtype) else dtype
    bias = random_operand(rng, (n,), out_dtype) if with_bias else None
    r = gpu_gemm(a, b, transb=True, bias=bias, gelu=True, out_dtype=out_dtype, **scales)
    ref = gpu_reference(a, b, transb=True, bias=bias, gelu=True, out_dtype=out_dtype, **scales)
    # pre_gelu_out comes from the GELU plan (fused for FP32, else our kernel), never from a
    # BIAS-only epilogue: no fused-bias rounding term.
    pre = reference(a, b, transb=True, bias=bias, tensor_core_fp8=True, **scales)
    assert_close(r.pre_gelu_out, pre.out, pre.err32, "pre_gelu_out")
    assert_close(r.out, ref.out, ref.err32, "D = gelu")


@pytest.mark.parametrize("dtype", HIGH_PRECISION, ids=str)
@pytest.mark.parametrize("transa", [False, True])  # A [K, M] (the wgrad layout) or [M, K]
@pytest.mark.parametrize("grad_dtype", [None, F32], ids=str)
def test_bias_grad(rng, dtype, transa, grad_dtype):
    m, n, k = 40, 64, 96
    a, b = random_operands(rng, m, n, k, transa, False, dtype, dtype)
    r = gpu_gemm(a, b, transa=transa, bias_grad=True, out_dtype=dtype, bias_grad_dtype=grad_dtype)
    expected, err = bias_grad_reference(a, transa=transa)
    assert_close(r.bias_grad, expected, err, "bias_grad")
    ref = reference(a, b, transa=transa)
    assert_close(r.out, ref.out, ref.err32, "D")


@pytest.mark.parametrize("transa", [False, True])
def test_fp8_bias_grad(rng, transa):
    m, n, k = 64, 48, 4096  # long K: many partial sums per output
    a, b = random_operands(rng, m, n, k, transa, False, E5M2, E4M3)
    r = gpu_gemm(a, b, transa=transa, a_scale_inv=0.5, b_scale_inv=1.0, bias_grad=True, bias_grad_dtype=F32)
    expected, err = bias_grad_reference(a, 0.5, transa=transa)
    assert_close(r.bias_grad, expected, err, "bias_grad")


@pytest.mark.parametrize("dtype", HIGH_PRECISION + [E4M3], ids=str)
@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("shape", [(37, 16, 5000), (48, 32, 8208), (64, 16, 100)], ids=str)
@pytest.mark.parametrize("offset", [0, 1])  # 1: A one element off 16 bytes (scalar loads)
def test_bias_grad_parts_and_layouts(rng, dtype, transa, shape, offset):
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
        r = gpu_gemm(
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
def test_bias_grad_with_empty_output(rng, transa):
    m, k = 40, 3000
    a = random_operand(rng, (k, m) if transa else (m, k), BF16)
    b = np.empty((k, 0), BF16)
    r = gpu_gemm(a, b, transa=transa, bias_grad=True, out_dtype=BF16)
    assert r.out.shape == (m, 0)
    expected, err = bias_grad_reference(a, transa=transa)
    assert_close(r.bias_grad, expected, err, "bias_grad")


# ---------------------------------------------------------------------------
# FP8 output.


@pytest.mark.parametrize("a_dtype,b_dtype", FP8_PAIRS, ids=str)
@pytest.mark.parametrize("d_dtype", [E4M3, E5M2], ids=str)  # E5M2 from E4M3 x E4M3: our kernel
@pytest.mark.parametrize("transa,transb", TRANS)
def test_fp8_output(rng, a_dtype, b_dtype, d_dtype, transa, transb):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, transa, transb, a_dtype, b_dtype)
    d_scale = float(rng.uniform(0.5, 4.0))
    r = gpu_gemm(
        a, b, transa=transa, transb=transb, a_scale_inv=0.125, b_scale_inv=0.5, out_dtype=d_dtype, d_scale=d_scale
    )
    ref = gpu_reference(
        a,
        b,
        transa=transa,
        transb=transb,
        a_scale_inv=0.125,
        b_scale_inv=0.5,
        extra_roundings=FP8_EXTRA_ROUNDINGS,
        out_dtype=d_dtype,
    )
    assert_fp8_close(r.out, ref, d_scale)
    assert_amax_close(r.amax, ref)


@pytest.mark.parametrize("c_dtype", [None, BF16, F32], ids=str)
@pytest.mark.parametrize("bias_dtype", [None, BF16, F16, F32], ids=str)
@pytest.mark.parametrize("gelu", [False, True])
def test_fp8_output_epilogues(rng, c_dtype, bias_dtype, gelu):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    c = None if c_dtype is None else random_operand(rng, (m, n), c_dtype)
    bias = None if bias_dtype is None else random_operand(rng, (n,), bias_dtype)
    beta = 0.5 if c is not None else 0.0
    kwargs = {"transb": True, "a_scale_inv": 0.25, "b_scale_inv": 0.25, "c": c, "beta": beta, "bias": bias}
    r = gpu_gemm(a, b, gelu=gelu, out_dtype=E4M3, d_scale=2.0, **kwargs)
    ref = gpu_reference(a, b, gelu=gelu, out_dtype=E4M3, **kwargs)
    assert_fp8_close(r.out, ref, 2.0)
    assert_amax_close(r.amax, ref)


def test_d_amax_is_max_accumulated(rng):
    a, b = random_operands(rng, 64, 48, 80, False, True, E4M3, E4M3)
    for gelu in (False, True):  # fused (cuBLASLt amax + our combine) and our epilogue kernel
        ref = gpu_reference(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0, gelu=gelu, out_dtype=E4M3)
        for start in (0.0, 1e9):
            r = gpu_gemm(
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


# ---------------------------------------------------------------------------
# Edge shapes, workspace, streams and graphs.


def test_zero_k_and_empty_outputs(rng):
    c = random_operand(rng, (4, 3), F32)
    bias = random_operand(rng, (3,), F32)
    r = gpu_gemm(np.empty((4, 0), np.float32), np.empty((0, 3), np.float32), c=c, beta=2.0, bias=bias, bias_grad=True)
    np.testing.assert_allclose(r.out, 2.0 * c + bias, rtol=1e-6)
    np.testing.assert_array_equal(r.bias_grad, np.zeros(4, np.float32))
    r = gpu_gemm(np.empty((0, 5), np.float32), np.ones((5, 3), np.float32))
    assert r.out.shape == (0, 3)


def test_workspace_size_and_check(rng):
    a, b = random_operands(rng, 64, 48, 80, True, False, E4M3, E4M3)  # "NT": both need a copy
    da, db = DeviceArray.of(a), DeviceArray.of(b)
    d = DeviceArray((64, 48), BF16)
    one = DeviceArray.of(np.array(1.0, np.float32))
    kw = {"a_scale_inv": one.desc(), "b_scale_inv": one.desc(), "transa": True}
    size = lib.gemm_workspace_size(da.desc(), db.desc(), d.desc(), **kw)
    assert size >= (32 << 20) + 64 * 80 + 48 * 80
    small = DeviceArray((size - 1,), np.uint8)
    with pytest.raises(ValueError, match="'workspace' must hold at least"):
        lib.gemm(da.desc(), db.desc(), d.desc(), workspace=small.desc(), **kw)


def test_side_stream_and_graph_capture(rng):
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    ref = gpu_reference(a, b, transb=True, a_scale_inv=0.5, b_scale_inv=0.5)
    side = torch.cuda.Stream()
    r = gpu_gemm(a, b, transb=True, a_scale_inv=0.5, b_scale_inv=0.5, stream=side)
    assert_close(r.out, ref.out, ref.err32, "D (side stream)")

    da, db, d = DeviceArray.of(a), DeviceArray.of(b), DeviceArray((m, n), F32)
    scale = DeviceArray.of(np.array(0.5, np.float32))
    kw = {"a_scale_inv": scale.desc(), "b_scale_inv": scale.desc(), "transb": True}
    ws = DeviceArray((lib.gemm_workspace_size(da.desc(), db.desc(), d.desc(), **kw),), np.uint8)

    def run(stream):
        lib.gemm(da.desc(), db.desc(), d.desc(), workspace=ws.desc(), stream=stream.cuda_stream, **kw)

    run(torch.cuda.current_stream())  # warm-up: handle and heuristic outside the capture
    torch.cuda.synchronize()
    d.bytes().zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(torch.cuda.current_stream())
    graph.replay()
    assert_close(d.numpy(), ref.out, ref.err32, "D (graph replay)")


def test_errors_match_the_cpu(rng):
    a, b = random_operands(rng, 100, 64, 48, False, True, E4M3, E4M3)
    with pytest.raises(ValueError, match="pad the tensors to a multiple of 16"):
        gpu_gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)
    x = random_operand(rng, (16, 16), E5M2)
    with pytest.raises(TypeError, match="cannot both be float8_e5m2"):
        gpu_gemm(x, x, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)
    host = np.ones((2, 2), np.float32)
    gpu = DeviceArray((2, 2), F32)
    with pytest.raises(ValueError, match="must be on the device of 'a'"):
        lib.gemm(cpu_desc(host), gpu.desc(), gpu.desc())


def test_bound_is_not_vacuous():
    """The FP32 term of the bound is tiny next to the values it bounds."""
    assert (17 + 4) * U32 < 2e-6


def test_fp8_scales_at_unaligned_addresses(rng):
    """scale_inv tensors 4 bytes past a 16-byte boundary (e.g. element 1 of a stats
    tensor): cuBLASLt needs 16-byte aligned scale pointers, so the core stages them
    in the workspace; the result must equal the call with aligned scales exactly."""
    m, n, k = 64, 48, 80
    a, b = random_operands(rng, m, n, k, False, True, E4M3, E4M3)
    sa, sb = np.array(0.37, np.float32), np.array(0.011, np.float32)
    da, db = DeviceArray.of(a), DeviceArray.of(b)
    outs = []
    for offset in (4, 0):
        scale_a, scale_b = DeviceArray.of(sa, offset), DeviceArray.of(sb, offset)
        d = DeviceArray((m, n), BF16)
        args = dict(a_scale_inv=scale_a.desc(), b_scale_inv=scale_b.desc(), transb=True)
        size = lib.gemm_workspace_size(da.desc(), db.desc(), d.desc(), **args)
        ws = DeviceArray((size,), np.uint8)
        lib.gemm(
            da.desc(), db.desc(), d.desc(), workspace=ws.desc(), stream=torch.cuda.current_stream().cuda_stream, **args
        )
        assert (scale_a.storage.data_ptr() + scale_a.offset) % 16 == offset
        outs.append(d.numpy().astype(np.float32))
    np.testing.assert_array_equal(outs[0], outs[1])
    ref = gpu_reference(a, b, transb=True, a_scale_inv=sa, b_scale_inv=sb, out_dtype=BF16)
    assert_close(outs[0].astype(BF16), ref.out, ref.err32, "D (unaligned scales)")
