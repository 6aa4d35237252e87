"""Per-tensor FP8 quantization on the CPU backend, bit-exact against the NumPy oracle."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FP8_FORMATS, INPUT_DTYPES, SHAPES, finfo, hostile

import transformer_engine.core as tc
from transformer_engine.core import reference as ref

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
