"""FP8 block scaling: bad arguments are errors naming the argument and the rule."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_engine.core as tc
from transformer_engine.core._arrays import desc

pytestmark = pytest.mark.fp8_block


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
