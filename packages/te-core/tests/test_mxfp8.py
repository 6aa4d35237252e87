"""MXFP8 quantize/dequantize and the block-scale swizzle on the CPU backend,
bit-exact against the NumPy oracle (reference_mxfp8), plus hand-computed cases."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import FP8_FORMATS, INPUT_DTYPES, finfo, hostile

import transformer_engine.core as tc
from transformer_engine.core import reference_mxfp8 as ref
from transformer_engine.core._arrays import desc
from transformer_engine.core.reference import FP8_MAX, FP8_NUMPY

pytestmark = [pytest.mark.mxfp8, pytest.mark.swizzle]

lib = tc.lib
E8M0 = ml_dtypes.float8_e8m0fnu

# Shapes legal for every mode (M % 32 == 0), and shapes only rowwise allows.
SHAPES = [(32, 32), (96, 64), (160, 96), (2, 3, 32, 64), (64, 1024)]
ROWWISE_ONLY_SHAPES = [(1, 32), (5, 64), (33, 96), (3, 5, 160)]
# mode -> (rowwise, columnwise, use_2d_blocks)
MODES = {
    "rowwise": (True, False, False),
    "columnwise": (False, True, False),
    "both": (True, True, False),
    "2d": (True, True, True),
}


def u8(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


def next_up(v, n=1) -> np.float32:
    """v moved by n float32 ulps (v > 0)."""
    return (np.array(v, np.float32).view(np.int32) + np.int32(n)).view(np.float32)[()]


def block_pattern(rng, kind: str, n: int, fmt: str, dtype) -> np.ndarray:
    """n float32 values for one block (or tile) of a hostile kind."""
    fp8_max = np.float32(FP8_MAX[fmt])
    signs = rng.choice([-1.0, 1.0], n).astype(np.float32)
    if kind == "denormal":  # subnormals of the input type only
        tiny = np.float32(finfo(dtype).smallest_subnormal)
        return (rng.integers(0, 8, n) * tiny * signs).astype(np.float32)
    if kind == "nan":
        return np.full(n, np.nan, np.float32)
    if kind == "zeros":
        return (0.0 * signs).astype(np.float32)
    if kind == "inf":
        v = rng.standard_normal(n).astype(np.float32)
        v[rng.integers(n)] = np.inf * signs[0]
        return v
    if kind == "tiny":  # amax * rcp at or just above 2^-127: e = 0 or 1
        amax = next_up(fp8_max * np.float32(2.0**-127), int(rng.integers(0, 3)))
        v = (rng.random(n) * amax).astype(np.float32) * signs
    else:  # amax exactly fp8_max * 2^k, or one ulp of fp8_max below/above it
        ulps = {"pow2": 0, "pow2_below": -1, "pow2_above": 1}[kind]
        amax = next_up(fp8_max, ulps) * np.float32(2.0 ** int(rng.integers(-20, 20)))
        v = (rng.random(n) * amax).astype(np.float32) * signs
    v[rng.integers(n)] = amax * signs[0]
    return v


PATTERNS = ["nan", "zeros", "denormal", "inf", "tiny", "pow2", "pow2_below", "pow2_above"]


def mxfp8_hostile(rng, shape, dtype, fmt: str) -> np.ndarray:
    """hostile() values, with whole 1x32 segments and 32x32 tiles overwritten by
    block patterns (NaN, zeros, subnormals, inf, tiny and power-of-two amaxes)."""
    x = hostile(rng, shape, dtype, fmt).astype(np.float32).reshape(-1, shape[-1])
    m, k = x.shape
    for kind in PATTERNS:
        r, j = int(rng.integers(m)), int(rng.integers(k // 32))
        x[r, 32 * j : 32 * j + 32] = block_pattern(rng, kind, 32, fmt, dtype)
        r0 = 32 * int(rng.integers(max(1, m // 32)))
        rows = min(32, m - r0)
        x[r0 : r0 + rows, 32 * j : 32 * j + 32] = block_pattern(rng, kind, rows * 32, fmt, dtype).reshape(rows, 32)
    with np.errstate(over="ignore"):
        return x.astype(dtype).reshape(shape)


def check_quantize(x, fmt, mode, swizzled):
    rowwise, columnwise, use_2d = MODES[mode]
    out = tc.quantize_mxfp8(
        x, fmt, rowwise=rowwise, columnwise=columnwise, use_2d_blocks=use_2d, swizzled_scales=swizzled
    )
    for wanted, is_col, data, scales in (
        (rowwise, False, out.rowwise, out.rowwise_scale_inv),
        (columnwise, True, out.columnwise, out.columnwise_scale_inv),
    ):
        if not wanted:
            assert data is None and scales is None
            continue
        q, s = ref.quantize_mxfp8(x, fmt, columnwise=is_col, use_2d_blocks=use_2d, swizzled=swizzled)
        assert data.dtype == FP8_NUMPY[fmt] and data.shape == x.shape
        assert scales.dtype == E8M0 and scales.shape == tc.mxfp8_scale_shape(x.shape, is_col)
        np.testing.assert_array_equal(u8(data), q)
        np.testing.assert_array_equal(u8(scales), u8(s))
    if use_2d:  # one scale per tile: both directions hold the same bytes
        np.testing.assert_array_equal(u8(out.rowwise), u8(out.columnwise))
    return out


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_quantize_is_bit_exact(rng, fmt, dtype, shape, mode, swizzled):
    check_quantize(mxfp8_hostile(rng, shape, dtype, fmt), fmt, mode, swizzled)


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("shape", ROWWISE_ONLY_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_rowwise_allows_any_row_count(rng, fmt, dtype, shape, swizzled):
    check_quantize(mxfp8_hostile(rng, shape, dtype, fmt), fmt, "rowwise", swizzled)


def test_e8m0_round_up_rule_by_hand():
    """The oracle's E8M0 rule on hand-picked values (te/mxfp8.h)."""
    tiny = np.float32(2.0**-127)  # subnormal, mantissa 0x400000
    cases = [
        (0.0, 0),
        (2.0**-149, 0),
        (tiny, 0),
        (next_up(tiny), 1),
        (2.0**-126, 1),
        (0.75, 127),
        (1.0, 127),
        (next_up(1.0), 128),
        (2.0, 128),
        (3.0, 129),
        (2.0**127, 254),
        (1.5 * 2.0**127, 254),
        (np.finfo(np.float32).max, 254),
        (np.inf, 254),
        (np.nan, 255),
    ]
    values = np.array([v for v, _ in cases], np.float32)
    np.testing.assert_array_equal(ref.e8m0_round_up(values), [e for _, e in cases])


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_multiply_and_division_agree_near_power_of_two_boundaries(fmt):
    """docs/numerics.md: for every FP32 amax within 3000 ulps of fp8_max * 2^k, the
    reference's multiply by fl32(1/fp8_max) and a true division give the same e."""
    fp8_max = np.float32(FP8_MAX[fmt])
    k = np.arange(-149, 128)
    with np.errstate(over="ignore"):
        centers = (fp8_max * np.exp2(k.astype(np.float64))).astype(np.float32)
    centers = centers[np.isfinite(centers) & (centers > 0)]
    bits = centers.view(np.int32)[:, None] + np.arange(-3000, 3001, dtype=np.int32)
    amax = bits.reshape(-1).view(np.float32)
    amax = amax[np.isfinite(amax) & (amax > 0)]
    by_multiply = ref.e8m0_round_up(amax * ref.max_reciprocal(fmt))
    by_division = ref.e8m0_round_up(amax / fp8_max)
    np.testing.assert_array_equal(by_multiply, by_division)


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_hostile_blocks_by_hand(rng, fmt):
    """Rowwise blocks with known scale bytes and data (FP32 input)."""
    fp8_max = np.float32(FP8_MAX[fmt])
    max_byte = {"e4m3": 0x7E, "e5m2": 0x7B}[fmt]
    x = rng.standard_normal((32, 64)).astype(np.float32)
    x[0, :32] = np.nan
    x[1, :32] = np.where(np.arange(32) % 2, -0.0, 0.0)
    x[2, :32] = 1.0
    x[2, :4] = [np.inf, -np.inf, 3e38, -1.0]
    rows = {
        3: fp8_max * 8,
        4: next_up(fp8_max, -1) * 8,
        5: next_up(fp8_max) * 8,
        6: fp8_max * np.float32(2.0**-127),
        7: np.float32(2.0**-149),
    }
    for r, amax in rows.items():
        x[r, :32] = amax / 4
        x[r, 5] = amax
    out = tc.quantize_mxfp8(x, fmt)
    data, scales = u8(out.rowwise), u8(out.rowwise_scale_inv)
    expected_e = {0: 0, 1: 0, 2: 254, 3: 130, 4: 130, 5: 131, 6: 0, 7: 0}
    for r, e in expected_e.items():
        assert scales[r, 0] == e, (r, scales[r, 0], e)
    assert (data[0, :32] == 0x7F).all()  # all-NaN block: e = 0, NaN bytes
    np.testing.assert_array_equal(data[1, :32], np.where(np.arange(32) % 2, 0x80, 0x00))
    assert list(data[2, :2]) == [max_byte, 0x80 | max_byte]  # +-inf saturate under e = 254
    assert data[2, 3] == 0x80 and data[2, 4] == 0  # finite * 2^-127 -> +-0
    assert data[2, 2] == u8(np.array([np.float32(3e38) * np.float32(2.0**-127)]).astype(FP8_NUMPY[fmt]))[0]
    assert data[3, 5] == max_byte and data[4, 5] == max_byte  # lands exactly on 2^3: no round-up
    half = u8(np.array([next_up(fp8_max) / 2], np.float32).astype(FP8_NUMPY[fmt]))[0]
    assert data[5, 5] == half  # one ulp above: the exponent rounds up, the value halves
    assert data[6, 5] == max_byte  # e = 0 scales by 2^127
    assert data[7, 5] == 0
    q, s = ref.quantize_mxfp8(x, fmt)
    np.testing.assert_array_equal(data, q)
    np.testing.assert_array_equal(scales, u8(s))


def test_2d_tile_scale_layouts(rng):
    """A 32x32 tile's scale is repeated over its 32 rows / 32 columns."""
    x = rng.standard_normal((64, 96)).astype(np.float32)
    x[32:64, 32:64] *= 1000
    out = tc.quantize_mxfp8(x, "e4m3", columnwise=True, use_2d_blocks=True)
    row, col = u8(out.rowwise_scale_inv), u8(out.columnwise_scale_inv)
    tiles = ref.block_exponents(x, "e4m3", "2d")  # [2, 3]
    np.testing.assert_array_equal(row[:64, :3], np.repeat(tiles, 32, axis=0))
    np.testing.assert_array_equal(col[:2, :96], np.repeat(tiles, 32, axis=1))
    assert tiles[1, 1] > tiles[0, 0]


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("shape,mode", [((33, 96), "rowwise"), ((96, 64), "both"), ((64, 160), "2d")])
def test_padding_is_written_as_zero(rng, shape, mode, swizzled):
    rowwise, columnwise, use_2d = MODES[mode]
    x = mxfp8_hostile(rng, shape, np.float32, "e4m3")
    buffers = []
    for wanted, is_col in ((rowwise, False), (columnwise, True)):
        data = np.zeros(shape, FP8_NUMPY["e4m3"]) if wanted else None
        scales = np.full(tc.mxfp8_scale_shape(shape, is_col), 0xAB, np.uint8).view(E8M0) if wanted else None
        buffers += [data, scales]
    lib.quantize_mxfp8(desc(x), *(None if b is None else desc(b) for b in buffers), use_2d, swizzled)
    for is_col, scales in ((False, buffers[1]), (True, buffers[3])):
        if scales is None:
            continue
        _, expected = ref.quantize_mxfp8(x, "e4m3", columnwise=is_col, use_2d_blocks=use_2d, swizzled=swizzled)
        np.testing.assert_array_equal(u8(scales), u8(expected))
        assert 0xAB not in u8(scales)


# ---- swizzle -----------------------------------------------------------------


def test_swizzle_hand_example_rowwise():
    s = ((np.arange(256)[:, None] * 4 + np.arange(8)) % 251).astype(np.uint8)  # [256, 8]
    out = tc.swizzle_block_scales(s).reshape(-1)
    # tile (0, 0): rows 0, 32, 64, 96 (scales 0..3), then row 1, ...
    assert list(out[:20]) == [0, 1, 2, 3, 128, 129, 130, 131, 5, 6, 7, 8, 133, 134, 135, 136, 4, 5, 6, 7]
    assert list(out[508:512]) == list(s[127, :4])
    assert list(out[512:516]) == [4, 5, 6, 7]  # tile (0, 1): row 0, scales 4..7
    assert list(out[1024:1028]) == list(s[128, :4])  # tile (1, 0)


def test_swizzle_hand_example_columnwise():
    s = ((np.arange(4)[:, None] * 128 + np.arange(128)) % 251).astype(np.uint8)  # [4, 128]
    out = tc.swizzle_block_scales(s, columnwise=True).reshape(-1)
    # the transpose is swizzled: column c plays the row, the 4 row-blocks the scales
    assert list(out[:8]) == [0, 128, 5, 133, 32, 160, 37, 165]
    assert list(out[16:20]) == [1, 129, 6, 134]


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("tiles", [(1, 1), (2, 2), (3, 3), (1, 10)])
def test_swizzle_round_trip(rng, columnwise, tiles):
    shape = (tiles[0] * 128, tiles[1] * 4)
    shape = shape[::-1] if columnwise else shape
    s = rng.integers(0, 256, shape, dtype=np.uint8).view(E8M0)
    swz = tc.swizzle_block_scales(s, columnwise=columnwise)
    assert swz.dtype == E8M0 and swz.shape == s.shape
    np.testing.assert_array_equal(u8(swz), u8(ref.swizzle(s, columnwise)))
    np.testing.assert_array_equal(u8(tc.unswizzle_block_scales(swz, columnwise=columnwise)), u8(s))
    np.testing.assert_array_equal(u8(ref.unswizzle(swz, columnwise)), u8(s))


@pytest.mark.parametrize("shape", [(96, 64), (160, 288), (2, 3, 32, 64)])
def test_swizzled_quantize_equals_swizzle_of_compact(rng, shape):
    x = mxfp8_hostile(rng, shape, ml_dtypes.bfloat16, "e4m3")
    compact = tc.quantize_mxfp8(x, columnwise=True)
    swizzled = tc.quantize_mxfp8(x, columnwise=True, swizzled_scales=True)
    np.testing.assert_array_equal(u8(swizzled.rowwise), u8(compact.rowwise))
    np.testing.assert_array_equal(u8(swizzled.columnwise), u8(compact.columnwise))
    np.testing.assert_array_equal(
        u8(swizzled.rowwise_scale_inv), u8(tc.swizzle_block_scales(compact.rowwise_scale_inv))
    )
    np.testing.assert_array_equal(
        u8(swizzled.columnwise_scale_inv), u8(tc.swizzle_block_scales(compact.columnwise_scale_inv, columnwise=True))
    )


# ---- dequantize --------------------------------------------------------------


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("out_dtype", INPUT_DTYPES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_dequantize_is_bit_exact(rng, fmt, out_dtype, columnwise, swizzled):
    x = mxfp8_hostile(rng, (96, 160), np.float32, fmt)
    out = tc.quantize_mxfp8(x, fmt, rowwise=not columnwise, columnwise=columnwise, swizzled_scales=swizzled)
    q, s = (out.columnwise, out.columnwise_scale_inv) if columnwise else (out.rowwise, out.rowwise_scale_inv)
    y = tc.dequantize_mxfp8(q, s, columnwise=columnwise, swizzled_scales=swizzled, out_dtype=out_dtype)
    expected = ref.dequantize_mxfp8(q, s, fmt, columnwise, swizzled, out_dtype)
    assert y.dtype == np.dtype(out_dtype) and y.shape == x.shape
    nan = np.isnan(y.astype(np.float32))  # NaN payloads may differ (the core writes 0x7FFF)
    np.testing.assert_array_equal(nan, np.isnan(expected.astype(np.float32)))
    np.testing.assert_array_equal(y[~nan].view(np.uint8), expected[~nan].view(np.uint8))


def test_dequantize_decodes_every_scale_byte(rng):
    """e = 0 decodes to 2^-127 (subnormal), e = 255 to NaN, 254 to 2^127."""
    q = np.full((1, 256 * 32), 0x7E, np.uint8).view(FP8_NUMPY["e4m3"])  # 448 everywhere
    s = np.zeros((128, 256), np.uint8)
    s[0] = np.arange(256)
    y = tc.dequantize_mxfp8(q, s.view(E8M0)).reshape(256, 32)[:, 0]
    with np.errstate(over="ignore"):
        expected = np.float32(448.0) * np.exp2(np.arange(256) - 127.0).astype(np.float32)
    expected[255] = np.nan
    np.testing.assert_array_equal(y, expected)
    assert y[0] == np.float32(448.0 * 2.0**-127) and y[0] != 0
    assert np.isinf(y[254])


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_round_trip_error_bound(rng, fmt, columnwise):
    """|dequant(quant(x)) - x| <= half a step of the scaled FP8 grid."""
    mantissa_bits, smallest_subnormal = {"e4m3": (3, 2.0**-9), "e5m2": (2, 2.0**-16)}[fmt]
    x = (rng.standard_normal((128, 256)) * np.exp2(rng.integers(-30, 30, (128, 1)))).astype(np.float32)
    out = tc.quantize_mxfp8(x, fmt, rowwise=not columnwise, columnwise=columnwise)
    q, s = (out.columnwise, out.columnwise_scale_inv) if columnwise else (out.rowwise, out.rowwise_scale_inv)
    y = tc.dequantize_mxfp8(q, s, columnwise=columnwise)
    e = ref.block_exponents(x, fmt, "columnwise" if columnwise else "rowwise")
    scale = ref.expand_to_elements(e, "columnwise" if columnwise else "rowwise").astype(np.float64) - 127
    bound = np.maximum(np.abs(x) * 2.0 ** -(mantissa_bits + 1), np.exp2(scale) * smallest_subnormal / 2)
    assert (np.abs(y.astype(np.float64) - x) <= bound).all()
    assert np.abs(y - x).max() > 0  # the test is not vacuous


# ---- errors ------------------------------------------------------------------


def e8m0(*shape):
    return np.zeros(shape, E8M0)


def fp8(*shape, fmt="e4m3"):
    return np.zeros(shape, FP8_NUMPY[fmt])


def test_last_dim_must_be_divisible_by_32():
    with pytest.raises(ValueError, match="MXFP8 needs the last dimension divisible by 32, got 100"):
        tc.quantize_mxfp8(np.ones((4, 100), np.float32))


def test_input_needs_two_dims():
    with pytest.raises(ValueError, match=r"MXFP8 needs an input of at least 2 dimensions, got 'input' of shape \[64\]"):
        tc.quantize_mxfp8(np.ones(64, np.float32))


@pytest.mark.parametrize(
    "kwargs,what", [({"columnwise": True}, r"columnwise \(32x1\)"), ({"use_2d_blocks": True}, r"2-D \(32x32\)")]
)
def test_rows_must_be_divisible_by_32_for_columnwise_and_2d(kwargs, what):
    with pytest.raises(
        ValueError,
        match=f"MXFP8 {what} blocks need the product of the leading dimensions of '.*' divisible by 32, got 40",
    ):
        tc.quantize_mxfp8(np.ones((4, 10, 64), np.float32), **kwargs)


def test_scale_buffer_shape_and_dtype():
    x = np.ones((5, 64), np.float32)
    with pytest.raises(ValueError, match=r"argument 'rowwise_scale_inv' must have shape \[128, 4\] .*got \[5, 2\]"):
        lib.quantize_mxfp8(desc(x), desc(fp8(5, 64)), desc(e8m0(5, 2)), None, None)
    with pytest.raises(TypeError, match="argument 'rowwise_scale_inv' must be float8_e8m0, got byte"):
        lib.quantize_mxfp8(desc(x), desc(fp8(5, 64)), desc(np.zeros((128, 4), np.uint8)), None, None)
    with pytest.raises(ValueError, match=r"argument 'columnwise_scale_inv' must have shape \[4, 128\]"):
        lib.quantize_mxfp8(desc(np.ones((32, 64), np.float32)), None, None, desc(fp8(32, 64)), desc(e8m0(1, 64)))


def test_data_and_scales_come_in_pairs():
    x = np.ones((32, 64), np.float32)
    with pytest.raises(ValueError, match="arguments 'rowwise' and 'rowwise_scale_inv' must be given together"):
        lib.quantize_mxfp8(desc(x), desc(fp8(32, 64)), None, None, None)
    with pytest.raises(ValueError, match="at least one of 'rowwise' and 'columnwise' must be given"):
        lib.quantize_mxfp8(desc(x), None, None, None, None)
    with pytest.raises(TypeError, match="'rowwise' and 'columnwise' must have the same FP8 type"):
        lib.quantize_mxfp8(
            desc(x), desc(fp8(32, 64)), desc(e8m0(128, 4)), desc(fp8(32, 64, fmt="e5m2")), desc(e8m0(4, 128))
        )


def test_bad_types_are_type_errors():
    with pytest.raises(TypeError, match="argument 'x' must be float32, bfloat16 or float16, got float64"):
        tc.quantize_mxfp8(np.ones((32, 64)))
    with pytest.raises(TypeError, match="argument 'rowwise' must be float8_e4m3 or float8_e5m2, got float32"):
        lib.quantize_mxfp8(
            desc(np.ones((32, 64), np.float32)), desc(np.ones((32, 64), np.float32)), desc(e8m0(128, 4)), None, None
        )


def test_dequantize_errors():
    with pytest.raises(ValueError, match=r"argument 'output' must have the shape of 'input' \[32, 64\]"):
        lib.dequantize_mxfp8(desc(fp8(32, 64)), desc(e8m0(128, 4)), desc(np.zeros((64, 32), np.float32)))
    with pytest.raises(TypeError, match="argument 'scale_inv' must be float8_e8m0fnu, got uint8"):
        tc.dequantize_mxfp8(fp8(32, 64), np.zeros((128, 4), np.uint8))
    with pytest.raises(ValueError, match=r"MXFP8 columnwise \(32x1\) blocks need .* got 40"):
        tc.dequantize_mxfp8(fp8(40, 64), e8m0(4, 128), columnwise=True)
    with pytest.raises(ValueError, match=r"argument 'scale_inv' must have shape \[4, 128\]"):
        tc.dequantize_mxfp8(fp8(32, 64), e8m0(128, 4), columnwise=True)


def test_swizzle_errors():
    with pytest.raises(
        ValueError,
        match=r"rowwise block scales must be padded to rows % 128 == 0 and columns % 4 == 0, "
        r"got argument 'input' of shape \[100, 4\]",
    ):
        tc.swizzle_block_scales(e8m0(100, 4))
    with pytest.raises(
        ValueError, match=r"columnwise block scales must be padded to rows % 4 == 0 and columns % 128 == 0"
    ):
        tc.swizzle_block_scales(e8m0(128, 4), columnwise=True)
    with pytest.raises(ValueError, match="argument 'input' must be a 2-D scale matrix"):
        tc.unswizzle_block_scales(e8m0(512))
    with pytest.raises(TypeError, match="argument 'input' must be a one-byte type"):
        lib.swizzle_block_scales(desc(np.zeros((128, 4), np.float32)), desc(np.zeros((128, 4), np.float32)))
    s = e8m0(128, 4)
    with pytest.raises(
        ValueError, match="argument 'output' is written by this call but shares memory with argument 'input'"
    ):
        lib.swizzle_block_scales(desc(s), desc(s))
    with pytest.raises(TypeError, match="argument 'output' must be float8_e8m0, got byte"):
        lib.swizzle_block_scales(desc(s), desc(np.zeros((128, 4), np.uint8)))


@pytest.mark.skipif(tc.built_with_cuda(), reason="checks the CPU-only build's message")
def test_cuda_descriptor_without_cuda_backend():
    x = np.ones((32, 64), np.float32)
    q, s = fp8(32, 64), e8m0(128, 4)

    def on_gpu(a):
        return lib.TensorDesc(a.ctypes.data, int(tc.te_dtype(a.dtype)), list(a.shape), 1, 0)

    with pytest.raises(NotImplementedError, match="no CUDA backend"):
        lib.quantize_mxfp8(on_gpu(x), on_gpu(q), on_gpu(s), None, None)
