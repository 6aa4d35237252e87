"""FP8 block scaling on the CPU backend, bit-exact against the NumPy oracle."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import FP8_FORMATS, INPUT_DTYPES, finfo, hostile

import transformer_engine.core as tc
from transformer_engine.core import reference_fp8_block as ref
from transformer_engine.core._arrays import desc
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


# ---------------------------------------------------------------- errors


def fp8_out(*shape, code=tc.DType.kFloat8E4M3):
    return np.zeros(shape, tc.numpy_dtype(code))


def scales(*shape):
    return np.zeros(shape, np.float32)


def test_last_dim_must_be_multiple_of_16():
    with pytest.raises(
        ValueError, match="FP8 block scaling needs the last dimension of 'input' divisible by 16, got 100"
    ):
        tc.quantize_fp8_block(np.ones((4, 100), np.float32))


def test_bad_block_dim_and_layout():
    x = np.ones((4, 128), np.float32)
    with pytest.raises(ValueError, match="argument 'block_dim' must be 1 .* or 2 .*, got 3"):
        tc.quantize_fp8_block(x, block_dim=3)
    with pytest.raises(ValueError, match="argument 'layout' must be 'gemm_ready' or 'compact', got 'swizzled'"):
        tc.quantize_fp8_block(x, layout="swizzled")
    with pytest.raises(ValueError, match="argument 'block_dim' must be 1 .*, got 0"):
        tc.lib.fp8_block_quantize(desc(x), desc(fp8_out(4, 128)), desc(scales(1, 4)), None, None, 0)
    with pytest.raises(ValueError, match="argument 'layout' must be TE_FP8_BLOCK_GEMM_READY"):
        tc.lib.fp8_block_scale_shape(4, 128, 1, 7, False)


def test_input_dtype_and_epsilon():
    with pytest.raises(TypeError, match="argument 'x' must be float32, bfloat16 or float16, got float64"):
        tc.quantize_fp8_block(np.ones((4, 128)))
    with pytest.raises(ValueError, match="argument 'amax_epsilon' must be >= 0, got -1"):
        tc.quantize_fp8_block(np.ones((4, 128), np.float32), amax_epsilon=-1.0)
    with pytest.raises(ValueError, match="argument 'input' must have at least 1 dimension"):
        x = np.ones((), np.float32)
        tc.lib.fp8_block_quantize(desc(x), desc(fp8_out()), desc(scales(1, 4)), None, None, 1)


def test_scale_shape_is_checked_with_its_layout():
    x = np.ones((130, 256), np.float32)
    with pytest.raises(
        ValueError,
        match=r"argument 'rowwise_scale_inv' must have shape \[2, 132\] "
        r"\(1-D GEMM-ready rowwise scales of a \[130, 256\] tensor\), got \[2, 130\]",
    ):
        tc.lib.fp8_block_quantize(desc(x), desc(fp8_out(130, 256)), desc(scales(2, 130)), None, None, 1)
    with pytest.raises(
        ValueError,
        match=r"argument 'columnwise_scale_inv' must have shape \[2, 2\] "
        r"\(2-D compact columnwise scales",
    ):
        tc.lib.fp8_block_quantize(desc(x), None, None, desc(fp8_out(130, 256)), desc(scales(2, 4)), 2, layout=1)
    with pytest.raises(TypeError, match="argument 'rowwise_scale_inv' must be float32, got float16"):
        tc.lib.fp8_block_quantize(desc(x), desc(fp8_out(130, 256)), desc(np.zeros((2, 132), np.float16)), None, None, 1)


def test_outputs_are_checked():
    x = np.ones((130, 256), np.float32)
    with pytest.raises(ValueError, match="at least one of 'rowwise' and 'columnwise'"):
        tc.lib.fp8_block_quantize(desc(x), None, None, None, None, 1)
    with pytest.raises(ValueError, match="argument 'rowwise_scale_inv' is required with 'rowwise'"):
        tc.lib.fp8_block_quantize(desc(x), desc(fp8_out(130, 256)), None, None, None, 1)
    with pytest.raises(ValueError, match=r"argument 'columnwise' must have shape \[256, 130\] \(GEMM-ready"):
        tc.lib.fp8_block_quantize(desc(x), None, None, desc(fp8_out(130, 256)), desc(scales(2, 256)), 1)
    with pytest.raises(ValueError, match=r"argument 'columnwise' must have the shape of 'input' \[130, 256\]"):
        tc.lib.fp8_block_quantize(desc(x), None, None, desc(fp8_out(256, 130)), desc(scales(2, 256)), 1, layout=1)
    with pytest.raises(TypeError, match="'rowwise' and 'columnwise' must have the same FP8 type"):
        tc.lib.fp8_block_quantize(
            desc(x),
            desc(fp8_out(130, 256)),
            desc(scales(2, 132)),
            desc(fp8_out(256, 130, code=tc.DType.kFloat8E5M2)),
            desc(scales(2, 256)),
            1,
        )
    with pytest.raises(TypeError, match="argument 'rowwise' must be float8_e4m3 or float8_e5m2, got float32"):
        tc.lib.fp8_block_quantize(desc(x), desc(x), desc(scales(2, 132)), None, None, 1)


def test_dequantize_and_transpose_errors():
    q = fp8_out(130, 256)
    with pytest.raises(ValueError, match=r"argument 'scale_inv' must have shape \[130, 2\] \(1-D compact rowwise"):
        tc.dequantize_fp8_block(q, scales(2, 132), layout="compact")
    with pytest.raises(TypeError, match="argument 'data' must be float8_e4m3fn or float8_e5m2, got float32"):
        tc.dequantize_fp8_block(np.ones((4, 128), np.float32), scales(1, 4))
    with pytest.raises(ValueError, match=r"argument 'output' must have the shape of 'data' \[130, 256\]"):
        tc.lib.fp8_block_dequantize(desc(q), desc(scales(2, 132)), desc(scales(256, 130)), 1)
    with pytest.raises(
        ValueError, match=r"argument 'rowwise_scale_inv' must have shape \[2, 4\] \(2-D GEMM-ready rowwise"
    ):
        tc.transpose_fp8_block_2d(q, scales(2, 2))
    with pytest.raises(ValueError, match=r"argument 'columnwise' must have shape \[256, 130\]"):
        tc.lib.fp8_block_transpose_2d(desc(q), desc(scales(2, 4)), desc(fp8_out(130, 256)), desc(scales(2, 4)))


@pytest.mark.skipif(tc.built_with_cuda(), reason="checks the CPU-only build's message")
def test_cuda_descriptor_without_cuda_backend():
    x = np.ones((4, 128), np.float32)

    def on_gpu(a):
        return tc.lib.TensorDesc(a.ctypes.data, int(tc.te_dtype(a.dtype)), list(a.shape), 1, 0)

    q, s = fp8_out(4, 128), scales(1, 4)
    with pytest.raises(NotImplementedError, match="no CUDA backend"):
        tc.lib.fp8_block_quantize(on_gpu(x), on_gpu(q), on_gpu(s), None, None, 1)
