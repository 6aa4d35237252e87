"""Per-tensor FP8 quantization: the CPU backend bit-exact against the NumPy oracle,
and every backend (the `device` fixture) byte for byte against the NumPy API."""

from __future__ import annotations

import math

import backend_checks as bc
import core_device
import numpy as np
import pytest
from conftest import FP8_FORMATS, INPUT_DTYPES, SHAPES, finfo, hostile

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core import reference as ref
from transformer_engine.core.dtypes import DType, te_dtype

pytestmark = pytest.mark.cast


def as_bytes(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_delayed_quantize_is_bit_exact(rng, shape, dtype, fmt):
    x = hostile(rng, shape, dtype, fmt)
    scale = np.float32(rng.choice([1.0, 0.37, 8.0, 1024.0]))
    out = tc.quantize_fp8(x, scale, fmt, rowwise=True, columnwise=True)
    expected = ref.quantize_fp8(x, scale, fmt)
    np.testing.assert_array_equal(as_bytes(out.rowwise), expected)
    np.testing.assert_array_equal(as_bytes(out.columnwise), ref.columnwise(expected))
    assert out.scale_inv == np.float32(1.0) / scale
    assert out.amax == ref.amax(x)


def test_amax_accumulates_into_existing_value(rng):
    x = rng.standard_normal((9, 32)).astype(np.float32)
    out = tc.quantize_fp8(x, 1.0, "e4m3", amax=1e6)
    assert out.amax == np.float32(1e6)
    out = tc.quantize_fp8(x, 1.0, "e4m3", amax=1e-3)
    assert out.amax == ref.amax(x)


@pytest.mark.parametrize("only", ["rowwise", "columnwise"])
def test_single_output(rng, only):
    x = hostile(rng, (40, 48), np.float32)
    out = tc.quantize_fp8(x, 2.0, "e5m2", rowwise=only == "rowwise", columnwise=only == "columnwise")
    expected = ref.quantize_fp8(x, 2.0, "e5m2")
    if only == "rowwise":
        assert out.columnwise is None
        np.testing.assert_array_equal(as_bytes(out.rowwise), expected)
    else:
        assert out.rowwise is None
        np.testing.assert_array_equal(as_bytes(out.columnwise), ref.columnwise(expected))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("pow2", [False, True])
def test_current_scaling_is_bit_exact(rng, shape, dtype, fmt, pow2):
    x = hostile(rng, shape, dtype, fmt)
    x[np.isinf(x.astype(np.float32))] = 0  # an infinite amax gives scale 1; tested separately
    out = tc.quantize_fp8_current_scaling(x, fmt, columnwise=True, force_pow_2_scales=pow2)
    amax = ref.amax(x)
    input_max = np.float32(finfo(dtype).max)
    scale = ref.scale_from_amax(amax, fmt, force_pow2=pow2, value_for_inf=input_max)
    assert out.amax == amax
    assert out.scale == scale
    assert out.scale_inv == np.float32(1.0) / scale
    expected = ref.quantize_fp8(x, scale, fmt)
    np.testing.assert_array_equal(as_bytes(out.rowwise), expected)
    np.testing.assert_array_equal(as_bytes(out.columnwise), ref.columnwise(expected))


def test_current_scaling_with_inf_input_uses_scale_one(rng):
    x = rng.standard_normal((4, 32)).astype(np.float32)
    x[1, 3] = np.inf
    out = tc.quantize_fp8_current_scaling(x, "e4m3")
    assert out.scale == 1.0
    np.testing.assert_array_equal(as_bytes(out.rowwise), ref.quantize_fp8(x, 1.0, "e4m3"))


def test_current_scaling_of_all_zero_tensor_uses_scale_one():
    out = tc.quantize_fp8_current_scaling(np.zeros((3, 16), np.float32), "e4m3")
    assert out.scale == 1.0 and out.amax == 0.0
    assert not as_bytes(out.rowwise).any()


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_current_scaling_tiny_amax_gives_input_type_max(dtype):
    """448 / amax overflows FP32 for FP32/BF16 denormals: the scale becomes the input type's max."""
    tiny = finfo(dtype).smallest_subnormal
    x = np.full((2, 16), tiny, dtype=dtype)
    out = tc.quantize_fp8_current_scaling(x, "e4m3")
    with np.errstate(over="ignore"):
        exact = np.float32(448.0) / np.float32(tiny)
    expected = np.float32(finfo(dtype).max) if np.isinf(exact) else exact
    assert out.scale == expected
    assert np.isinf(exact) == (np.dtype(dtype) != np.dtype(np.float16))


def test_epsilon_floors_amax(rng):
    x = (rng.standard_normal((8, 16)) * 1e-6).astype(np.float32)
    out = tc.quantize_fp8_current_scaling(x, "e4m3", amax_epsilon=1e-2)
    assert out.scale == np.float32(448.0) / np.float32(1e-2)


@pytest.mark.parametrize(
    "amax,expected",
    [
        (0.0, 1.0),
        (np.inf, 1.0),
        (np.nan, 1.0),
        (2.0, 224.0),
        (1e-45, ref.FLT_MAX),  # 448 / denormal overflows: FLT_MAX
        (3.0, np.float32(448.0) / np.float32(3.0)),
    ],
)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_scale_from_amax_edge_cases(amax, expected, fmt):
    scale, scale_inv = tc.compute_scale_from_amax(amax, fmt)
    if fmt == "e5m2" and expected not in (1.0, ref.FLT_MAX):
        expected = ref.scale_from_amax(amax, fmt)
    assert scale == np.float32(expected)
    assert scale == ref.scale_from_amax(amax, fmt)
    assert scale_inv == np.float32(1.0) / scale


@pytest.mark.parametrize("amax", [3.0, 1e-30, 0.7, 448.0, 1e30])
def test_scale_from_amax_pow2_rounds_down(amax):
    scale, _ = tc.compute_scale_from_amax(amax, "e4m3", force_pow_2_scales=True)
    exact = np.float32(448.0) / np.float32(amax)
    assert scale <= exact < 2 * scale
    assert np.frexp(scale)[0] == 0.5  # a power of two
    assert scale == ref.scale_from_amax(amax, "e4m3", force_pow2=True)


def test_compute_amax_ignores_nan(rng):
    x = rng.standard_normal((17, 33)).astype(np.float32)
    x[3, 4] = np.nan
    assert tc.compute_amax(x) == ref.amax(x)
    assert tc.compute_amax(np.full((2, 2), np.nan, np.float32)) == 0.0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("out_dtype", INPUT_DTYPES)
def test_dequantize_matches_oracle(rng, shape, fmt, out_dtype):
    q = rng.integers(0, 256, size=shape, dtype=np.uint8).view(ref.FP8_NUMPY[fmt])
    scale_inv = np.float32(rng.choice([1.0, 0.01, 3.5]))
    out = tc.dequantize_fp8(q, scale_inv, out_dtype)
    expected = ref.dequantize_fp8(q.view(np.uint8), scale_inv, fmt, out_dtype)
    assert out.dtype == np.dtype(out_dtype)
    np.testing.assert_array_equal(out.astype(np.float32), expected.astype(np.float32))


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_round_trip_error_is_within_half_ulp(rng, fmt):
    """Quantize then dequantize: relative error <= 2^-(mantissa bits + 1) for normal values."""
    x = rng.uniform(0.5, 400, size=(64, 64)).astype(np.float32)
    out = tc.quantize_fp8(x, 1.0, fmt)
    back = tc.dequantize_fp8(out.rowwise, out.scale_inv)
    mantissa_bits = 3 if fmt == "e4m3" else 2
    assert np.max(np.abs(back - x) / x) <= 2.0 ** -(mantissa_bits + 1)


def _pow2_calls():
    x = np.array([[0.3, -5.0, 5.5, 1e-3] * 32], np.float32)
    ones = np.ones(x.shape[-1], np.float32)
    fp8 = {"out_dtype": "e4m3"}
    return {
        "compute_scale_from_amax": lambda **kw: tc.compute_scale_from_amax(3.0, "e4m3", **kw),
        "quantize_fp8_current_scaling": lambda **kw: tc.quantize_fp8_current_scaling(x, **kw).scale,
        "quantize_fp8_block": lambda **kw: tc.quantize_fp8_block(x, **kw).rowwise_scale_inv,
        "layernorm_fwd": lambda **kw: tc.layernorm_fwd(x, ones, ones, **fp8, **kw).scale_inv,
        "rmsnorm_fwd": lambda **kw: tc.rmsnorm_fwd(x, ones, **fp8, **kw).scale_inv,
    }


@pytest.mark.parametrize("name", list(_pow2_calls()))
def test_force_pow2_scales_is_a_deprecated_spelling(name):
    """The reference's name is force_pow_2_scales; the old te-core keyword still works, with a warning."""
    call = _pow2_calls()[name]
    want = call(force_pow_2_scales=False)
    with pytest.warns(DeprecationWarning, match="'force_pow2_scales' is deprecated, use 'force_pow_2_scales'"):
        got = call(force_pow2_scales=False)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert not np.array_equal(np.asarray(call(force_pow_2_scales=True)), np.asarray(want))
    with pytest.raises(TypeError, match="both 'force_pow_2_scales' and its deprecated spelling"):
        call(force_pow2_scales=True, force_pow_2_scales=True)


# ---------------------------------------------------------------- every backend, raw buffers
# The bindings on buffers of the test's device (backend_checks): the bytes equal
# the NumPy API's. On CUDA that is the CPU == CUDA contract; on the CPU, the
# raw-buffer path (0xA5-prefilled outputs, pointers off the 16-byte grid).
# Odd shapes first; (32768, 64) and (256, 192) take the CUDA kernels'
# vectorized full-tile paths, (1000, 1000) the 8-byte columnwise stores,
# (3, 7, 33) unaligned rows.

# ---------------------------------------------------------------- quantize


def _outputs(shape, fp8: str, rowwise: bool, columnwise: bool, offset: int = 0):
    rows, cols = bc.matrix(shape)
    row = bc.DeviceArray(shape, bc.FP8[fp8], offset) if rowwise else None
    col = bc.DeviceArray((cols, rows), bc.FP8[fp8], offset) if columnwise else None
    return row, col


def _check_fp8_outputs(row, col, want, ctx):
    if row is not None:
        bc.assert_same_bytes(row.numpy(), want.rowwise, "rowwise", ctx)
    if col is not None:
        bc.assert_same_bytes(col.numpy(), want.columnwise, "columnwise", ctx)


def run_delayed(x, scale, fp8, layout, amax0, x_offset=0, out_offset=0):
    """Delayed-scaling quantize of x on the device (raw buffers) and through the NumPy API."""
    rowwise, columnwise = bc.LAYOUTS[layout]
    dx = bc.DeviceArray.of(x, x_offset)
    row, col = _outputs(x.shape, fp8, rowwise, columnwise, out_offset)
    d_scale, d_inv, d_amax = bc.scalar(scale), bc.scalar(-1.0), bc.scalar(amax0)
    lib.quantize_fp8(
        dx.desc, d_scale.desc, bc.desc_or_none(row), bc.desc_or_none(col), d_inv.desc, d_amax.desc, core_device.stream()
    )
    want = tc.quantize_fp8(x, np.float32(scale), fp8, rowwise=rowwise, columnwise=columnwise, amax=np.float32(amax0))
    return row, col, d_inv, d_amax, want


@pytest.mark.parametrize("layout", list(bc.LAYOUTS))
@pytest.mark.parametrize("fp8", list(bc.FP8))
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", bc.SHAPES, ids=str)
def test_device_quantize_delayed(device, shape, dtype, fp8, layout, rng_and_seed):
    rng, seed = rng_and_seed
    x = bc.make_input(shape, dtype, rng)
    # (scale, amax already in the buffer): the amax is max-accumulated, NaN replaced.
    for scale, amax0 in [(1.0, 0.0), (3.7, 7.5), (1.0e4, 1e30), (0.0625, np.nan), (2.0**-20, -1.0)]:
        ctx = bc.ctx(seed, scale=scale, amax0=amax0)
        row, col, d_inv, d_amax, want = run_delayed(x, scale, fp8, layout, amax0)
        _check_fp8_outputs(row, col, want, ctx)
        bc.assert_same_bytes(d_inv.numpy(), want.scale_inv, "scale_inv", ctx)
        bc.assert_same_bytes(d_amax.numpy(), want.amax, "amax", ctx)


@pytest.mark.parametrize("fp8", list(bc.FP8))
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
def test_device_quantize_rounding_ties_and_saturation(device, dtype, fp8, rng_and_seed):
    """Every bc.FP8 value, every midpoint between neighbours (RNE ties), their
    neighbours one input-ulp away, and values past the bc.FP8 max, at power-of-two
    scales (so that x * scale is exact and the ties stay ties)."""
    rng, seed = rng_and_seed
    grid = np.arange(256, dtype=np.uint8).view(bc.FP8[fp8]).astype(np.float32)
    grid = np.unique(np.abs(grid[np.isfinite(grid)]))
    mids = (grid[:-1] + grid[1:]) / 2
    top = grid[-1]
    beyond = np.array([top * 1.03125, top * 1.0625, top * 1.09375, top * 1.5, top * 4], np.float32)
    base = np.concatenate(
        [grid, mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf)), beyond]
    )
    base = np.concatenate([base, -base])
    for scale in [1.0, 2.0**-3, 2.0**5]:
        with np.errstate(over="ignore"):
            x = (base / np.float32(scale)).astype(dtype)
        x = rng.permutation(x)
        cols = 64
        x = np.concatenate([x, np.zeros((-x.size) % cols, dtype)]).reshape(-1, cols)
        ctx = bc.ctx(seed, scale=scale)
        row, col, d_inv, d_amax, want = run_delayed(x, scale, fp8, "both", 0.0)
        _check_fp8_outputs(row, col, want, ctx)
        bc.assert_same_bytes(d_amax.numpy(), want.amax, "amax", ctx)


@pytest.mark.parametrize("layout", list(bc.LAYOUTS))
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(256, 192), (130, 72), (64, 48)], ids=str)
def test_device_quantize_unaligned_pointers(device, shape, dtype, layout, rng_and_seed):
    """Data pointers off the 16-byte grid take the element-wise paths."""
    rng, seed = rng_and_seed
    x = bc.make_input(shape, dtype, rng)
    for x_offset, out_offset in [(dtype.itemsize, 0), (0, 1), (dtype.itemsize * 3, 2)]:
        ctx = bc.ctx(seed, x_offset=x_offset, out_offset=out_offset)
        row, col, d_inv, d_amax, want = run_delayed(x, 3.7, "e4m3", layout, 0.0, x_offset, out_offset)
        _check_fp8_outputs(row, col, want, ctx)
        bc.assert_same_bytes(d_amax.numpy(), want.amax, "amax", ctx)


# (force_pow_2_scales, amax_epsilon, input kind)
CURRENT_CONFIGS = [
    (False, 0.0, "finite"),
    (True, 0.0, "finite"),
    (False, 0.0, "hostile"),
    (False, 1e6, "finite"),
    (True, 1e-2, "tiny"),
    (False, 0.0, "tiny"),
]


@pytest.mark.parametrize("layout", list(bc.LAYOUTS))
@pytest.mark.parametrize("fp8", list(bc.FP8))
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", bc.SHAPES + [(0, 16)], ids=str)
def test_device_quantize_current_scaling(device, shape, dtype, fp8, layout, rng_and_seed):
    rng, seed = rng_and_seed
    rowwise, columnwise = bc.LAYOUTS[layout]
    for pow2, eps, kind in CURRENT_CONFIGS:
        ctx = bc.ctx(seed, force_pow2=pow2, eps=eps, kind=kind)
        x = bc.make_input(shape, dtype, rng, kind)
        dx = bc.DeviceArray.of(x)
        row, col = _outputs(shape, fp8, rowwise, columnwise)
        d_scale, d_inv, d_amax = bc.scalar(-1.0), bc.scalar(-1.0), bc.scalar(-1.0)
        lib.quantize_fp8_current_scaling(
            dx.desc,
            bc.desc_or_none(row),
            bc.desc_or_none(col),
            d_scale.desc,
            d_inv.desc,
            d_amax.desc,
            pow2,
            eps,
            core_device.stream(),
        )
        want = tc.quantize_fp8_current_scaling(
            x, fp8, rowwise=rowwise, columnwise=columnwise, force_pow_2_scales=pow2, amax_epsilon=eps
        )
        bc.assert_same_bytes(d_amax.numpy(), want.amax, "amax", ctx)
        bc.assert_same_bytes(d_scale.numpy(), want.scale, "scale", ctx)
        bc.assert_same_bytes(d_inv.numpy(), want.scale_inv, "scale_inv", ctx)
        _check_fp8_outputs(row, col, want, ctx)


# ---------------------------------------------------------------- amax, scale


@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", bc.SHAPES + [(0, 16), (4097,)], ids=str)
def test_device_compute_amax(device, shape, dtype, rng_and_seed):
    rng, seed = rng_and_seed
    for kind in ["hostile", "finite", "tiny"]:
        x = bc.make_input(shape, dtype, rng, kind)
        for offset in [0, dtype.itemsize]:
            d_amax = bc.scalar(123.0)  # overwritten, not accumulated
            dx = bc.DeviceArray.of(x, offset)
            lib.compute_amax(dx.desc, d_amax.desc, core_device.stream())
            ctx = bc.ctx(seed, kind=kind, offset=offset)
            bc.assert_same_bytes(d_amax.numpy(), np.float32(tc.compute_amax(x)), "amax", ctx)


@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
def test_device_compute_amax_all_nan(device, dtype):
    uint, patterns = bc.NAN_BITS[np.dtype(dtype)]
    x = np.array(patterns * 300, dtype=uint).view(dtype).reshape(40, 30)
    d_amax = bc.scalar(5.0)
    dx = bc.DeviceArray.of(x)
    lib.compute_amax(dx.desc, d_amax.desc, core_device.stream())
    bc.assert_same_bytes(d_amax.numpy(), np.float32(0.0), "amax")


AMAX_VALUES = [0.0, -1.0, 2.0**-149, 1e-38, 1e-30, 1e-3, 1.0, 3.0, 448.0, 57344.0, 1e30, 3.4e38, np.inf, np.nan]


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-3, 10.0])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("fp8", list(bc.FP8))
def test_device_scale_from_amax(device, fp8, pow2, eps):
    for amax in AMAX_VALUES:
        d_amax, d_scale, d_inv = bc.scalar(amax), bc.scalar(-1.0), bc.scalar(-1.0)
        lib.compute_scale_from_amax(
            d_amax.desc, d_scale.desc, d_inv.desc, int(te_dtype(fp8)), pow2, eps, core_device.stream()
        )
        scale, scale_inv = tc.compute_scale_from_amax(amax, fp8, force_pow_2_scales=pow2, amax_epsilon=eps)
        ctx = f"amax={amax}"
        bc.assert_same_bytes(d_scale.numpy(), np.float32(scale), "scale", ctx)
        bc.assert_same_bytes(d_inv.numpy(), np.float32(scale_inv), "scale_inv", ctx)


# ---------------------------------------------------------------- dequantize

SCALE_INVS = [1.0, 0.0123, 2.0**-10, 1e30, 3e38, 1e-45, 0.0, np.inf, np.nan, -2.5]


@pytest.mark.parametrize("out_dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fp8", list(bc.FP8))
@pytest.mark.parametrize("shape", [(1, 16), (5, 160), (3, 7, 33), (256, 256), (1000, 1000), (77,)], ids=str)
def test_device_dequantize(device, shape, fp8, out_dtype, rng_and_seed):
    rng, seed = rng_and_seed
    n = math.prod(shape)
    codes = np.concatenate([np.arange(256, dtype=np.uint8), rng.integers(0, 256, n, dtype=np.uint8)])
    q = rng.permutation(codes)[:n].view(bc.FP8[fp8]).reshape(shape)
    for scale_inv in SCALE_INVS:
        unaligned = (1, np.dtype(out_dtype).itemsize)  # pointers stay element-aligned
        for offsets in [(0, 0), unaligned] if scale_inv == 0.0123 else [(0, 0)]:
            dq, d_inv = bc.DeviceArray.of(q, offsets[0]), bc.scalar(scale_inv)
            out = bc.DeviceArray(shape, out_dtype, offsets[1])
            lib.dequantize_fp8(dq.desc, d_inv.desc, out.desc, core_device.stream())
            want = tc.dequantize_fp8(q, np.float32(scale_inv), out_dtype)
            ctx = bc.ctx(seed, scale_inv=scale_inv, offsets=offsets)
            bc.assert_same_values_nan_anywhere(out.numpy(), want, "dequantized", ctx)


def test_descriptor_dtype_codes_match_the_core():
    """The descriptors above use te_dtype codes; make sure they are the C API's."""
    assert int(te_dtype(bc.FP8["e4m3"])) == DType.kFloat8E4M3
    assert int(te_dtype(bc.BF16)) == DType.kBFloat16
