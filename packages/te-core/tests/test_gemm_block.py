"""te_gemm_block on the CPU (block formats take the emulated path), and on every
backend (the `device` fixture, last part: emulated, native and grouped paths).

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

import core_device
import ml_dtypes
import numpy as np
import pytest
from conftest import CUDA_ONLY, hostile
from gemm_block_cases import FORMATS, Case, dequantized, linear_cases, random_linear, same_bits

import transformer_engine.core as tec
from transformer_engine.core import DType, lib
from transformer_engine.core.gemm_block import PATHS, SCALING
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


# ===========================================================================
# Every backend (the `device` fixture): raw buffers on the test's device.
#
# * Emulated paths (every block format; the only path for MXFP8 and NVFP4 below
#   compute capability 10, and on the CPU): D must be bit for bit te_gemm on the
#   same device applied to the dequantized operands (CUDA: BF16, CPU: FP32). On
#   CUDA both run the same cuBLASLt configuration (shapes, types,
#   256-byte-or-better alignments, 32 MiB workspace), so cuBLASLt picks the same
#   algorithm. D must also lie within the FP32 GEMM bound of the float64 product
#   of those operands.
# * Native FP8 block scaling (CUDA, compute capability 9.x, cuBLASLt >= 12.9):
#   the plan must say native for the Linear GEMMs (1-D x 2-D, 1-D x 1-D) of
#   aligned shapes, and D must lie within the bound of the float64 product of
#   the exact FP32 dequantized operands with te_gemm's Hopper FP8 tensor-core
#   model (reference_gemm.py; the block scales add <= 2 FP32 roundings per block
#   term, inside extra_roundings = 4) and the fused-BIAS rounding of a 16-bit D.
#   It is compared with the emulated path through those bounds.
# * Native MXFP8 / NVFP4 (compute capability 10.x only, skipped elsewhere): the
#   same bound with the same accumulator model, unverified on such a GPU.
# * Grouped GEMMs equal their single GEMMs; CUDA graph capture replays the
#   native path.
# Operands are quantized by the CPU quantizers (whose bytes equal the CUDA
# quantizers', the device tests of each format) and copied to the device.

# cuBLASLt applies block scales to partial sums (module docstring).
BLOCK_EXTRA_ROUNDINGS = 4
# (T, In, Out): all multiples of 128 (whole blocks), then K = In or T not.
ALIGNED_SHAPES = [(256, 384, 512), (128, 1024, 256)]
ODD_SHAPES = [(160, 288, 96), (96, 160, 224)]


def major() -> int:
    """(CUDA) the current device's compute capability major."""
    import torch

    return torch.cuda.get_device_capability()[0]


class Dev:
    """A host array's bytes on the test's device, with its te descriptor (code
    and logical shape given for packed FP4). torch's CUDA allocations are
    512-byte aligned."""

    def __init__(self, array, code=None, shape=None):
        array = np.ascontiguousarray(array)
        raw = array.reshape(-1).view(np.uint8)
        self.buffer = core_device.Buffer(max(raw.size, 1), fill=0)
        if raw.size:
            self.buffer.write(0, raw)
        self.array = array
        code = int(tec.te_dtype(array.dtype)) if code is None else int(code)
        shape = list(array.shape if shape is None else shape)
        self.desc = self.buffer.desc(0, code, shape)

    def numpy(self) -> np.ndarray:
        self.buffer.sync()
        return self.buffer.read(0, self.array.nbytes).view(self.array.dtype).reshape(self.array.shape)


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
    buffer = core_device.Buffer(max(size, 1))
    return buffer, buffer.desc(0, int(DType.kByte), [size])


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


def device_gemm_block(case, **kwargs):
    """(D, path taken, path planned): one te_gemm_block call with the planned workspace."""
    keep = []
    params, d = block_params(case, keep, **kwargs)
    planned, size = lib.gemm_block_plan(params)
    ws, ws_desc = workspace(size)
    core_device.sync()
    taken = lib.gemm_block(params, ws_desc, core_device.stream())
    out = d.numpy()
    # The plan assumes 16-byte alignment; better-aligned buffers can only turn emulated into native.
    assert taken == planned or (PATHS[planned] == "emulated" and PATHS[taken] == "native")
    return out, PATHS[taken], PATHS[planned]


def device_dense_twin(a_bf16, b_bf16, case, *, c=None, bias=None, alpha=1.0, beta=0.0, out_dtype=F32):
    """te_gemm on the test's device with the dequantized operands (CUDA: BF16, CPU:
    FP32): the emulated path's definition (te/gemm_block.h)."""
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
    core_device.sync()
    lib.gemm(da.desc, db.desc, d.desc, workspace=ws_desc, stream=core_device.stream(), **args)
    return d.numpy()


def emulated_operands(case):
    """The operands the emulated path multiplies: dequantized to BF16 on CUDA, to FP32 on the CPU."""
    mx = case.a.scaling == "mxfp8"
    dtype = BF16 if core_device.current() == "cuda" else F32
    return (dequantized(case.a, mx and case.transa, dtype), dequantized(case.b, mx and not case.transb, dtype))


def fused_bias_rounding(out_dtype, bias):
    """A fused cuBLASLt BIAS epilogue with a 16-bit D and a bias of D's type may
    round the product to D's type first (te/gemm.h); FP8 and BF16 inputs alike."""
    if bias is not None and out_dtype in (BF16, F16) and np.asarray(bias).dtype == out_dtype:
        return out_dtype
    return None


# ---------------------------------------------------------------------------
# Emulated paths on the test's device: bitwise te_gemm on the dequantized operands.


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", ALIGNED_SHAPES[:1] + ODD_SHAPES, ids=str)
@pytest.mark.parametrize("swizzled", [False, True], ids=["compact", "swizzled"])
def test_device_emulated_is_te_gemm_on_dequantized_operands(device, rng, fmt, shape, swizzled):
    if fmt == "fp8_block" and swizzled:
        pytest.skip("FP8 block scales have one layout")
    x, w, dy = random_linear(rng, *shape)
    for name, case in linear_cases(fmt, x, w, dy, weight_2d=True, swizzled=swizzled).items():
        out, path, _ = device_gemm_block(case, force_emulation=True)
        assert path == "emulated"
        a16, b16 = emulated_operands(case)
        twin = device_dense_twin(a16, b16, case)
        assert same_bits(out, twin), f"{fmt} {name}: differs from te_gemm on the dequantized operands"
        ref = reference(a16, b16, transa=case.transa, transb=case.transb)
        assert_close(out, ref.out, ref.err32, f"{fmt} {name} (emulated)")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [F32, BF16], ids=str)
def test_device_emulated_epilogue(device, rng, fmt, out_dtype):
    x, w, dy = random_linear(rng, 128, 256, 192)
    case = linear_cases(fmt, x, w, dy)["fprop"]
    m, n = out_shape(case)
    c = random_operand(rng, (m, n), out_dtype)
    bias = random_operand(rng, (n,), out_dtype)
    kw = dict(c=c, bias=bias, alpha=0.75, beta=-0.5, out_dtype=out_dtype)
    out, path, _ = device_gemm_block(case, force_emulation=True, **kw)
    a16, b16 = emulated_operands(case)
    assert path == "emulated" and same_bits(out, device_dense_twin(a16, b16, case, **kw))
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
@CUDA_ONLY
def test_cuda_microscaling_is_emulated_below_blackwell(device, rng, fmt):
    if major() == 10:
        pytest.skip("compute capability 10.x has native MXFP8/NVFP4 GEMMs")
    x, w, dy = random_linear(rng, 128, 256, 128)
    case = linear_cases(fmt, x, w, dy, swizzled=True)["fprop"]
    _, path, planned = device_gemm_block(case)
    assert path == planned == "emulated"


# ---------------------------------------------------------------------------
# Native FP8 block scaling (Hopper; CUDA only).


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
@CUDA_ONLY
def test_cuda_native_fp8_block_linear(device, rng, shape, weight_2d):
    x, w, dy = random_linear(rng, *shape)
    aligned = shape in ALIGNED_SHAPES
    for name, case in linear_cases("fp8_block", x, w, dy, weight_2d=weight_2d).items():
        out, path, planned = device_gemm_block(case)
        if major() == 9 and aligned:
            assert path == "native", f"{name}: cuBLASLt block scaling did not run ({planned} planned)"
        ref = native_reference(case)
        assert_close(out, ref.out, ref.err32, f"fp8_block {name} ({path})")
        emulated, _, _ = device_gemm_block(case, force_emulation=True)
        a16, b16 = emulated_operands(case)
        ref16 = reference(a16, b16, transa=case.transa, transb=case.transb)
        assert_close(emulated, ref16.out, ref16.err32, f"fp8_block {name} (emulated)")


@pytest.mark.parametrize("out_dtype", [F32, BF16, F16], ids=str)
@CUDA_ONLY
def test_cuda_native_fp8_block_epilogue(device, rng, out_dtype):
    x, w, dy = random_linear(rng, 256, 512, 384)
    case = linear_cases("fp8_block", x, w, dy, weight_2d=True)["fprop"]
    m, n = out_shape(case)
    c = random_operand(rng, (m, n), out_dtype)
    alpha = 1.5 if out_dtype != F16 else 1.5 / 256  # keep FP16 sums of rows ~30 x 30 finite
    for bias_dtype in (out_dtype, BF16):
        bias = random_operand(rng, (n,), bias_dtype)
        kw = dict(c=c, bias=bias, alpha=alpha, beta=0.25, out_dtype=out_dtype)
        out, path, _ = device_gemm_block(case, **kw)
        if major() == 9:
            assert path == "native"
        ref = native_reference(case, c=c, bias=bias, alpha=alpha, beta=0.25, out_dtype=out_dtype)
        assert_close(out, ref.out, ref.err32, f"fp8_block epilogue, bias {bias_dtype} ({path})")


def test_device_fp8_block_2d_by_2d_is_emulated(device, rng):
    x, w, _ = random_linear(rng, 256, 256, 256)
    qx = tec.quantize_fp8_block(x, block_dim=2)
    qw = tec.quantize_fp8_block(w, block_dim=2)
    case_a, case_b = tec.operand(qx), tec.operand(qw)
    case = Case(case_a, case_b, False, True, dequantized(case_a), dequantized(case_b))
    out, path, _ = device_gemm_block(case)
    assert path == "emulated"
    a16, b16 = emulated_operands(case)
    assert same_bits(out, device_dense_twin(a16, b16, case))


@CUDA_ONLY
def test_cuda_native_fp8_block_e5m2_gradients(device, rng):
    x, w, dy = random_linear(rng, 256, 384, 256)
    qdy = tec.quantize_fp8_block(dy, "e5m2", block_dim=1)
    qw = tec.quantize_fp8_block(w, block_dim=2, rowwise=True, columnwise=True)
    a, b = tec.operand(qdy), tec.operand(qw, columnwise=True)
    case = Case(a, b, False, True, dequantized(a), dequantized(b))
    out, path, _ = device_gemm_block(case)
    ref = native_reference(case)
    assert_close(out, ref.out, ref.err32, f"fp8_block dgrad, E5M2 dY ({path})")


@CUDA_ONLY
def test_cuda_native_plan_needs_less_workspace_than_emulation(device, rng):
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


@CUDA_ONLY
def test_cuda_native_fp8_block_under_graph_capture(device, rng):
    x, w, dy = random_linear(rng, 256, 512, 256)
    case = linear_cases("fp8_block", x, w, dy, weight_2d=True)["fprop"]
    keep = []
    params, d = block_params(case, keep)
    _, size = lib.gemm_block_plan(params)
    ws, ws_desc = workspace(size)
    torch = pytest.importorskip("torch")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up: handle and heuristic before capture
        lib.gemm_block(params, ws_desc, stream.cuda_stream)
    stream.synchronize()
    eager = d.numpy().copy()
    d.buffer.storage.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        lib.gemm_block(params, ws_desc, stream.cuda_stream)
    graph.replay()
    assert same_bits(d.numpy(), eager)


# ---------------------------------------------------------------------------
# Native MXFP8 / NVFP4 (compute capability 10.x; CUDA only).


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@CUDA_ONLY
def test_cuda_native_microscaling_on_blackwell(device, rng, fmt):
    if major() != 10:
        pytest.skip("native MXFP8/NVFP4 GEMMs need compute capability 10.x")
    x, w, dy = random_linear(rng, 256, 512, 384)
    for name, case in linear_cases(fmt, x, w, dy, swizzled=True).items():
        out, path, _ = device_gemm_block(case)
        assert path == "native", name
        ref = native_reference(case)
        assert_close(out, ref.out, ref.err32, f"{fmt} {name} (native)")


# ---------------------------------------------------------------------------
# Grouped GEMMs on the test's device.


@pytest.mark.parametrize("fmt", FORMATS)
def test_device_grouped_equals_single_gemms(device, rng, fmt):
    shapes = [(128, 256, 256), (256, 256, 128), (64, 256, 256)]  # experts' token counts differ
    keep, groups, outs, singles = [], [], [], []
    for t, k_in, n_out in shapes:
        x, w, dy = random_linear(rng, t, k_in, n_out)
        case = linear_cases(fmt, x, w, dy, weight_2d=True, swizzled=True)["fprop"]
        params, d = block_params(case, keep)
        groups.append(params)
        outs.append(d)
        singles.append(device_gemm_block(case))
    paths, size = lib.gemm_block_grouped_plan(groups)
    ws, ws_desc = workspace(size)
    core_device.sync()
    taken = lib.gemm_block_grouped(groups, ws_desc, core_device.stream())
    for i, (d, (single, single_path, _)) in enumerate(zip(outs, singles)):
        assert PATHS[taken[i]] == single_path
        assert same_bits(d.numpy(), single), f"group {i}"
