"""Bad input gets a clear error naming the argument and the rule."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_engine.core as tc
from transformer_engine.core._arrays import desc

pytestmark = [pytest.mark.cast, pytest.mark.transpose, pytest.mark.recipe]

lib = tc.lib


def fp32(*shape):
    return np.ones(shape, np.float32)


def fp8(*shape, code=tc.DType.kFloat8E4M3):
    return np.zeros(shape, tc.numpy_dtype(code))


def test_wrong_input_dtype_is_type_error():
    with pytest.raises(TypeError, match="argument 'x' must be float32, bfloat16 or float16, got float64"):
        tc.quantize_fp8(np.ones((2, 16)), 1.0)


def test_scale_must_be_one_fp32_element():
    x = fp32(2, 16)
    with pytest.raises(ValueError, match="argument 'scale' must have 1 element"):
        lib.quantize_fp8(desc(x), desc(fp32(2)), desc(fp8(2, 16)), None, None, None)


def test_scale_must_be_fp32():
    x = fp32(2, 16)
    with pytest.raises(TypeError, match="argument 'scale' must be float32, got float16"):
        lib.quantize_fp8(desc(x), desc(np.ones((), np.float16)), desc(fp8(2, 16)), None, None, None)


def test_rowwise_shape_must_match_input():
    with pytest.raises(ValueError, match=r"argument 'rowwise' must have the shape of 'input' \[2, 16\], got \[16, 2\]"):
        lib.quantize_fp8(desc(fp32(2, 16)), desc(fp32()), desc(fp8(16, 2)), None, None, None)


def test_columnwise_shape_is_transposed_matrix_view():
    with pytest.raises(ValueError, match=r"argument 'columnwise' must have shape \[16, 6\]"):
        lib.quantize_fp8(desc(fp32(2, 3, 16)), desc(fp32()), None, desc(fp8(6, 16)), None, None)


def test_output_must_be_fp8():
    with pytest.raises(TypeError, match="argument 'rowwise' must be float8_e4m3 or float8_e5m2, got float32"):
        lib.quantize_fp8(desc(fp32(2, 16)), desc(fp32()), desc(fp32(2, 16)), None, None, None)


def test_mixed_fp8_outputs_rejected():
    with pytest.raises(TypeError, match="'rowwise' and 'columnwise' must have the same FP8 type"):
        lib.quantize_fp8(
            desc(fp32(2, 16)),
            desc(fp32()),
            desc(fp8(2, 16)),
            desc(fp8(16, 2, code=tc.DType.kFloat8E5M2)),
            None,
            None,
        )


def test_an_output_is_required():
    with pytest.raises(ValueError, match="at least one of 'rowwise' and 'columnwise'"):
        lib.quantize_fp8(desc(fp32(2, 16)), desc(fp32()), None, None, None, None)


def test_null_data_pointer_named():
    bad = lib.TensorDesc(0, int(tc.DType.kFloat32), [1], 0, 0)
    with pytest.raises(ValueError, match="argument 'scale' has a NULL data pointer"):
        lib.quantize_fp8(desc(fp32(2, 16)), bad, desc(fp8(2, 16)), None, None, None)


def test_cuda_tensor_without_cuda_backend_or_mismatched_device():
    x = fp32(2, 16)
    on_gpu = lib.TensorDesc(x.ctypes.data, int(tc.DType.kFloat32), [2, 16], 1, 0)
    with pytest.raises(ValueError, match=r"argument 'rowwise' must be on the device of 'input' \(cuda:0\), got cpu"):
        lib.quantize_fp8(on_gpu, desc(fp32()), desc(fp8(2, 16)), None, None, None)


@pytest.mark.skipif(tc.built_with_cuda(), reason="checks the CPU-only build's message")
def test_cpu_only_build_says_so_for_cuda_tensors():
    x = fp32(2, 16)
    g = lambda a: lib.TensorDesc(a.ctypes.data, int(tc.te_dtype(a.dtype)), list(a.shape), 1, 0)  # noqa: E731
    with pytest.raises(NotImplementedError, match="no CUDA backend"):
        lib.compute_amax(g(x), g(fp32()))


def test_scale_from_amax_rejects_non_fp8_and_negative_epsilon():
    with pytest.raises(TypeError, match="fp8_dtype must be"):
        tc.compute_scale_from_amax(1.0, np.float32)
    with pytest.raises(ValueError, match="argument 'amax_epsilon' must be >= 0"):
        tc.compute_scale_from_amax(1.0, "e4m3", amax_epsilon=-1.0)


def test_dequantize_needs_fp8_input():
    with pytest.raises(TypeError, match="argument 'q' must be float8"):
        tc.dequantize_fp8(fp32(2, 2), 1.0)


def test_transpose_rejects_bad_output_shape():
    with pytest.raises(ValueError, match=r"argument 'output' must have shape \[16, 2\]"):
        lib.transpose(desc(fp32(2, 16)), desc(fp32(2, 16)))


def test_delayed_update_validation():
    h = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"argument 'scales\[0\]' must have 3 element"):
        tc.delayed_scaling_update([h], [np.ones(2, np.float32)])
    with pytest.raises(ValueError, match="same length"):
        tc.delayed_scaling_update([h, np.zeros((5, 1), np.float32)], [np.ones(3, np.float32), np.ones(1, np.float32)])
    with pytest.raises(ValueError, match="argument 'margin' must be finite and >= 0"):
        tc.delayed_scaling_update([h], [np.ones(3, np.float32)], margin=-1)
    with pytest.raises(ValueError, match="argument 'amax_compute_algo' must be 'max' or 'most_recent'"):
        tc.delayed_scaling_update([h], [np.ones(3, np.float32)], amax_compute_algo="mean")
    with pytest.raises(ValueError, match=r"argument 'amax_reduction_buffer' must have 3 element\(s\), got shape \[5\]"):
        tc.delayed_scaling_update([h], [np.ones(3, np.float32)], amax_reduction_buffer=np.ones(5, np.float32))


def test_last_error_is_per_call():
    with pytest.raises(ValueError):
        tc.compute_scale_from_amax(1.0, "e4m3", amax_epsilon=-1.0)
    # A later successful call works and does not raise a stale error.
    assert tc.compute_scale_from_amax(2.0, "e4m3")[0] == 224.0
