"""FP8 block scaling: the CPU backend bit-exact against the NumPy oracle, and every
backend (the `device` fixture) byte for byte against the NumPy API. Errors:
test_fp8_block_errors.py."""

from __future__ import annotations

import backend_checks as bc
import core_device
import ml_dtypes
import numpy as np
import pytest
from conftest import CUDA_ONLY, FP8_FORMATS, INPUT_DTYPES, finfo, gpu_scale, hostile

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core import reference_fp8_block as ref
from transformer_engine.core.reference import FP8_MAX, FP8_NUMPY

pytestmark = pytest.mark.fp8_block

# Whole blocks, several blocks, rank 3, cut blocks (130 rows, K = 160 and 272), tiny.
BLOCK_SHAPES = [(128, 128), (256, 384), (3, 128, 256), (130, 256), (5, 160), (1, 16), (217, 272)]
LAYOUTS = ["gemm_ready", "compact"]
OUT_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]


def u8(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


def assert_matches_oracle(out: tc.Fp8BlockTensor, expected: dict):
    for name in ("rowwise", "columnwise"):
        data = getattr(out, name)
        if data is None:
            continue
        np.testing.assert_array_equal(u8(data), expected[name], err_msg=name)
        scales = getattr(out, name + "_scale_inv")
        np.testing.assert_array_equal(
            scales.view(np.uint32), expected[name + "_scale_inv"].view(np.uint32), err_msg=name + "_scale_inv"
        )


@pytest.mark.parametrize("shape", BLOCK_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pow2", [True, False])
def test_quantize_is_bit_exact(rng, shape, dtype, fmt, block_dim, layout, pow2):
    x = hostile(rng, shape, dtype, fmt)
    out = tc.quantize_fp8_block(x, fmt, block_dim=block_dim, layout=layout, columnwise=True, force_pow_2_scales=pow2)
    assert out.rowwise.shape == x.shape
    assert out.rowwise.dtype == FP8_NUMPY[fmt]
    assert_matches_oracle(out, ref.quantize(x, fmt, block_dim, layout, pow2))


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("which", ["rowwise", "columnwise"])
def test_single_direction_matches_both(rng, block_dim, layout, which):
    x = hostile(rng, (260, 144), ml_dtypes.bfloat16)
    one = tc.quantize_fp8_block(
        x, block_dim=block_dim, layout=layout, rowwise=which == "rowwise", columnwise=which == "columnwise"
    )
    both = tc.quantize_fp8_block(x, block_dim=block_dim, layout=layout, columnwise=True)
    other = "columnwise" if which == "rowwise" else "rowwise"
    assert getattr(one, other) is None and getattr(one, other + "_scale_inv") is None
    np.testing.assert_array_equal(u8(getattr(one, which)), u8(getattr(both, which)))
    np.testing.assert_array_equal(getattr(one, which + "_scale_inv"), getattr(both, which + "_scale_inv"))


@pytest.mark.parametrize("shape,rows,cols", [((130, 256), 130, 256), ((3, 5, 160), 15, 160), ((256, 384), 256, 384)])
def test_scale_shapes(shape, rows, cols):
    b, cd = 128, ref.cdiv
    expected = {
        (1, "gemm_ready", False): (cd(cols, b), ref.pad4(rows)),
        (1, "gemm_ready", True): (cd(rows, b), ref.pad4(cols)),
        (2, "gemm_ready", False): (cd(rows, b), ref.pad4(cd(cols, b))),
        (2, "gemm_ready", True): (cd(cols, b), ref.pad4(cd(rows, b))),
        (1, "compact", False): (rows, cd(cols, b)),
        (1, "compact", True): (cd(rows, b), cols),
        (2, "compact", False): (cd(rows, b), cd(cols, b)),
        (2, "compact", True): (cd(rows, b), cd(cols, b)),
    }
    for (dim, layout, col), want in expected.items():
        got = tc.fp8_block_scale_shape(shape, block_dim=dim, layout=layout, columnwise=col)
        assert got == want, (dim, layout, col)


@pytest.mark.parametrize("block_dim", [1, 2])
def test_gemm_ready_padding_is_zero(rng, block_dim):
    x = rng.standard_normal((130, 144)).astype(np.float32) * 5  # 130 rows, 2 blocks of 16+128 cols
    out = tc.quantize_fp8_block(x, block_dim=block_dim, columnwise=True)
    if block_dim == 1:
        assert out.rowwise_scale_inv.shape == (2, 132)
        assert np.all(out.rowwise_scale_inv[:, 130:] == 0) and np.all(out.rowwise_scale_inv[:, :130] > 0)
        assert out.columnwise_scale_inv.shape == (2, 144)  # pad4(144) = 144: nothing to pad
    else:
        assert out.rowwise_scale_inv.shape == (2, 4) and out.columnwise_scale_inv.shape == (2, 4)
        assert np.all(out.rowwise_scale_inv[:, 2:] == 0) and np.all(out.columnwise_scale_inv[:, 2:] == 0)
        assert np.all(out.rowwise_scale_inv[:, :2] > 0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(128, 128), (256, 384), (130, 272), (3, 100, 64)])
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_2d_transpose_equals_columnwise_quantization(rng, layout, shape, fmt):
    x = hostile(rng, shape, np.float32, fmt)
    out = tc.quantize_fp8_block(x, fmt, block_dim=2, layout=layout, columnwise=True)
    col, col_scales = tc.transpose_fp8_block_2d(out.rowwise, out.rowwise_scale_inv, layout=layout)
    np.testing.assert_array_equal(u8(col), u8(out.columnwise))
    np.testing.assert_array_equal(col_scales.view(np.uint32), out.columnwise_scale_inv.view(np.uint32))


@pytest.mark.parametrize("block_dim", [1, 2])
def test_gemm_ready_columnwise_is_rowwise_of_transpose(rng, block_dim):
    """GEMM-ready columnwise data and scales of [M, K] are the rowwise ones of [K, M]."""
    x = hostile(rng, (144, 272), np.float16)
    out = tc.quantize_fp8_block(x, block_dim=block_dim, columnwise=True)
    xt = tc.quantize_fp8_block(np.ascontiguousarray(x.T), block_dim=block_dim)
    np.testing.assert_array_equal(u8(out.columnwise), u8(xt.rowwise))
    np.testing.assert_array_equal(out.columnwise_scale_inv, xt.rowwise_scale_inv)


def test_1d_columnwise_is_not_transposed_rowwise(rng):
    """1-D blocks run along different axes: columnwise must be requantized from the source."""
    x = rng.standard_normal((128, 128)).astype(np.float32) * np.logspace(-3, 3, 128, dtype=np.float32)
    out = tc.quantize_fp8_block(x, block_dim=1, columnwise=True)
    assert not np.array_equal(u8(out.columnwise), u8(out.rowwise).T)
    assert_matches_oracle(out, ref.quantize(x, "e4m3", 1))


def block_of(x, value, rows=slice(0, 128), cols=slice(0, 128)):
    x = x.copy()
    x[rows, cols] = value
    return x


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("pow2", [True, False])
def test_hostile_blocks(rng, block_dim, pow2):
    x = rng.standard_normal((256, 512)).astype(np.float32) * 3
    x[:128, :128] = 0.0  # a block of zeros: amax 0 -> scale 1
    x[:128, 128:256] = np.nan  # all NaN: amax 0 (NaN skipped) -> scale 1, q = 0x7F
    x[5, 300] = np.inf  # inf in a block: amax inf -> scale 1; inf saturates to 448
    x[200, 10] = np.nan  # one NaN among finite values: scale from the others
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    x[128:, 384:] = tiny * rng.integers(1, 50, (128, 128))  # FP32 denormals: scale overflows -> FLT_MAX
    x[128:, 256:384] = 1e-30  # tiny normal block
    out = tc.quantize_fp8_block(x, block_dim=block_dim, columnwise=True, force_pow_2_scales=pow2)
    assert_matches_oracle(out, ref.quantize(x, "e4m3", block_dim, "gemm_ready", pow2))
    rows = u8(out.rowwise)
    assert np.all(rows[:128, :128] == 0)
    assert np.all(rows[:128, 128:256] == 0x7F)
    assert rows[5, 300] == 0x7E  # +448
    assert rows[200, 10] == 0x7F
    inv = out.rowwise_scale_inv
    if block_dim == 2:  # tiles (0, 0), (0, 1), (0, 2) all have scale 1
        assert np.all(inv[0, :3] == 1.0)
        flt_max_inv = np.float32(1) / (np.float32(2.0**127) if pow2 else np.finfo(np.float32).max)
        assert inv[1, 3] == flt_max_inv
    else:
        assert np.all(inv[0, :128] == 1.0) and np.all(inv[1, :128] == 1.0)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("pow2", [True, False])
def test_overflowing_scale_becomes_input_type_max(rng, dtype, pow2):
    """448 / amax overflows for subnormal-range amax: s = the input type's max (reference rule)."""
    tiny = np.float32(finfo(dtype).smallest_subnormal)
    x = (tiny * rng.integers(1, 4, (3, 128))).astype(dtype)
    out = tc.quantize_fp8_block(x, force_pow_2_scales=pow2, layout="compact")
    s = np.float32(2.0**127) if pow2 else ref.max_finite(dtype)
    assert np.all(out.rowwise_scale_inv == np.float32(1) / s)
    assert_matches_oracle(out, ref.quantize(x, "e4m3", 1, "compact", pow2))


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_scale_values(rng, fmt):
    """pow2 scales round down to a power of 2; without pow2, s = fp8_max / amax exactly."""
    x = rng.uniform(-0.2, 0.2, (128, 256)).astype(np.float32)
    x[:, 0] = 0.3  # amax of every row's first block
    x[:, 128] = -17.5
    p2 = tc.quantize_fp8_block(x, fmt, force_pow_2_scales=True, layout="compact")
    exact = tc.quantize_fp8_block(x, fmt, force_pow_2_scales=False, layout="compact")
    fmax = np.float32(FP8_MAX[fmt])
    for j, amax in enumerate([np.float32(0.3), np.float32(17.5)]):
        s = fmax / amax
        assert np.all(exact.rowwise_scale_inv[:, j] == np.float32(1) / s)
        p = np.float32(2.0 ** np.floor(np.log2(np.float64(s))))
        assert np.all(p2.rowwise_scale_inv[:, j] == np.float32(1) / p)
        mantissa, _ = np.frexp(p2.rowwise_scale_inv[:, j])
        assert np.all(mantissa == 0.5)


@pytest.mark.parametrize("block_dim", [1, 2])
def test_amax_epsilon_floors_the_amax(rng, block_dim):
    x = (rng.standard_normal((128, 128)) * 1e-6).astype(np.float32)
    eps = 1e-3
    out = tc.quantize_fp8_block(x, block_dim=block_dim, columnwise=True, amax_epsilon=eps, force_pow_2_scales=False)
    assert_matches_oracle(out, ref.quantize(x, "e4m3", block_dim, "gemm_ready", False, eps))
    expected_inv = np.float32(1) / (np.float32(448) / np.float32(eps))
    assert np.all(out.rowwise_scale_inv[out.rowwise_scale_inv != 0] == expected_inv)


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("shape", [(130, 256), (3, 128, 160), (256, 384)])
def test_dequantize_is_bit_exact(rng, block_dim, layout, fmt, out_dtype, shape):
    x = hostile(rng, shape, np.float32, fmt)
    out = tc.quantize_fp8_block(x, fmt, block_dim=block_dim, layout=layout, columnwise=True)
    for col in (False, True):
        data = out.columnwise if col else out.rowwise
        scales = out.columnwise_scale_inv if col else out.rowwise_scale_inv
        got = tc.dequantize_fp8_block(
            data, scales, block_dim=block_dim, layout=layout, columnwise=col, out_dtype=out_dtype
        )
        want = ref.dequantize(u8(data), scales, fmt, block_dim, layout, col, out_dtype)
        assert got.shape == data.shape and got.dtype == np.dtype(out_dtype)
        # Bytes must match except for NaN payloads (the core writes BF16/FP16 NaN as 0x7FFF).
        nan = np.isnan(want.astype(np.float32))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
        bits = np.uint16 if got.itemsize == 2 else np.uint32
        np.testing.assert_array_equal(got.view(bits)[~nan], want.view(bits)[~nan])


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_error_is_bounded(rng, block_dim, layout):
    """Both copies dequantize to the input's shape within E4M3's relative step of each block amax."""
    magnitude = rng.choice([1e-2, 1.0, 1e2], (3, 1, 1))  # one per 130 x 256 slice
    x = (rng.standard_normal((3, 130, 256)) * magnitude).astype(np.float32)
    out = tc.quantize_fp8_block(x, block_dim=block_dim, layout=layout, columnwise=True)
    for col in (False, True):
        y = out.dequantize(np.float32, columnwise=col)
        assert y.shape == x.shape
        # E4M3 keeps 4 significant bits: |error| <= 2^-4 |x| for scaled normals; scaled
        # subnormals (|x s| < 2^-6) err by <= 2^-10 / s, far below 2^-4 of the block amax.
        bound = np.abs(x).max(axis=(1, 2), keepdims=True) * 2.0**-4
        assert np.all(np.abs(y - x) <= bound)


@pytest.mark.parametrize("shape", [(0, 128), (4, 0), (0, 0)])
@pytest.mark.parametrize("block_dim", [1, 2])
def test_empty_tensors(shape, block_dim):
    x = np.zeros(shape, np.float32)
    out = tc.quantize_fp8_block(x, block_dim=block_dim, columnwise=True)
    assert out.rowwise.shape == shape and out.columnwise.shape == shape[::-1]
    assert np.all(out.rowwise_scale_inv == 0)  # padding only, if any
    assert out.dequantize().shape == shape


# ---------------------------------------------------------------- every backend, raw buffers
# The bindings on buffers of the test's device (backend_checks): FP8 data and
# FP32 scale_inv (padding included: every buffer starts as 0xA5) equal the
# NumPy API's byte for byte; dequantized NaNs only need to be NaN in the same
# places. Beyond BLOCK_SHAPES: M not a multiple of 16 (byte-wise transposed
# stores on CUDA), rank 3 with a cut tile, and one multi-tile case.

LAYOUT_CODE = {"gemm_ready": 0, "compact": 1}
# Whole tiles, cut tiles in M (130, 217, 1000) and K (144, 272), rank 3, tiny, and
# M not a multiple of 16 (byte-wise transposed stores), plus one multi-tile case.
BACKEND_SHAPES = [
    (128, 128),
    (256, 384),
    (3, 128, 256),
    (130, 256),
    (1, 16),
    (5, 160),
    (217, 272),
    (300, 144),
    *gpu_scale((1000, 1024)),
    (2, 64, 48),
]


def device_quantize(
    x: np.ndarray,
    fmt,
    block_dim,
    layout,
    rowwise=True,
    columnwise=True,
    pow2=True,
    epsilon=0.0,
    in_offset=0,
    out_offset=0,
    scale_offset=0,
):
    """Runs the quantize on the test's device; returns the four outputs as NumPy arrays (None if not asked)."""
    shape_kw = {"block_dim": block_dim, "layout": layout}
    dev_x = bc.DeviceArray.of(x, in_offset)
    outs = []
    for wanted, col in ((rowwise, False), (columnwise, True)):
        if not wanted:
            outs += [None, None]
            continue
        rows, cols = int(np.prod(x.shape[:-1])), x.shape[-1]
        data_shape = (cols, rows) if col and layout == "gemm_ready" else x.shape
        outs += [
            bc.DeviceArray(data_shape, bc.FP8[fmt], out_offset),
            bc.DeviceArray(tc.fp8_block_scale_shape(x.shape, columnwise=col, **shape_kw), np.float32, scale_offset),
        ]
    lib.fp8_block_quantize(
        dev_x.desc,
        *(bc.desc_or_none(d) for d in outs),
        block_dim=block_dim,
        layout=LAYOUT_CODE[layout],
        force_pow2_scales=pow2,
        amax_epsilon=epsilon,
        stream=core_device.stream(),
    )
    core_device.sync()
    return [None if d is None else d.numpy() for d in outs]


def assert_quantize_matches(
    x, fmt, block_dim, layout, ctx, rowwise=True, columnwise=True, pow2=True, epsilon=0.0, **offsets
):
    got = device_quantize(x, fmt, block_dim, layout, rowwise, columnwise, pow2, epsilon, **offsets)
    want = tc.quantize_fp8_block(
        x,
        fmt,
        block_dim=block_dim,
        layout=layout,
        rowwise=rowwise,
        columnwise=columnwise,
        force_pow_2_scales=pow2,
        amax_epsilon=epsilon,
    )
    names = ("rowwise", "rowwise_scale_inv", "columnwise", "columnwise_scale_inv")
    for name, g in zip(names, got):
        w = getattr(want, name)
        assert (g is None) == (w is None), name
        if g is not None:
            bc.assert_same_bytes(g, w, name, ctx)


@pytest.mark.parametrize("shape", BACKEND_SHAPES)
@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize("kind", ["hostile", "finite", "tiny"])
def test_device_quantize_both_directions(device, rng_and_seed, shape, dtype, fmt, block_dim, layout, kind):
    rng, seed = rng_and_seed
    x = bc.make_input(shape, dtype, rng, kind)
    ctx = f"seed={seed}, shape={shape}, {dtype}, {fmt}, {block_dim}-D, {layout}, {kind}"
    assert_quantize_matches(x, fmt, block_dim, layout, ctx)


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize("which", ["rowwise", "columnwise"])
@pytest.mark.parametrize("pow2,epsilon", [(True, 0.0), (False, 0.0), (False, 1e-3), (True, 0.5)])
def test_device_quantize_one_direction_and_options(device, rng_and_seed, block_dim, layout, which, pow2, epsilon):
    rng, seed = rng_and_seed
    x = bc.make_input((260, 400), np.dtype(ml_dtypes.bfloat16), rng, "finite")
    x[:3] *= np.asarray(1e-6, x.dtype)  # rows under the epsilon
    ctx = f"seed={seed}, {block_dim}-D, {layout}, {which}, pow2={pow2}, eps={epsilon}"
    assert_quantize_matches(
        x,
        "e4m3",
        block_dim,
        layout,
        ctx,
        rowwise=which == "rowwise",
        columnwise=which == "columnwise",
        pow2=pow2,
        epsilon=epsilon,
    )


@pytest.mark.parametrize("dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize(
    "offsets",
    [{"in_offset": 1}, {"out_offset": 1}, {"out_offset": 4, "scale_offset": 4}, {"in_offset": 1, "out_offset": 2}],
    ids=str,
)
def test_device_unaligned_pointers(device, rng_and_seed, dtype, block_dim, layout, offsets):
    """Element loads (input not 16-byte aligned) and narrow stores (outputs not aligned)."""
    rng, seed = rng_and_seed
    dtype = np.dtype(dtype)
    x = bc.make_input((144, 272), dtype, rng, "hostile")
    offsets = dict(offsets)
    offsets["in_offset"] = offsets.get("in_offset", 0) * dtype.itemsize  # whole elements only
    ctx = f"seed={seed}, {dtype}, {block_dim}-D, {layout}, {offsets}"
    assert_quantize_matches(x, "e4m3", block_dim, layout, ctx, **offsets)


def test_device_hostile_blocks(device, rng_and_seed):
    """A tile of zeros, a tile of NaNs, a tile with inf, subnormal tiles: the NumPy API's bytes."""
    rng, seed = rng_and_seed
    x = (rng.standard_normal((256, 512)) * 3).astype(np.float32)
    x[:128, :128] = 0.0
    x[:128, 128:256] = np.nan
    x[5, 300] = np.inf
    x[128:, 384:] = np.float32(2.0**-149) * rng.integers(1, 50, (128, 128))
    for block_dim in (1, 2):
        for pow2 in (True, False):
            for dtype in (np.float32, ml_dtypes.bfloat16):
                xd = x.astype(dtype)
                ctx = f"seed={seed}, {block_dim}-D, pow2={pow2}, {np.dtype(dtype)}"
                assert_quantize_matches(xd, "e4m3", block_dim, "gemm_ready", ctx, pow2=pow2)


@pytest.mark.gpu_scale
def test_device_large_tensor(device, rng_and_seed):
    """Many tiles on the vectorized full-tile path (the benchmark's layout, smaller)."""
    rng, seed = rng_and_seed
    x = bc.make_input((2048, 4096), np.dtype(ml_dtypes.bfloat16), rng, "finite")
    for block_dim in (1, 2):
        assert_quantize_matches(x, "e4m3", block_dim, "gemm_ready", f"seed={seed}, {block_dim}-D")


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("out_dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(130, 256), (3, 128, 160), (5, 24)])
def test_device_dequantize(device, rng_and_seed, block_dim, layout, columnwise, out_dtype, fmt, shape):
    """All 256 codes (NaNs included) with random scales, each stored layout."""
    rng, seed = rng_and_seed
    q = rng.integers(0, 256, shape, dtype=np.uint8).view(bc.FP8[fmt])
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    # The scale array of this stored matrix: GEMM-ready columnwise data of [M, K]
    # is stored [K, M] with the rowwise scale layout of that stored matrix (the
    # flag only matters for compact data).
    scale_shape = tc.fp8_block_scale_shape(
        (rows, cols), block_dim=block_dim, layout=layout, columnwise=columnwise and layout == "compact"
    )
    scales = (2.0 ** rng.integers(-20, 20, scale_shape)).astype(np.float32)
    scales.reshape(-1)[::7] = rng.standard_normal(scales.size)[::7].astype(np.float32)
    dev_q, dev_s = bc.DeviceArray.of(q), bc.DeviceArray.of(scales)
    out = bc.DeviceArray(shape, out_dtype)
    lib.fp8_block_dequantize(
        dev_q.desc, dev_s.desc, out.desc, block_dim, LAYOUT_CODE[layout], columnwise, stream=core_device.stream()
    )
    core_device.sync()
    want = tc.dequantize_fp8_block(
        q, scales, block_dim=block_dim, layout=layout, columnwise=columnwise, out_dtype=out_dtype
    )
    ctx = f"seed={seed}, {block_dim}-D, {layout}, col={columnwise}, {np.dtype(out_dtype)}, {fmt}"
    bc.assert_same_values_nan_anywhere(out.numpy(), want, "dequantized", ctx)


@pytest.mark.parametrize("out_dtype", bc.INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("layout,columnwise", [("gemm_ready", False), ("compact", True)])
def test_device_dequantize_special_scales(device, rng_and_seed, out_dtype, fmt, layout, columnwise):
    """Scales of +-0, +-inf, NaN, subnormal and huge next to plain ones, one scale per
    row of 16 codes (GEMM-ready) or per column (compact columnwise): the kernel's fast
    path (no NaN code, finite nonzero scales) and its element-wise path side by side."""
    rng, seed = rng_and_seed
    shape = (260, 384)
    q = rng.integers(0, 256, shape, dtype=np.uint8).view(bc.FP8[fmt])
    scale_shape = tc.fp8_block_scale_shape(shape, block_dim=1, layout=layout, columnwise=columnwise)
    scales = (2.0 ** rng.integers(-20, 20, scale_shape)).astype(np.float32)
    flat = scales.reshape(-1)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e38, 2.0**-126], np.float32)
    pick = rng.random(flat.size) < 0.1
    flat[pick] = rng.choice(special, int(pick.sum()))
    dev_q, dev_s = bc.DeviceArray.of(q), bc.DeviceArray.of(scales)
    out = bc.DeviceArray(shape, out_dtype)
    lib.fp8_block_dequantize(
        dev_q.desc, dev_s.desc, out.desc, 1, LAYOUT_CODE[layout], columnwise, stream=core_device.stream()
    )
    core_device.sync()
    want = tc.dequantize_fp8_block(q, scales, block_dim=1, layout=layout, columnwise=columnwise, out_dtype=out_dtype)
    ctx = f"seed={seed}, {layout}, col={columnwise}, {np.dtype(out_dtype)}, {fmt}"
    bc.assert_same_values_nan_anywhere(out.numpy(), want, "dequantized", ctx)


@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize("shape", [(128, 128), (130, 272), (3, 100, 64), *gpu_scale((1000, 1024))])
def test_device_transpose_2d(device, rng_and_seed, layout, shape):
    """The transpose of 2-D data and scales on the device == the columnwise quantization."""
    rng, seed = rng_and_seed
    x = bc.make_input(shape, np.dtype(np.float32), rng, "hostile")
    ref = tc.quantize_fp8_block(x, block_dim=2, layout=layout, columnwise=True)
    row, row_s = bc.DeviceArray.of(ref.rowwise), bc.DeviceArray.of(ref.rowwise_scale_inv)
    col = bc.DeviceArray(ref.columnwise.shape, ref.columnwise.dtype)
    col_s = bc.DeviceArray(ref.columnwise_scale_inv.shape, np.float32)
    lib.fp8_block_transpose_2d(
        row.desc, row_s.desc, col.desc, col_s.desc, LAYOUT_CODE[layout], stream=core_device.stream()
    )
    core_device.sync()
    ctx = f"seed={seed}, {shape}, {layout}"
    bc.assert_same_bytes(col.numpy(), ref.columnwise, "columnwise", ctx)
    bc.assert_same_bytes(col_s.numpy(), ref.columnwise_scale_inv, "columnwise_scale_inv", ctx)


@CUDA_ONLY
def test_cuda_quantize_is_graph_capturable(device, rng_and_seed):
    """No allocation and no host synchronization: the call records into a CUDA graph."""
    torch = pytest.importorskip("torch")
    rng, seed = rng_and_seed
    x = bc.make_input((384, 512), np.dtype(ml_dtypes.bfloat16), rng, "finite")
    dev_x = bc.DeviceArray.of(x)
    outs = [
        bc.DeviceArray((384, 512), bc.FP8["e4m3"]),
        bc.DeviceArray((4, 384), np.float32),
        bc.DeviceArray((512, 384), bc.FP8["e4m3"]),
        bc.DeviceArray((3, 512), np.float32),
    ]
    descs = [d.desc for d in outs]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # synchronizes first, captures on a side stream
        lib.fp8_block_quantize(
            dev_x.desc, *descs, block_dim=1, layout=0, stream=torch.cuda.current_stream().cuda_stream
        )
    graph.replay()
    core_device.sync()
    want = tc.quantize_fp8_block(x, block_dim=1, columnwise=True)
    for d, name in zip(outs, ("rowwise", "rowwise_scale_inv", "columnwise", "columnwise_scale_inv")):
        bc.assert_same_bytes(d.numpy(), getattr(want, name), name, f"seed={seed}")
