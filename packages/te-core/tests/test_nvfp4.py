"""NVFP4 quantization (round to nearest even) on the CPU backend, bit-exact
against the NumPy oracle: 1-D and 2-D blocks, rowwise and columnwise, scales,
padding, dequantize and the 2-D transpose; and every backend (the `device`
fixture, last section) byte for byte against the NumPy API."""

from __future__ import annotations

import core_device
import ml_dtypes
import numpy as np
import nvfp4_device as nd
import pytest
from conftest import CUDA_ONLY, gpu_scale
from nvfp4_helpers import (
    COLUMNWISE_SHAPES,
    INPUT_DTYPES,
    ROWWISE_SHAPES,
    assert_same_bytes,
    check_against_oracle,
    common_blocks,
    hostile,
)

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core import reference_nvfp4 as ref

pytestmark = pytest.mark.nvfp4


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_rowwise_1d_is_bit_exact(rng, shape, dtype):
    x = hostile(rng, shape, dtype)
    out = tc.quantize_nvfp4(x)
    assert out.rowwise.shape == shape[:-1] + (shape[-1] // 2,)
    assert out.amax_rowwise == ref.amax(x)
    check_against_oracle(x, out)


@pytest.mark.parametrize("shape", COLUMNWISE_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("with_inf", [False, True])
def test_rowwise_and_columnwise_1d_are_bit_exact(rng, shape, dtype, with_inf):
    x = hostile(rng, shape, dtype, with_inf=with_inf)
    out = tc.quantize_nvfp4(x, columnwise=True)
    m, k = int(np.prod(shape[:-1])), shape[-1]
    assert out.columnwise.shape == (k, m // 2)
    assert out.columnwise_scale.shape == ref.scale_shape(k, m)
    assert out.amax_columnwise == out.amax_rowwise == ref.amax(x)
    check_against_oracle(x, out, columnwise=True)


@pytest.mark.parametrize("shape", COLUMNWISE_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_2d_is_bit_exact_and_tiles_share_one_scale(rng, shape, dtype):
    x = hostile(rng, shape, dtype)
    out = tc.quantize_nvfp4(x, columnwise=True, block_2d=True)
    check_against_oracle(x, out, columnwise=True, block_2d=True)
    m, k = int(np.prod(shape[:-1])), shape[-1]
    scales = out.rowwise_scale.view(np.uint8)[:m, : k // 16].reshape(m // 16, 16, k // 16)
    assert (scales == scales[:, :1, :]).all()


@pytest.mark.parametrize("shape", COLUMNWISE_SHAPES)
def test_2d_columnwise_is_the_transpose_of_rowwise(rng, shape):
    x = hostile(rng, shape, ml_dtypes.bfloat16)
    out = tc.quantize_nvfp4(x, columnwise=True, block_2d=True)
    k = shape[-1]
    row_codes = tc.unpack_fp4(out.rowwise).view(np.uint8).reshape(-1, k)
    col_codes = tc.unpack_fp4(out.columnwise).view(np.uint8)
    np.testing.assert_array_equal(col_codes, row_codes.T)


@pytest.mark.parametrize("shape", COLUMNWISE_SHAPES)
@pytest.mark.parametrize("stochastic", [False, True])
def test_transpose_2d_equals_columnwise_quantization(rng, shape, stochastic):
    x = hostile(rng, shape, np.float32)
    seed = int(rng.integers(0, 2**63))
    out = tc.quantize_nvfp4(x, columnwise=True, block_2d=True, stochastic_rounding=stochastic, seed=seed)
    col, col_scale = tc.transpose_nvfp4_2d(out.rowwise, out.rowwise_scale)
    assert_same_bytes(col, out.columnwise, "columnwise data")
    assert_same_bytes(col_scale, out.columnwise_scale, "columnwise scale")


def test_scale_padding_is_zero(rng):
    x = rng.standard_normal((48, 80)).astype(np.float32) + 3  # no zero block: every real scale > 0
    out = tc.quantize_nvfp4(x, columnwise=True)
    rs = out.rowwise_scale.view(np.uint8)
    cs = out.columnwise_scale.view(np.uint8)
    assert rs.shape == (128, 8) and cs.shape == (128, 4)
    assert (rs[:48, :5] != 0).all() and not rs[48:].any() and not rs[:, 5:].any()
    assert (cs[:80, :3] != 0).all() and not cs[80:].any() and not cs[:, 3:].any()


def test_e2m1_ties_round_to_even():
    """Global amax 2688 gives S_enc = 1; a block with max 6 gets the scale 1 and
    enc_b = 1, so its values are rounded on the E2M1 grid as they are."""
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    others = [0.26, 0.74, 1.26, 1.74, 2.51, 3.49, 5.01, 6.0, -0.0, 0.1, -0.1, np.nan, 0.0, 3.0, 4.0, -6.0]
    x = np.zeros((1, 48), np.float32)
    x[0, :16] = ties + [-t for t in ties]
    x[0, 16:32] = others
    x[0, 32] = 2688.0
    out = tc.quantize_nvfp4(x)
    assert out.amax_rowwise == 2688.0
    assert list(out.rowwise_scale.view(np.uint8)[0, :3]) == [0x38, 0x38, 0x7E]  # 1, 1, 448
    codes = tc.unpack_fp4(out.rowwise).view(np.uint8)[0]
    assert list(codes[:8]) == [0, 2, 2, 4, 4, 6, 6, 7]  # 0, 1, 1, 2, 2, 4, 4, 6
    assert list(codes[8:16]) == [8, 10, 10, 12, 12, 14, 14, 15]  # the same, negative
    assert list(codes[16:32]) == [1, 1, 3, 3, 5, 5, 7, 7, 8, 0, 8, 7, 0, 5, 6, 15]
    assert codes[32] == 7 and not codes[33:].any()
    assert_same_bytes(out.rowwise, ref.quantize(x)["rowwise"])


def test_e2m1_rounding_of_many_values(rng):
    """With enc_b = 1 (global amax 2688, each block's max 6) the codes are the E2M1
    rounding of the inputs themselves: random values and the neighbours of every
    rounding threshold, both signs, against ml_dtypes."""
    thresholds = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32)
    near, below, above = [thresholds], thresholds, thresholds
    for _ in range(3):  # three floats on each side of each threshold
        below, above = np.nextafter(below, np.float32(0)), np.nextafter(above, np.float32(7))
        near += [below, above]
    values = np.concatenate(
        near + [rng.uniform(0, 6, 20000).astype(np.float32), (2.0 ** rng.uniform(-40, 2.5, 5000)).astype(np.float32)]
    )
    values = np.concatenate([values, -values])
    values = np.concatenate([values, np.zeros((-values.size) % 15, np.float32)]).reshape(-1, 15)
    x = np.concatenate([np.full((values.shape[0], 1), 6.0, np.float32), values], axis=1)  # [n, 16]
    x[0, 0] = 2688.0  # the global amax; this block gets scale 448 instead
    out = tc.quantize_nvfp4(x)
    codes = tc.unpack_fp4(out.rowwise).view(np.uint8).reshape(-1, 16)[1:, 1:]
    np.testing.assert_array_equal(codes, ref.e2m1_nearest(x.reshape(-1, 16)[1:, 1:]))


def test_infinities_saturate_and_nan_gives_plus_six():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [np.inf, -np.inf, 1.0, np.nan]
    x[0, 16] = 5.0
    out = tc.quantize_nvfp4(x)
    assert out.amax_rowwise == np.inf  # S_enc = 1; block 0's scale saturates to 448
    assert out.rowwise_scale.view(np.uint8)[0, 0] == 0x7E
    codes = tc.unpack_fp4(out.rowwise).view(np.uint8)[0]
    assert list(codes[:4]) == [0x7, 0xF, 0x0, 0x7]
    assert_same_bytes(out.rowwise, ref.quantize(x)["rowwise"])
    assert_same_bytes(out.rowwise_scale, ref.quantize(x)["rowwise_scale"])


def test_block_scale_multiplies_by_the_fp32_reciprocal_of_6():
    """s_b = e4m3(block_amax * (S_enc * float32(1/6))), as the reference kernel; dividing
    S_enc by 6 instead gives another FP32 value, which here rounds to another E4M3 byte."""
    amax = np.array([0x446D2CDA], np.uint32).view(np.float32)[0]  # 948.7008
    block_amax = np.array([0x400FFFCE], np.uint32).view(np.float32)[0]  # 2.249988
    s_enc = np.float32(2688.0) / amax
    by_reciprocal = ref.to_e4m3_bytes(block_amax * (s_enc * (np.float32(1) / np.float32(6))))
    by_division = ref.to_e4m3_bytes(block_amax * (s_enc / np.float32(6)))
    assert by_reciprocal != by_division
    x = np.zeros((1, 16), np.float32)
    x[0, 0] = block_amax
    out = tc.quantize_nvfp4(x, amax_rowwise=amax)
    assert out.rowwise_scale.view(np.uint8)[0, 0] == by_reciprocal


@pytest.mark.parametrize(
    "amax,expected",
    [
        (0.0, 1.0),
        (np.inf, 1.0),  # 2688 / inf = 0
        (np.nan, ref.FLT_MAX),  # fmin(NaN, FLT_MAX) = FLT_MAX, as the reference's fminf
        (1e-45, ref.FLT_MAX),  # overflow
        (2688.0, 1.0),
        (3.0, np.float32(2688.0) / np.float32(3.0)),
    ],
)
def test_global_encode_scale_edge_cases(rng, amax, expected):
    assert ref.global_encode_scale(amax) == np.float32(expected)
    x = hostile(rng, (16, 32), np.float32)
    out = tc.quantize_nvfp4(x, columnwise=True, amax_rowwise=amax, amax_columnwise=amax)
    check_against_oracle(x, out, columnwise=True)


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_all_zero_and_all_nan_tensors(dtype):
    zeros = np.zeros((16, 32), dtype)
    out = tc.quantize_nvfp4(zeros, columnwise=True)
    assert out.amax_rowwise == 0 and not out.rowwise.any() and not out.rowwise_scale.view(np.uint8).any()
    nans = np.full((16, 32), np.nan, dtype)
    out = tc.quantize_nvfp4(nans, columnwise=True)
    assert out.amax_rowwise == 0
    assert (out.rowwise == 0x77).all() and (out.columnwise == 0x77).all()  # NaN -> +6


def test_denormal_inputs_and_tiny_amax(rng):
    x = (rng.standard_normal((32, 48)) * 1e-41).astype(np.float32)  # FP32 denormals
    out = tc.quantize_nvfp4(x, columnwise=True)
    assert ref.global_encode_scale(out.amax_rowwise) == ref.FLT_MAX
    check_against_oracle(x, out, columnwise=True)


def test_given_amax_is_used_not_recomputed(rng):
    x = rng.standard_normal((32, 32)).astype(np.float32)
    out = tc.quantize_nvfp4(x, columnwise=True, amax_rowwise=100.0, amax_columnwise=0.5)
    assert out.amax_rowwise == 100.0 and out.amax_columnwise == 0.5
    check_against_oracle(x, out, columnwise=True)


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
@pytest.mark.parametrize("out_dtype", INPUT_DTYPES)
def test_dequantize_matches_oracle(rng, shape, out_dtype):
    m, k = int(np.prod(shape[:-1])), shape[-1]
    data = rng.integers(0, 256, size=shape[:-1] + (k // 2,), dtype=np.uint8)
    scale = rng.integers(0, 256, size=ref.scale_shape(m, k), dtype=np.uint8)
    scale[scale & 0x7F == 0x7F] = 0x3F  # no NaN scales
    amax = np.float32(rng.choice([0.0, 3.0, 1e4, 7e-3, np.inf]))
    scale = scale.view(ml_dtypes.float8_e4m3fn)
    out = tc.dequantize_nvfp4(data, scale, amax, out_dtype)
    assert out.shape == shape and out.dtype == np.dtype(out_dtype)
    expected = ref.dequantize(data, scale, amax, out_dtype)
    assert_same_bytes(out, expected)


def assert_close_to_blocks(back, x):
    """|x - back| <= (1/6 + 1/16) of the 16-block's amax: half the largest E2M1 step (1 of 6)
    at a scale that E4M3 rounding moves by at most 2^-4; saturation stays inside too."""
    k = x.shape[-1]
    block_amax = np.repeat(np.abs(x.reshape(-1, k // 16, 16)).max(-1), 16, axis=-1).reshape(x.shape)
    assert np.all(np.abs(back - x) <= block_amax * (1 / 6 + 1 / 16))


@pytest.mark.parametrize("shape", COLUMNWISE_SHAPES)
def test_round_trip_error_is_bounded(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    out = tc.quantize_nvfp4(x, columnwise=True)
    assert_close_to_blocks(tc.dequantize_nvfp4(out.rowwise, out.rowwise_scale, out.amax_rowwise), x)
    back_t = tc.dequantize_nvfp4(out.columnwise, out.columnwise_scale, out.amax_columnwise)
    assert_close_to_blocks(back_t, np.ascontiguousarray(x.reshape(-1, shape[-1]).T))


def test_pack_unpack_round_trip(rng):
    codes = rng.integers(0, 16, size=(5, 32), dtype=np.uint8)
    packed = tc.pack_fp4(codes)
    assert packed.shape == (5, 16)
    assert (packed[:, 0] & 0xF == codes[:, 0]).all() and (packed[:, 0] >> 4 == codes[:, 1]).all()
    values = tc.unpack_fp4(packed)
    assert values.dtype == np.dtype(ml_dtypes.float4_e2m1fn)
    np.testing.assert_array_equal(values.view(np.uint8), codes)
    np.testing.assert_array_equal(values.astype(np.float32), ref.e2m1_values(codes))
    np.testing.assert_array_equal(tc.pack_fp4(values), packed)


def test_compute_amax_directions(rng):
    x = hostile(rng, (48, 64), ml_dtypes.bfloat16)
    row, col = tc.compute_amax_nvfp4(x)
    assert row == col == ref.amax(x)


# ---- every backend, raw buffers (nvfp4_device) -----------------------------
# Rowwise-only shapes: any rows. Both directions: rows % 16 == 0. They cover
# partial CUDA tiles in both dims (64 rows x 256 bytes: 64x128 for 16-bit
# inputs, 64x64 for FP32) and rows % 32 != 0 (8-byte columnwise stores).
DEVICE_ROWWISE_SHAPES = [(1, 16), (5, 160), (3, 7, 48), (77, 272), (130, 64)]
DEVICE_BOTH_SHAPES = [(16, 16), (48, 64), (80, 272), (3, 16, 32), (128, 256), *gpu_scale((192, 4096), (2048, 528))]
DEVICE_MODES = {
    "1d": {},
    "2d": {"block_2d": True},
    "sr": {"stochastic_rounding": True},
    "2d_sr": {"block_2d": True, "stochastic_rounding": True},
    "rht": {"random_hadamard": True},
    "rht_sr": {"random_hadamard": True, "stochastic_rounding": True},
}


@pytest.mark.parametrize("shape", DEVICE_ROWWISE_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("mode", ["1d", "sr"])
def test_device_rowwise_only_matches_numpy_api(device, rng, shape, dtype, mode):
    x = hostile(rng, shape, dtype)
    nd.compare_with_numpy_api(x, columnwise=False, seed=int(rng.integers(0, 2**62)), **DEVICE_MODES[mode])


@pytest.mark.parametrize("shape", DEVICE_BOTH_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("mode", list(DEVICE_MODES))
def test_device_both_directions_match_numpy_api(device, rng, shape, dtype, mode):
    x = hostile(rng, shape, dtype, with_inf=rng.random() < 0.3)
    seed, offset = (int(v) for v in rng.integers(0, 2**62, size=2))
    nd.compare_with_numpy_api(x, seed=seed, offset=offset, **DEVICE_MODES[mode])


@pytest.mark.parametrize("mode", ["1d", "rht", "2d_sr"])
def test_device_columnwise_only_matches_numpy_api(device, rng, mode):
    x = hostile(rng, (96, 208), ml_dtypes.bfloat16)
    nd.compare_with_numpy_api(x, rowwise=False, seed=5, offset=9, **DEVICE_MODES[mode])


def test_device_hostile_amaxes(device, rng):
    """Zero, all-NaN and infinite tensors; denormal inputs (S_enc = FLT_MAX)."""
    for x in (
        np.zeros((32, 48), np.float32),
        np.full((32, 48), np.nan, np.float32),
        (rng.standard_normal((32, 48)) * 1e-41).astype(np.float32),
    ):
        nd.compare_with_numpy_api(x)
        nd.compare_with_numpy_api(x, **DEVICE_MODES["rht_sr"])
    x = rng.standard_normal((32, 48)).astype(np.float32)
    x[3, 5] = np.inf
    nd.compare_with_numpy_api(x, **DEVICE_MODES["sr"])


# More tiles than resident CTAs (each CTA loops, prefetching the next tile; the
# tile steps wrap around the row of tiles), partial tiles on both edges,
# M % 32 == 16 (8-byte columnwise stores).
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("mode", list(DEVICE_MODES))
@pytest.mark.gpu_scale
def test_device_many_tiles_per_cta_match_numpy_api(device, rng, dtype, mode):
    x = nd.with_negative_nans(rng, hostile(rng, (6160, 1040), dtype))
    seed, offset = (int(v) for v in rng.integers(0, 2**62, size=2))
    nd.compare_with_numpy_api(x, seed=seed, offset=offset, **DEVICE_MODES[mode])


# The kernel of the common case (16-bit input, 1x16 blocks, RNE, no RHT) works
# on tiles of 128 rows x 128 columns: partial tiles in either dimension, a
# single partial tile, M % 32 == 16 (8-byte columnwise stores), K % 32 == 16
# (8-byte rowwise stores), each direction alone and both.
FAST_EDGE_SHAPES = [(48, 160), *gpu_scale((4112, 4096), (208, 4112)), (144, 400), (272, 48)]


@pytest.mark.parametrize("shape", FAST_EDGE_SHAPES)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("directions", ["both", "rowwise", "columnwise"])
def test_device_fast_kernel_tile_edges_match_numpy_api(device, rng, shape, dtype, directions):
    x = nd.with_negative_nans(rng, hostile(rng, shape, dtype, with_inf=rng.random() < 0.5))
    nd.compare_with_numpy_api(x, rowwise=directions != "columnwise", columnwise=directions != "rowwise")


@pytest.mark.parametrize("shape", FAST_EDGE_SHAPES)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("directions", ["both", "rowwise", "columnwise"])
@pytest.mark.parametrize("nan_every", [0, 3001], ids=["common", "mixed"])
def test_device_fast_kernel_common_blocks_match_numpy_api(device, rng, shape, dtype, directions, nan_every):
    """Blocks without special values take the fast kernel's packed route (the
    NaN-laced hostile inputs above send nearly every warp to its general
    route); "mixed" puts warps of both routes side by side."""
    x = common_blocks(rng, shape, dtype, nan_every)
    nd.compare_with_numpy_api(x, rowwise=directions != "columnwise", columnwise=directions != "rowwise")


def test_device_fast_kernel_common_blocks_different_global_amaxes(device, rng):
    x = common_blocks(rng, (208, 400), ml_dtypes.bfloat16)
    amax = float(np.max(np.abs(x.astype(np.float32))))
    nd.quantize_both_with_amaxes(x, (amax, amax * 3.0))


@pytest.mark.parametrize("shape", [(5, 160), *gpu_scale((130, 4112)), (1, 4096)])
def test_device_fast_kernel_rowwise_any_rows_match_numpy_api(device, rng, shape):
    nd.compare_with_numpy_api(hostile(rng, shape, ml_dtypes.bfloat16), columnwise=False)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_device_fast_kernel_hostile_amaxes(device, rng, dtype):
    """Zero (S_enc = 1), all-NaN and denormal 16-bit tensors on the fast kernel."""
    tiny = ml_dtypes.finfo(dtype).smallest_subnormal
    for x in (
        np.zeros((32, 160), dtype),
        np.full((32, 160), np.nan, dtype),
        (rng.integers(-3, 4, (32, 160)) * tiny).astype(dtype),
    ):
        nd.compare_with_numpy_api(x)


def test_device_fast_kernel_different_global_amaxes(device, rng):
    """Each direction quantizes with its own S_enc (its own enc_b table)."""
    x = hostile(rng, (208, 400), ml_dtypes.bfloat16, with_inf=False, with_nan=False)
    amax = float(np.max(np.abs(x.astype(np.float32))))
    nd.quantize_both_with_amaxes(x, (amax, amax * 3.0))


@pytest.mark.parametrize("mode", ["2d", "2d_sr"])
@pytest.mark.parametrize("columnwise_amax_factor", [1.0, 3.0])
def test_device_2d_with_different_global_amaxes(device, rng, mode, columnwise_amax_factor):
    """16x16 blocks: the columnwise codes come from the rowwise ones when both
    directions have the same global amax, else they are quantized again."""
    x = nd.with_negative_nans(rng, hostile(rng, (208, 400), ml_dtypes.bfloat16, with_inf=False))
    amax = float(np.nanmax(np.abs(x.astype(np.float32))))
    amaxes = (amax, amax * columnwise_amax_factor)
    nd.quantize_both_with_amaxes(x, amaxes, block_2d=True, stochastic_rounding=mode == "2d_sr", seed=7, offset=11)


@pytest.mark.parametrize("out_dtype", INPUT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 16), (7, 48), (3, 5, 64), (300, 1024), *gpu_scale((4095, 4112))])
def test_device_dequantize_matches_numpy_api(device, rng, out_dtype, shape):
    m, k = int(np.prod(shape[:-1])), shape[-1]
    data = rng.integers(0, 256, size=shape[:-1] + (k // 2,), dtype=np.uint8)
    scale = rng.integers(0, 256, size=nd.scale_shape(m, k), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    for amax in (np.float32(3.5), np.float32(0.0), np.float32(np.inf), np.float32(1e-40)):
        out = nd.Dev(int(np.prod(shape)) * np.dtype(out_dtype).itemsize, nd.te_dtype(out_dtype), shape)
        d, s, a = nd.Dev(data.nbytes, nd.DType.kFloat4E2M1, shape, data), nd.Dev.of(scale), nd.Dev.of(amax)
        lib.nvfp4_dequantize(d.desc, s.desc, a.desc, out.desc, core_device.stream())
        core_device.sync()
        want = tc.dequantize_nvfp4(data, scale, amax, out_dtype)  # NaN scale bytes included
        nd.assert_same(out.bytes(), want, f"dequantize amax={amax}")


@pytest.mark.parametrize("shape", [(16, 16), (48, 80), (3, 32, 64), (1024, 272)])
def test_device_transpose_2d_matches_numpy_api_and_columnwise(device, rng, shape):
    x = hostile(rng, shape, ml_dtypes.bfloat16)
    q = tc.quantize_nvfp4(x, columnwise=True, block_2d=True)
    m, k = x.size // shape[-1], shape[-1]
    col, col_scale = nd.fp4((k, m)), nd.scales(k, m)
    row, row_scale = nd.Dev(q.rowwise.nbytes, nd.DType.kFloat4E2M1, shape, q.rowwise), nd.Dev.of(q.rowwise_scale)
    lib.nvfp4_transpose_2d(row.desc, row_scale.desc, col.desc, col_scale.desc, core_device.stream())
    core_device.sync()
    nd.assert_same(col.bytes(), q.columnwise, "columnwise")
    nd.assert_same(col_scale.bytes(), q.columnwise_scale, "columnwise_scale")


@CUDA_ONLY
def test_cuda_rng_state_is_read_on_the_device_under_graph_replay(device, rng):
    """Capture compute_amax + quantize (SR) once; replays with new (seed, offset)
    written into the state tensor give the CPU bytes of those values."""
    torch = pytest.importorskip("torch")
    x = hostile(rng, (64, 256), ml_dtypes.bfloat16, with_inf=False)
    m, k = 64, 256
    xd, state = nd.Dev.of(x), nd.Dev.of(np.zeros(2, np.int64))
    amax_row, amax_col = nd.Dev.of(np.float32(0)), nd.Dev.of(np.float32(0))
    row, row_s, col, col_s = nd.fp4((m, k)), nd.scales(m, k), nd.fp4((k, m)), nd.scales(k, m)

    def run(s):
        lib.nvfp4_compute_amax(xd.desc, amax_row.desc, amax_col.desc, True, nd.RHT_SIGN_MASK, s)
        lib.nvfp4_quantize(
            xd.desc,
            amax_row.desc,
            row.desc,
            row_s.desc,
            amax_col.desc,
            col.desc,
            col_s.desc,
            stochastic_rounding=True,
            random_hadamard=True,
            rht_sign_mask=nd.RHT_SIGN_MASK,
            rng_state=state.desc,
            stream=s,
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(side.cuda_stream)  # warm-up outside the capture (occupancy queries are cached)
    torch.cuda.current_stream().wait_stream(side)
    core_device.sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        run(side.cuda_stream)
    for seed, offset in [(1, 2), (2**40 + 3, 17)]:
        state.buf.write(0, np.array([seed, offset], np.uint64))
        graph.replay()
        core_device.sync()
        want = tc.quantize_nvfp4(
            x,
            columnwise=True,
            stochastic_rounding=True,
            seed=seed,
            offset=offset,
            random_hadamard=True,
            rht_sign_mask=nd.RHT_SIGN_MASK,
        )
        nd.assert_same(row.bytes(), want.rowwise, "rowwise")
        nd.assert_same(col.bytes(), want.columnwise, "columnwise")
        nd.assert_same(col_s.bytes(), want.columnwise_scale, "columnwise_scale")


@CUDA_ONLY
def test_cuda_unaligned_input_is_rejected(device, rng):
    """(The CUDA kernels load 16 bytes at a time; the CPU backend has no such rule.)"""
    x = rng.standard_normal((16, 32)).astype(np.float32)
    xd, amax = nd.Dev.of(x, offset=4), nd.Dev.of(np.float32(0))
    with pytest.raises(ValueError, match="argument 'input' must be 16-byte aligned"):
        lib.nvfp4_compute_amax(xd.desc, amax.desc, None, False, 0, core_device.stream())
