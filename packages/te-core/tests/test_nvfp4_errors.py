"""Bad NVFP4 arguments get a clear error naming the argument and the rule."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import transformer_engine.core as tc
from transformer_engine.core._arrays import desc
from transformer_engine.core.nvfp4 import _fp4_desc, scale_shape

pytestmark = pytest.mark.nvfp4

lib = tc.lib


def fp32(*shape):
    return np.ones(shape, np.float32)


def scale(rows, cols):
    return np.zeros(scale_shape(rows, cols), ml_dtypes.float8_e4m3fn)


def rowwise_args(m, k):
    """(amax, data, scale) descriptors of a valid rowwise output for [m, k]."""
    return desc(fp32()), _fp4_desc(np.zeros((m, k // 2), np.uint8)), desc(scale(m, k))


def quantize(x, row=None, col=None, **options):
    row = row or (None, None, None)
    col = col or (None, None, None)
    lib.nvfp4_quantize(desc(x), *row, *col, **options)


def test_last_dim_must_be_multiple_of_16():
    with pytest.raises(ValueError, match="NVFP4 needs the last dimension of 'input' divisible by 16, got 100"):
        tc.quantize_nvfp4(fp32(2, 100))


def test_columnwise_needs_rows_multiple_of_16():
    with pytest.raises(
        ValueError,
        match=(
            r"NVFP4 columnwise quantization needs the rows \(the product of"
            r" the leading dimensions\) divisible by 16, got 5"
        ),
    ):
        tc.quantize_nvfp4(fp32(5, 32), columnwise=True)


def test_2d_needs_rows_multiple_of_16():
    with pytest.raises(ValueError, match=r"NVFP4 2-D \(16x16\) quantization needs the rows .* got 24"):
        tc.quantize_nvfp4(fp32(2, 12, 32), block_2d=True)


def test_rht_needs_rows_multiple_of_16_for_columnwise_amax():
    with pytest.raises(ValueError, match="NVFP4 random Hadamard transform needs the rows .* got 7"):
        tc.compute_amax_nvfp4(fp32(7, 32), random_hadamard=True)


def test_rht_and_2d_cannot_be_combined():
    with pytest.raises(ValueError, match=r"2-D \(16x16\) quantization cannot be combined with the random Hadamard"):
        tc.quantize_nvfp4(fp32(16, 32), columnwise=True, block_2d=True, random_hadamard=True)


def test_stochastic_rounding_needs_rng_state():
    with pytest.raises(ValueError, match=r"option 'rng_state' \(int64 \[2\] = seed, offset\) is required"):
        quantize(fp32(16, 32), rowwise_args(16, 32), stochastic_rounding=True)


@pytest.mark.parametrize(
    "state,error,message",
    [
        (np.zeros(2, np.int32), TypeError, "argument 'rng_state' must be int64, got int32"),
        (np.zeros(3, np.int64), ValueError, "argument 'rng_state' must have 2 element"),
    ],
)
def test_rng_state_must_be_two_int64(state, error, message):
    with pytest.raises(error, match=message):
        quantize(fp32(16, 32), rowwise_args(16, 32), stochastic_rounding=True, rng_state=desc(state))


def test_sign_mask_must_fit_16_bits():
    with pytest.raises(ValueError, match="option 'rht_sign_mask' must fit in 16 bits, got 65536"):
        quantize(fp32(16, 32), rowwise_args(16, 32), rht_sign_mask=0x10000)
    with pytest.raises(ValueError, match="argument 'rht_sign_mask' must be a 16-bit mask"):
        tc.quantize_nvfp4(fp32(16, 32), rht_sign_mask=-1)


def test_scale_shape_is_padded():
    amax, data, _ = rowwise_args(16, 64)
    wrong = np.zeros((16, 4), ml_dtypes.float8_e4m3fn)
    with pytest.raises(
        ValueError,
        match=(
            r"argument 'rowwise_scale' must have shape \[128, 4\] ="
            r" \[roundup\(16, 128\), roundup\(64/16, 4\)\], got \[16, 4\]"
        ),
    ):
        quantize(fp32(16, 64), (amax, data, desc(wrong)))


def test_scale_must_be_e4m3():
    amax, data, _ = rowwise_args(16, 64)
    with pytest.raises(TypeError, match="argument 'rowwise_scale' must be float8_e4m3, got byte"):
        quantize(fp32(16, 64), (amax, data, desc(np.zeros((128, 4), np.uint8))))


def test_data_must_be_fp4_of_the_input_shape():
    amax, _, s = rowwise_args(16, 64)
    with pytest.raises(TypeError, match="argument 'rowwise' must be float4_e2m1, got byte"):
        quantize(fp32(16, 64), (amax, desc(np.zeros((16, 32), np.uint8)), s))
    with pytest.raises(
        ValueError, match=r"argument 'rowwise' must have the shape of 'input' \[16, 64\], got \[16, 32\]"
    ):
        quantize(fp32(16, 64), (amax, _fp4_desc(np.zeros((16, 16), np.uint8)), s))


def test_columnwise_data_is_transposed():
    col = (desc(fp32()), _fp4_desc(np.zeros((16, 16), np.uint8)), desc(scale(64, 16)))
    with pytest.raises(ValueError, match=r"argument 'columnwise' must have shape \[64, 16\]"):
        quantize(fp32(16, 64), col=col)


def test_direction_arguments_come_together():
    amax, data, _ = rowwise_args(16, 64)
    with pytest.raises(ValueError, match="'amax_rowwise', 'rowwise' and 'rowwise_scale' must be given together"):
        quantize(fp32(16, 64), (amax, data, None))


def test_some_direction_is_required():
    with pytest.raises(ValueError, match="at least one direction"):
        quantize(fp32(16, 64))
    with pytest.raises(ValueError, match="at least one of 'rowwise' and 'columnwise' must be True"):
        tc.quantize_nvfp4(fp32(16, 64), rowwise=False)
    with pytest.raises(ValueError, match="at least one of 'amax_rowwise' and 'amax_columnwise'"):
        lib.nvfp4_compute_amax(desc(fp32(16, 64)), None, None)


def test_input_type_and_rank():
    with pytest.raises(TypeError, match="argument 'x' must be float32, bfloat16 or float16, got float64"):
        tc.quantize_nvfp4(np.ones((16, 16)))
    with pytest.raises(ValueError, match="argument 'input' must have at least 1 dimension, got a scalar"):
        quantize(np.zeros((), np.float32), rowwise_args(16, 16))
    with pytest.raises(TypeError, match="argument 'input' must be float32, bfloat16 or float16, got int32"):
        quantize(np.ones((16, 16), np.int32), rowwise_args(16, 16))


def test_amax_must_be_fp32_scalar():
    _, data, s = rowwise_args(16, 64)
    with pytest.raises(ValueError, match="argument 'amax_rowwise' must have 1 element"):
        quantize(fp32(16, 64), (desc(fp32(2)), data, s))


def test_dequantize_checks():
    data = np.zeros((16, 8), np.uint8)
    with pytest.raises(ValueError, match=r"argument 'output' must have the shape of 'data' \[16, 16\]"):
        lib.nvfp4_dequantize(_fp4_desc(data), desc(scale(16, 16)), desc(fp32()), desc(fp32(16, 8)))
    with pytest.raises(TypeError, match="argument 'data' must be float4_e2m1, got byte"):
        lib.nvfp4_dequantize(desc(data), desc(scale(16, 16)), desc(fp32()), desc(fp32(16, 16)))
    with pytest.raises(TypeError, match="argument 'scale' must be float8_e4m3fn"):
        tc.dequantize_nvfp4(data, np.zeros((128, 4), np.uint8), 1.0)


def test_transpose_checks():
    with pytest.raises(ValueError, match=r"NVFP4 2-D \(16x16\) data transpose needs the rows .* got 8"):
        tc.transpose_nvfp4_2d(np.zeros((8, 16), np.uint8), scale(8, 32))
    with pytest.raises(ValueError, match=r"argument 'columnwise' must have shape \[32, 16\]"):
        lib.nvfp4_transpose_2d(
            _fp4_desc(np.zeros((16, 16), np.uint8)),
            desc(scale(16, 32)),
            _fp4_desc(np.zeros((16, 16), np.uint8)),
            desc(scale(32, 16)),
        )
