"""Fused outputs of the activation family on the CPU backend: FP8 (rowwise and
transposed columnwise) equal to quantizing the FP32 values, the bias gradient
in its documented summation order, and error messages."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from activation_helpers import assert_same_float_bits, shapes_for
from conftest import FP8_FORMATS, INPUT_DTYPES, hostile

import transformer_engine.core as tc
from transformer_engine.core import reference as ref
from transformer_engine.core import reference_activation as ra
from transformer_engine.core._arrays import desc

pytestmark = pytest.mark.activation

lib = tc.lib
ALL = list(ra.ACTIVATIONS)
FP8_NUMPY = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def u8(a):
    return a.view(np.uint8)


def out_shape(kind, shape):
    return shape[:-1] + (shape[-1] // 2,) if kind in ra.GATED else shape


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_fp8_forward_is_quantize_of_the_fp32_values(rng, kind, fmt, dtype):
    for shape in shapes_for(kind):
        x = hostile(rng, shape, dtype, fmt)
        scale = np.float32(rng.choice([1.0, 0.37, 8.0, 1024.0]))
        fp32 = tc.activation_forward(x, kind, out_dtype=np.float32)
        start = np.float32(rng.choice([0.0, 3.0, 1e9]))
        q = tc.activation_forward(x, kind, out_dtype=fmt, scale=scale, columnwise=True, amax=start)
        expected = ref.quantize_fp8(fp32, scale, fmt)
        np.testing.assert_array_equal(u8(q.rowwise), expected)
        np.testing.assert_array_equal(u8(q.columnwise), ref.columnwise(expected))
        assert q.scale_inv == np.float32(1) / scale
        assert q.amax == max(start, ref.amax(fp32))


@pytest.mark.parametrize("kind", ["relu", "reglu", "srelu"])
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_fp8_forward_rounding_ties(rng, kind, fmt):
    """relu passes FP8 midpoints through unchanged: the fused cast rounds ties to even."""
    from conftest import fp8_midpoints

    ties = fp8_midpoints(fmt)
    ties = ties[ties > 0]
    n = ties.size
    x = np.concatenate([ties, np.ones(n, np.float32)]).reshape(1, -1) if kind == "reglu" else ties.reshape(1, -1)
    q = tc.activation_forward(x, kind, out_dtype=fmt, scale=1.0)
    fp32 = tc.activation_forward(x, kind, out_dtype=np.float32)
    np.testing.assert_array_equal(u8(q.rowwise), ref.quantize_fp8(fp32, 1.0, fmt))


@pytest.mark.parametrize("only", ["rowwise", "columnwise"])
def test_fp8_forward_single_output(rng, only):
    x = hostile(rng, (70, 96), np.float32)
    q = tc.activation_forward(
        x, "swiglu", out_dtype="e4m3", scale=2.0, rowwise=only == "rowwise", columnwise=only == "columnwise"
    )
    expected = ref.quantize_fp8(tc.activation_forward(x, "swiglu"), 2.0, "e4m3")
    if only == "rowwise":
        assert q.columnwise is None
        np.testing.assert_array_equal(u8(q.rowwise), expected)
    else:
        assert q.rowwise is None
        np.testing.assert_array_equal(u8(q.columnwise), ref.columnwise(expected))


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_fp8_backward_with_transpose_and_dbias(rng, kind, fmt):
    for shape in shapes_for(kind):
        x = hostile(rng, shape, np.float32, fmt)
        g = hostile(rng, out_shape(kind, shape), np.float32, fmt)
        fp32 = tc.activation_backward(g, x, kind, out_dtype=np.float32, dbias=True)
        scale = np.float32(rng.choice([1.0, 0.5, 64.0]))
        r = tc.activation_backward(g, x, kind, out_dtype=fmt, scale=scale, columnwise=True, dbias=True)
        expected = ref.quantize_fp8(fp32.grad_input, scale, fmt)
        np.testing.assert_array_equal(u8(r.grad_input.rowwise), expected)
        np.testing.assert_array_equal(u8(r.grad_input.columnwise), ref.columnwise(expected))
        assert r.grad_input.amax == ref.amax(fp32.grad_input)
        assert r.grad_input.scale_inv == np.float32(1) / scale
        # The bias gradient is the FP32 sum of the unquantized values, whatever the output type.
        assert_same_float_bits(r.dbias, fp32.dbias)


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("rows", [1, 63, 64, 65, 217, 300])
def test_dbias_is_the_documented_fp32_sum(rng, kind, rows):
    x = hostile(rng, (rows, 96), np.float32)
    x[np.isinf(x)] = 3.0  # keep most columns finite so the order of the sum matters
    g = (rng.standard_normal(out_shape(kind, x.shape)) * 10).astype(np.float32)
    r = tc.activation_backward(g, x, kind, out_dtype=np.float32, dbias=True)
    expected = ra.chunked_column_sum(r.grad_input)
    nan = np.isnan(expected)
    assert_same_float_bits(r.dbias[~nan], expected[~nan])
    assert (r.dbias[nan].view(np.uint32) == 0x7FC00000).all()
    finite = np.isfinite(expected)
    exact = r.grad_input.astype(np.float64).sum(axis=0)
    scale = np.abs(r.grad_input.astype(np.float64)).sum(axis=0)
    assert (np.abs(r.dbias[finite] - exact[finite]) <= 2.0**-20 * rows * scale[finite] + 1e-30).all()


@pytest.mark.parametrize("dbias_dtype", [ml_dtypes.bfloat16, np.float16])
def test_dbias_rounds_once_to_its_dtype(rng, dbias_dtype):
    x = rng.standard_normal((130, 64)).astype(np.float32) * 4
    g = rng.standard_normal((130, 32)).astype(np.float32) * 100
    fp32 = tc.activation_backward(g, x, "geglu", dbias=True).dbias
    low = tc.activation_backward(g, x, "geglu", dbias=True, dbias_dtype=dbias_dtype).dbias
    assert_same_float_bits(low, fp32.astype(dbias_dtype))


def test_dbias_of_a_4d_input(rng):
    x = rng.standard_normal((2, 3, 5, 64)).astype(np.float32)
    g = rng.standard_normal((2, 3, 5, 32)).astype(np.float32)
    r = tc.activation_backward(g, x, "swiglu", dbias=True)
    assert r.dbias.shape == (64,)
    assert_same_float_bits(r.dbias, ra.chunked_column_sum(r.grad_input.reshape(30, 64)))


def test_amax_with_a_high_precision_output(rng):
    """A high-precision output's amax is that of its stored (rounded) values."""
    x = hostile(rng, (9, 48), np.float32)
    y = np.empty((9, 24), ml_dtypes.bfloat16)
    amax = np.array(0.5, np.float32)
    lib.activation_fwd(tc.ACTIVATIONS.index("swiglu"), desc(x), desc(y), None, None, None, desc(amax))
    fp32 = tc.activation_forward(x, "swiglu")
    assert amax == max(np.float32(0.5), ref.amax(fp32.astype(ml_dtypes.bfloat16))) == max(0.5, ref.amax(y))


def test_workspace_size_query():
    cpu = lib.TensorDesc(0, int(tc.DType.kFloat32), [217, 256], 0, 0)
    cuda = lib.TensorDesc(0, int(tc.DType.kBFloat16), [217, 256], 1, 0)
    assert lib.activation_bwd_workspace_size(cpu, True) == 0
    assert lib.activation_bwd_workspace_size(cuda, False) == 0
    assert lib.activation_bwd_workspace_size(cuda, True) == 4 * 4 * 256  # ceil(217 / 64) chunks
    assert lib.activation_bwd_workspace_size(lib.TensorDesc(0, 4, [2, 3, 5, 64], 1, 0), True) == 4 * 64


# ---- errors ---------------------------------------------------------------


def fp32(*shape):
    return np.ones(shape, np.float32)


def code(kind):
    return tc.ACTIVATIONS.index(kind)


def test_gated_kind_needs_an_even_last_dim():
    with pytest.raises(ValueError, match=r"swiglu needs the input's last dimension to be even .*got shape \[3, 17\]"):
        tc.activation_forward(fp32(3, 17), "swiglu")
    with pytest.raises(ValueError, match=r"geglu needs the input's last dimension to be even"):
        lib.activation_fwd(code("geglu"), desc(fp32(3, 17)), desc(fp32(3, 8)))
    with pytest.raises(ValueError, match=r"reglu needs the input's last dimension to be even"):
        lib.activation_bwd(code("reglu"), desc(fp32(3, 8)), desc(fp32(3, 17)), desc(fp32(3, 17)))


def test_plain_kinds_accept_odd_last_dims(rng):
    x = rng.standard_normal((3, 17)).astype(np.float32)
    assert tc.activation_forward(x, "gelu").shape == (3, 17)


def test_wrong_input_dtype():
    with pytest.raises(TypeError, match="argument 'x' must be float32, bfloat16 or float16, got float64"):
        tc.activation_forward(np.ones((2, 16)), "gelu")
    with pytest.raises(TypeError, match="argument 'input' must be float32, bfloat16 or float16, got int32"):
        lib.activation_fwd(code("gelu"), desc(np.ones((2, 16), np.int32)), desc(fp32(2, 16)))


def test_output_shape_message():
    with pytest.raises(
        ValueError,
        match=r"argument 'output' must have shape \[5, 80\] \(the input \[5, 160\] "
        r"with its last dimension halved, for swiglu\), got \[5, 160\]",
    ):
        lib.activation_fwd(code("swiglu"), desc(fp32(5, 160)), desc(fp32(5, 160)))
    with pytest.raises(ValueError, match=r"argument 'output' must have the shape of 'input' \[5, 160\], got \[5, 80\]"):
        lib.activation_fwd(code("silu"), desc(fp32(5, 160)), desc(fp32(5, 80)))


def test_output_dtype_must_be_float_or_fp8():
    with pytest.raises(
        TypeError, match="argument 'output' must be float32, bfloat16, float16, float8_e4m3 or float8_e5m2, got int32"
    ):
        lib.activation_fwd(code("relu"), desc(fp32(2, 16)), desc(np.ones((2, 16), np.int32)))


def test_grad_must_match_input():
    x = fp32(4, 32)
    with pytest.raises(TypeError, match=r"argument 'grad' must have the dtype of 'input' \(float32\), got float16"):
        lib.activation_bwd(code("swiglu"), desc(np.ones((4, 16), np.float16)), desc(x), desc(fp32(4, 32)))
    with pytest.raises(ValueError, match=r"argument 'grad' must have shape \[4, 16\]"):
        lib.activation_bwd(code("swiglu"), desc(fp32(4, 32)), desc(x), desc(fp32(4, 32)))
    with pytest.raises(
        ValueError, match=r"argument 'grad_input' must have the shape of 'input' \[4, 32\], got \[4, 16\]"
    ):
        lib.activation_bwd(code("swiglu"), desc(fp32(4, 16)), desc(x), desc(fp32(4, 16)))


def test_fp8_output_needs_scale_and_high_precision_refuses_it():
    q = np.zeros((2, 16), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="argument 'scale' is required for an FP8 'output'"):
        lib.activation_fwd(code("gelu"), desc(fp32(2, 16)), desc(q))
    with pytest.raises(ValueError, match="argument 'scale' is only used with an FP8 'output', which is float32"):
        lib.activation_fwd(code("gelu"), desc(fp32(2, 16)), desc(fp32(2, 16)), None, desc(fp32()))
    with pytest.raises(ValueError, match="argument 'scale_inv' is only used with an FP8 'grad_input'"):
        lib.activation_bwd(
            code("gelu"), desc(fp32(2, 16)), desc(fp32(2, 16)), desc(fp32(2, 16)), None, None, desc(fp32())
        )
    with pytest.raises(ValueError, match="an FP8 out_dtype needs 'scale'"):
        tc.activation_forward(fp32(2, 16), "gelu", out_dtype="e5m2")


def test_columnwise_rules():
    x = fp32(6, 32)
    col = np.zeros((16, 6), ml_dtypes.float8_e4m3fn)
    with pytest.raises(
        ValueError,
        match=(
            r"argument 'columnwise' must have shape \[16, 6\] \(the 'output'"
            r" matrix \[6, 16\] transposed\), got \[6, 16\]"
        ),
    ):
        lib.activation_fwd(code("swiglu"), desc(x), None, desc(col.T.copy()), desc(fp32()))
    with pytest.raises(
        TypeError, match="arguments 'output' and 'columnwise' must have the same FP8 type, got float32 and float8_e4m3"
    ):
        lib.activation_fwd(code("swiglu"), desc(x), desc(fp32(6, 16)), desc(col), desc(fp32()))
    with pytest.raises(TypeError, match="argument 'columnwise' must be float8_e4m3 or float8_e5m2, got float32"):
        lib.activation_fwd(code("swiglu"), desc(x), None, desc(fp32(16, 6)), desc(fp32()))
    with pytest.raises(ValueError, match="at least one of 'grad_input' and 'columnwise' must be given"):
        lib.activation_bwd(code("swiglu"), desc(fp32(6, 16)), desc(x), None)
    with pytest.raises(ValueError, match="a columnwise output needs an FP8 out_dtype"):
        tc.activation_forward(x, "swiglu", columnwise=True)


def test_dbias_shape_and_dtype():
    x, g = fp32(4, 32), fp32(4, 16)
    with pytest.raises(
        ValueError, match=r"argument 'dbias' must have shape \[32\] \(the input's last dimension\), got \[16\]"
    ):
        lib.activation_bwd(code("swiglu"), desc(g), desc(x), desc(fp32(4, 32)), None, None, None, None, desc(fp32(16)))
    with pytest.raises(TypeError, match="argument 'dbias' must be float32, bfloat16 or float16, got float8_e4m3"):
        lib.activation_bwd(
            code("swiglu"),
            desc(g),
            desc(x),
            desc(fp32(4, 32)),
            None,
            None,
            None,
            None,
            desc(np.zeros(32, ml_dtypes.float8_e4m3fn)),
        )


def test_kind_and_params_are_checked():
    with pytest.raises(ValueError, match="argument 'kind' must be a te_activation value from 0 to 11, got 12"):
        lib.activation_fwd(12, desc(fp32(2, 16)), desc(fp32(2, 16)))
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        tc.activation_forward(fp32(2, 16), "swish")
    with pytest.raises(ValueError, match="clamped_swiglu needs 'limit' > 0, got -1"):
        tc.activation_forward(fp32(2, 16), "clamped_swiglu", limit=-1.0)
    with pytest.raises(ValueError, match="clamped_swiglu needs a finite 'alpha', got inf"):
        tc.activation_forward(fp32(2, 16), "clamped_swiglu", alpha=np.inf)
    with pytest.raises(ValueError, match="clamped_swiglu needs 'limit' > 0, got nan"):
        tc.activation_forward(fp32(2, 16), "clamped_swiglu", limit=np.nan)
    # Other kinds ignore the parameters.
    tc.activation_forward(fp32(2, 16), "swiglu", limit=-1.0)


def test_devices_must_match():
    x = fp32(2, 16)
    cuda_out = lib.TensorDesc(64, int(tc.DType.kFloat32), [2, 16], 1, 0)  # never dereferenced
    with pytest.raises(ValueError, match=r"argument 'output' must be on the device of 'input' \(cpu\), got cuda:0"):
        lib.activation_fwd(code("gelu"), desc(x), cuda_out)
