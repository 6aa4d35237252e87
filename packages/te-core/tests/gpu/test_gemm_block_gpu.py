"""te_gemm_block on the CUDA backend.

* Emulated paths (every block format; the only path for MXFP8 and NVFP4 below
  compute capability 10): D must be bit for bit te_gemm on the GPU applied to
  the operands dequantized to BF16. Both run the same cuBLASLt configuration
  (shapes, types, 256-byte-or-better alignments, 32 MiB cuBLASLt workspace),
  so cuBLASLt picks the same algorithm. D must also lie within the FP32 GEMM
  bound of the float64 product of those BF16 operands.
* Native FP8 block scaling (compute capability 9.x, cuBLASLt >= 12.9): the plan
  must say native for the Linear GEMMs (1-D x 2-D, 1-D x 1-D) of aligned
  shapes, and D must lie within the bound of the float64 product of the exact
  FP32 dequantized operands with te_gemm's Hopper FP8 tensor-core model
  (reference_gemm.py; the block scales add <= 2 FP32 roundings per block
  term, inside extra_roundings = 4) and the fused-BIAS rounding of a 16-bit D.
  It is compared with the emulated path through those bounds.
* Native MXFP8 / NVFP4 (compute capability 10.x only, skipped elsewhere): the
  same bound with the same accumulator model, unverified on such a GPU.
* Grouped GEMMs equal their single GEMMs; CUDA graph capture replays the
  native path.
Operands are quantized by the CPU quantizers (whose bytes equal the CUDA
quantizers', tests/gpu/test_*_gpu.py) and copied to the device.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transformer_engine.core as tec  # noqa: E402
from transformer_engine.core import DType, lib  # noqa: E402
from transformer_engine.core.gemm_block import PATHS, SCALING  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gemm_block_cases import (  # noqa: E402
    FORMATS,
    Case,
    dequantized,
    linear_cases,
    random_linear,
    same_bits,
)

from transformer_engine.core.reference_gemm import assert_close, random_operand, reference  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not tec.built_with_cuda(), reason="te-core was built without CUDA"),
    pytest.mark.gemm_block,
]

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
# cuBLASLt applies block scales to partial sums (module docstring).
BLOCK_EXTRA_ROUNDINGS = 4
# (T, In, Out): all multiples of 128 (whole blocks), then K = In or T not.
ALIGNED_SHAPES = [(256, 384, 512), (128, 1024, 256)]
ODD_SHAPES = [(160, 288, 96), (96, 160, 224)]


def major() -> int:
    return torch.cuda.get_device_capability()[0]


@pytest.fixture
def rng():
    seed = secrets.randbits(64)
    print(f"gemm_block GPU test seed: {seed}")
    return np.random.default_rng(seed)


class Dev:
    """A host array's bytes in a CUDA buffer, with its te descriptor (code and
    logical shape given for packed FP4). torch allocations are 512-byte aligned."""

    def __init__(self, array, code=None, shape=None):
        array = np.ascontiguousarray(array)
        raw = array.reshape(-1).view(np.uint8)
        self.buffer = (
            torch.from_numpy(raw.copy()).to("cuda") if raw.size else torch.zeros(1, dtype=torch.uint8, device="cuda")
        )
        self.array = array
        code = int(tec.te_dtype(array.dtype)) if code is None else int(code)
        shape = list(array.shape if shape is None else shape)
        self.desc = lib.TensorDesc(self.buffer.data_ptr(), code, shape, 1, self.buffer.device.index or 0)

    def numpy(self) -> np.ndarray:
        torch.cuda.synchronize()
        return self.buffer.cpu().numpy().view(self.array.dtype).reshape(self.array.shape)


def device_operand(op, keep: list):
    if op.scaling == "nvfp4":
        data = Dev(op.data, DType.kFloat4E2M1, op.shape)
    else:
        data = Dev(op.data)
    scale = None if op.scale_inv is None else Dev(np.asarray(op.scale_inv))
    amax = None if op.amax is None else Dev(np.asarray(op.amax, np.float32).reshape(()))
    keep += [data, scale, amax]
    return lib.GemmOperandDesc(
        data.desc,
        SCALING[op.scaling],
        None if scale is None else scale.desc,
        None if amax is None else amax.desc,
        bool(op.swizzled_scales),
    )


def workspace(size: int):
    buffer = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
    return buffer, lib.TensorDesc(buffer.data_ptr(), int(DType.kByte), [size], 1, buffer.device.index or 0)


def out_shape(case) -> tuple[int, int]:
    a_rows, a_cols = int(np.prod(case.a.shape[:-1])), case.a.shape[-1]
    b_rows, b_cols = int(np.prod(case.b.shape[:-1])), case.b.shape[-1]
    return (a_cols if case.transa else a_rows), (b_rows if case.transb else b_cols)


def block_params(case, keep, *, c=None, bias=None, alpha=1.0, beta=0.0, out_dtype=F32, force_emulation=False):
    a, b = device_operand(case.a, keep), device_operand(case.b, keep)
    d = Dev(np.zeros(out_shape(case), out_dtype))
    dc = None if c is None else Dev(c)
    db = None if bias is None else Dev(bias)
    keep += [d, dc, db]
    params = lib.GemmBlockParams(
        a,
        b,
        d.desc,
        c=None if dc is None else dc.desc,
        bias=None if db is None else db.desc,
        alpha=alpha,
        beta=beta,
        transa=case.transa,
        transb=case.transb,
        force_emulation=force_emulation,
    )
    return params, d


def gpu_gemm_block(case, **kwargs):
    """(D, path taken, path planned): one te_gemm_block call with the planned workspace."""
    keep = []
    params, d = block_params(case, keep, **kwargs)
    planned, size = lib.gemm_block_plan(params)
    ws, ws_desc = workspace(size)
    torch.cuda.synchronize()
    taken = lib.gemm_block(params, ws_desc, torch.cuda.current_stream().cuda_stream)
    out = d.numpy()
    # The plan assumes 16-byte alignment; better-aligned buffers can only turn emulated into native.
    assert taken == planned or (PATHS[planned] == "emulated" and PATHS[taken] == "native")
    return out, PATHS[taken], PATHS[planned]


def gpu_dense_twin(a_bf16, b_bf16, case, *, c=None, bias=None, alpha=1.0, beta=0.0, out_dtype=F32):
    """te_gemm on the GPU with the BF16 dequantized operands: the emulated path's definition."""
    da, db = Dev(a_bf16), Dev(b_bf16)
    d = Dev(np.zeros(out_shape(case), out_dtype))
    dc = None if c is None else Dev(c)
    dbias = None if bias is None else Dev(bias)
    args = dict(
        c=None if dc is None else dc.desc,
        bias=None if dbias is None else dbias.desc,
        alpha=alpha,
        beta=beta,
        transa=case.transa,
        transb=case.transb,
    )
    size = lib.gemm_workspace_size(da.desc, db.desc, d.desc, **args)
    ws, ws_desc = workspace(size)
    torch.cuda.synchronize()
    lib.gemm(da.desc, db.desc, d.desc, workspace=ws_desc, stream=torch.cuda.current_stream().cuda_stream, **args)
    return d.numpy()


def bf16_operands(case):
    mx = case.a.scaling == "mxfp8"
    return (dequantized(case.a, mx and case.transa, BF16), dequantized(case.b, mx and not case.transb, BF16))


def fused_bias_rounding(out_dtype, bias):
    """A fused cuBLASLt BIAS epilogue with a 16-bit D and a bias of D's type may
    round the product to D's type first (te/gemm.h); FP8 and BF16 inputs alike."""
    if bias is not None and out_dtype in (BF16, F16) and np.asarray(bias).dtype == out_dtype:
        return out_dtype
    return None


# ---------------------------------------------------------------------------
# Emulated paths: bitwise te_gemm on the BF16-dequantized operands.


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", ALIGNED_SHAPES[:1] + ODD_SHAPES, ids=str)
@pytest.mark.parametrize("swizzled", [False, True], ids=["compact", "swizzled"])
def test_emulated_is_te_gemm_on_bf16_operands(rng, fmt, shape, swizzled):
    if fmt == "fp8_block" and swizzled:
        pytest.skip("FP8 block scales have one layout")
    x, w, dy = random_linear(rng, *shape)
    for name, case in linear_cases(fmt, x, w, dy, weight_2d=True, swizzled=swizzled).items():
        out, path, _ = gpu_gemm_block(case, force_emulation=True)
        assert path == "emulated"
        a16, b16 = bf16_operands(case)
        twin = gpu_dense_twin(a16, b16, case)
        assert same_bits(out, twin), f"{fmt} {name}: differs from te_gemm on the BF16 operands"
        ref = reference(a16, b16, transa=case.transa, transb=case.transb)
        assert_close(out, ref.out, ref.err32, f"{fmt} {name} (emulated)")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [F32, BF16], ids=str)
def test_emulated_epilogue(rng, fmt, out_dtype):
    x, w, dy = random_linear(rng, 128, 256, 192)
    case = linear_cases(fmt, x, w, dy)["fprop"]
    m, n = out_shape(case)
    c = random_operand(rng, (m, n), out_dtype)
    bias = random_operand(rng, (n,), out_dtype)
    kw = dict(c=c, bias=bias, alpha=0.75, beta=-0.5, out_dtype=out_dtype)
    out, path, _ = gpu_gemm_block(case, force_emulation=True, **kw)
    a16, b16 = bf16_operands(case)
    assert path == "emulated" and same_bits(out, gpu_dense_twin(a16, b16, case, **kw))
    ref = reference(
        a16,
        b16,
        transa=case.transa,
        transb=case.transb,
        c=c,
        bias=bias,
        alpha=0.75,
        beta=-0.5,
        rounded_before_bias=fused_bias_rounding(out_dtype, bias),
    )
    assert_close(out, ref.out, ref.err32, f"{fmt} epilogue (emulated)")


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_microscaling_is_emulated_below_blackwell(rng, fmt):
    if major() == 10:
        pytest.skip("compute capability 10.x has native MXFP8/NVFP4 GEMMs")
    x, w, dy = random_linear(rng, 128, 256, 128)
    case = linear_cases(fmt, x, w, dy, swizzled=True)["fprop"]
    _, path, planned = gpu_gemm_block(case)
    assert path == planned == "emulated"


# ---------------------------------------------------------------------------
# Native FP8 block scaling (Hopper).


def native_reference(case, **epilogue):
    out_dtype = epilogue.pop("out_dtype", F32)
    return reference(
        case.a_deq,
        case.b_deq,
        transa=case.transa,
        transb=case.transb,
        tensor_core_fp8=True,
        dequantized_fp8=True,
        scale_block_k=128,
        extra_roundings=BLOCK_EXTRA_ROUNDINGS,
        rounded_before_bias=fused_bias_rounding(out_dtype, epilogue.get("bias")),
        **epilogue,
    )


@pytest.mark.parametrize("shape", ALIGNED_SHAPES + ODD_SHAPES, ids=str)
@pytest.mark.parametrize("weight_2d", [True, False], ids=["w2d", "w1d"])
def test_native_fp8_block_linear(rng, shape, weight_2d):
    x, w, dy = random_linear(rng, *shape)
    aligned = shape in ALIGNED_SHAPES
    for name, case in linear_cases("fp8_block", x, w, dy, weight_2d=weight_2d).items():
        out, path, planned = gpu_gemm_block(case)
        if major() == 9 and aligned:
            assert path == "native", f"{name}: cuBLASLt block scaling did not run ({planned} planned)"
        ref = native_reference(case)
        assert_close(out, ref.out, ref.err32, f"fp8_block {name} ({path})")
        emulated, _, _ = gpu_gemm_block(case, force_emulation=True)
        a16, b16 = bf16_operands(case)
        ref16 = reference(a16, b16, transa=case.transa, transb=case.transb)
        assert_close(emulated, ref16.out, ref16.err32, f"fp8_block {name} (emulated)")


@pytest.mark.parametrize("out_dtype", [F32, BF16, F16], ids=str)
def test_native_fp8_block_epilogue(rng, out_dtype):
    x, w, dy = random_linear(rng, 256, 512, 384)
    case = linear_cases("fp8_block", x, w, dy, weight_2d=True)["fprop"]
    m, n = out_shape(case)
    c = random_operand(rng, (m, n), out_dtype)
    alpha = 1.5 if out_dtype != F16 else 1.5 / 256  # keep FP16 sums of rows ~30 x 30 finite
    for bias_dtype in (out_dtype, BF16):
        bias = random_operand(rng, (n,), bias_dtype)
        kw = dict(c=c, bias=bias, alpha=alpha, beta=0.25, out_dtype=out_dtype)
        out, path, _ = gpu_gemm_block(case, **kw)
        if major() == 9:
            assert path == "native"
        ref = native_reference(case, c=c, bias=bias, alpha=alpha, beta=0.25, out_dtype=out_dtype)
        assert_close(out, ref.out, ref.err32, f"fp8_block epilogue, bias {bias_dtype} ({path})")


def test_fp8_block_2d_by_2d_is_emulated(rng):
    x, w, _ = random_linear(rng, 256, 256, 256)
    qx = tec.quantize_fp8_block(x, block_dim=2)
    qw = tec.quantize_fp8_block(w, block_dim=2)
    case_a, case_b = tec.operand(qx), tec.operand(qw)
    case = Case(case_a, case_b, False, True, dequantized(case_a), dequantized(case_b))
    out, path, _ = gpu_gemm_block(case)
    assert path == "emulated"
    a16, b16 = bf16_operands(case)
    assert same_bits(out, gpu_dense_twin(a16, b16, case))


def test_native_fp8_block_e5m2_gradients(rng):
    x, w, dy = random_linear(rng, 256, 384, 256)
    qdy = tec.quantize_fp8_block(dy, "e5m2", block_dim=1)
    qw = tec.quantize_fp8_block(w, block_dim=2, rowwise=True, columnwise=True)
    a, b = tec.operand(qdy), tec.operand(qw, columnwise=True)
    case = Case(a, b, False, True, dequantized(a), dequantized(b))
    out, path, _ = gpu_gemm_block(case)
    ref = native_reference(case)
    assert_close(out, ref.out, ref.err32, f"fp8_block dgrad, E5M2 dY ({path})")


def test_native_plan_needs_less_workspace_than_emulation(rng):
    if major() != 9:
        pytest.skip("the native FP8 block path runs on compute capability 9.x")
    x, w, dy = random_linear(rng, 1024, 1024, 1024)
    case = linear_cases("fp8_block", x, w, dy, weight_2d=True)["fprop"]
    keep = []
    native, _ = block_params(case, keep)
    emulated, _ = block_params(case, keep, force_emulation=True)
    (p1, native_bytes), (p2, emulated_bytes) = lib.gemm_block_plan(native), lib.gemm_block_plan(emulated)
    assert PATHS[p1] == "native", "the plan (16-byte-aligned dummies) found no native kernel"
    assert PATHS[p2] == "emulated"
    assert native_bytes < emulated_bytes  # no dequantized copies


def test_native_fp8_block_under_graph_capture(rng):
    x, w, dy = random_linear(rng, 256, 512, 256)
    case = linear_cases("fp8_block", x, w, dy, weight_2d=True)["fprop"]
    keep = []
    params, d = block_params(case, keep)
    _, size = lib.gemm_block_plan(params)
    ws, ws_desc = workspace(size)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up: handle and heuristic before capture
        lib.gemm_block(params, ws_desc, stream.cuda_stream)
    stream.synchronize()
    eager = d.numpy().copy()
    d.buffer.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        lib.gemm_block(params, ws_desc, stream.cuda_stream)
    graph.replay()
    assert same_bits(d.numpy(), eager)


# ---------------------------------------------------------------------------
# Native MXFP8 / NVFP4 (compute capability 10.x).


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_native_microscaling_on_blackwell(rng, fmt):
    if major() != 10:
        pytest.skip("native MXFP8/NVFP4 GEMMs need compute capability 10.x")
    x, w, dy = random_linear(rng, 256, 512, 384)
    for name, case in linear_cases(fmt, x, w, dy, swizzled=True).items():
        out, path, _ = gpu_gemm_block(case)
        assert path == "native", name
        ref = native_reference(case)
        assert_close(out, ref.out, ref.err32, f"{fmt} {name} (native)")


# ---------------------------------------------------------------------------
# Grouped GEMMs.


@pytest.mark.parametrize("fmt", FORMATS)
def test_grouped_equals_single_gemms(rng, fmt):
    shapes = [(128, 256, 256), (256, 256, 128), (64, 256, 256)]  # experts' token counts differ
    keep, groups, outs, singles = [], [], [], []
    for t, k_in, n_out in shapes:
        x, w, dy = random_linear(rng, t, k_in, n_out)
        case = linear_cases(fmt, x, w, dy, weight_2d=True, swizzled=True)["fprop"]
        params, d = block_params(case, keep)
        groups.append(params)
        outs.append(d)
        singles.append(gpu_gemm_block(case))
    paths, size = lib.gemm_block_grouped_plan(groups)
    ws, ws_desc = workspace(size)
    torch.cuda.synchronize()
    taken = lib.gemm_block_grouped(groups, ws_desc, torch.cuda.current_stream().cuda_stream)
    for i, (d, (single, single_path, _)) in enumerate(zip(outs, singles)):
        assert PATHS[taken[i]] == single_path
        assert same_bits(d.numpy(), single), f"group {i}"
