"""Regression tests of issue 15's defect classes at the core and NumPy-API level:
descriptors whose size overflows, outputs that alias inputs, read-only state,
and loosely typed options. Each bad call must raise a clear exception that
names the argument and the rule (never crash, never succeed doing nothing)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import transformer_engine.core as tc
from transformer_engine.common import recipe
from transformer_engine.core import lib

F32 = int(tc.DType.kFloat32)
E4M3 = int(tc.DType.kFloat8E4M3)


def raw(array, shape=None, dtype=None):
    """A descriptor over `array`'s memory with any claimed shape / dtype."""
    code = int(tc.te_dtype(array.dtype)) if dtype is None else dtype
    return lib.TensorDesc(array.ctypes.data, code, list(array.shape if shape is None else shape), 0, 0)


BUF = np.zeros(64, np.float32)
SCALAR = np.zeros((), np.float32)
HUGE = [[2**32, 2**32], [3, 6148914691236517206], [2**62, 4], [2**31, 2**31, 4]]


@pytest.mark.parametrize("shape", HUGE, ids=str)
def test_overflowing_shapes_are_refused_by_every_entry_point(shape):
    count = r"more elements than a signed 64-bit count can hold|byte size that overflows"
    with pytest.raises(ValueError, match=rf"te_cast_compute_amax: argument 'input' of shape .* ({count})"):
        lib.compute_amax(raw(BUF, shape), raw(SCALAR))
    with pytest.raises(ValueError, match=rf"te_transpose: argument 'input' .*({count})"):
        lib.transpose(raw(BUF, shape), raw(BUF, shape[::-1]))
    fp8 = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match=rf"te_cast_dequantize_fp8: argument 'input' .*({count})"):
        lib.dequantize_fp8(raw(fp8, shape, E4M3), raw(SCALAR), raw(BUF, shape))
    with pytest.raises(ValueError, match=count):
        lib.quantize_fp8(raw(BUF, shape), raw(SCALAR), raw(fp8, shape, E4M3), None, None, None)


def test_byte_size_and_address_overflow():
    # 2^61 float32 elements fit a count but not a byte size in 64 bits.
    with pytest.raises(ValueError, match="byte size that overflows 64-bit arithmetic"):
        lib.compute_amax(raw(BUF, [2**61]), raw(SCALAR))
    end = lib.TensorDesc(2**64 - 16, F32, [8], 0, 0)
    with pytest.raises(ValueError, match="extends past the end of the address space"):
        lib.compute_amax(end, raw(SCALAR))


def test_gemm_with_2_pow_32_dims_is_refused():
    a, b, d = raw(BUF, [2**32, 2**32]), raw(BUF, [2**32, 2**32]), raw(BUF, [2**32, 2**32])
    with pytest.raises(ValueError, match="argument 'a' of shape .* more elements"):
        lib.gemm(a, b, d)


def test_layernorm_on_2_pow_62_rows_is_refused():
    x = np.zeros((1, 4), np.float32)
    g = np.ones(4, np.float32)
    rows = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="argument 'x' of shape \\[4611686018427387904, 4\\]"):
        lib.layernorm_fwd(
            raw(x, [2**62, 4]), raw(g), raw(g), 1e-5, False, raw(x, [2**62, 4]), None, None, None, raw(rows), raw(rows)
        )


def test_outputs_aliasing_inputs_are_refused():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    with pytest.raises(ValueError, match="te_transpose: argument 'output' is written by this call but shares memory"):
        lib.transpose(raw(x), raw(x))
    same = raw(x)
    with pytest.raises(ValueError, match="argument 'output' is written by this call but shares memory"):
        lib.transpose(same, same)  # one descriptor passed as both arguments
    q = np.zeros(16, np.uint8)
    with pytest.raises(
        ValueError, match="argument 'rowwise' is written by this call but shares memory with argument 'columnwise'"
    ):
        lib.quantize_fp8(raw(x), raw(SCALAR), raw(q, [4, 4], E4M3), raw(q, [4, 4], E4M3), None, None)
    amax = x.reshape(-1)[:1]
    with pytest.raises(
        ValueError, match="argument 'amax' is written by this call but shares memory with argument 'input'"
    ):
        lib.compute_amax(raw(x), raw(amax, []))
    assert np.array_equal(x, np.arange(16, dtype=np.float32).reshape(4, 4))  # nothing was written


def test_documented_in_place_forms_still_work(rng):
    a = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal((16, 16)).astype(np.float32)
    c = rng.standard_normal((16, 16)).astype(np.float32)
    separate = np.empty_like(c)
    lib.gemm(raw(a), raw(b), raw(separate), c=raw(c), beta=1.0)
    d = c.copy()
    lib.gemm(raw(a), raw(b), raw(d), c=raw(d), beta=1.0)  # C is D itself
    assert np.array_equal(d, separate)
    assert not np.array_equal(d, c)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    y = x.copy()
    lib.scaled_softmax_fwd(raw(y), 1.0, raw(y))  # y may be x itself
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-6)


def test_delayed_scaling_state_must_be_writeable_and_disjoint():
    h = np.zeros((4, 2), np.float32)
    s = np.ones(2, np.float32)
    with pytest.raises(ValueError, match=r"arguments 'amax_histories\[0\]' and 'scales\[0\]' share memory"):
        tc.delayed_scaling_update([h], [h[0]])
    with pytest.raises(ValueError, match=r"arguments 'scales\[0\]' and 'scale_invs\[0\]' share memory"):
        tc.delayed_scaling_update([h], [s], [s])
    with pytest.raises(ValueError, match=r"arguments 'amax_histories\[0\]' and 'amax_histories\[1\]' share memory"):
        tc.delayed_scaling_update([h, h], [s, s.copy()])
    frozen = h.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"argument 'amax_histories\[0\]' is read-only \(writeable=False\)"):
        tc.delayed_scaling_update([frozen], [s])
    s_frozen = s.copy()
    s_frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"argument 'scales\[0\]' is read-only"):
        tc.delayed_scaling_update([h], [s_frozen])
    # The core refuses the same aliasing when the NumPy layer is bypassed.
    with pytest.raises(
        ValueError,
        match=r"argument 'amax_histories\[0\]' is written by this call but shares memory with argument 'scales\[0\]'",
    ):
        lib.delayed_scaling_update(None, [raw(h)], [raw(h[0])], None, lib.AmaxComputeAlgo.MAX, E4M3)


X = np.linspace(-3, 3, 32, dtype=np.float32).reshape(2, 16)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: tc.quantize_fp8(X, None), "argument 'scale' is required \\(got None\\)"),
        (lambda: tc.quantize_fp8(X, 1.0, columnwise="False"), "argument 'columnwise' must be a bool"),
        (lambda: tc.quantize_fp8(X, 1.0, rowwise=1), "argument 'rowwise' must be a bool"),
        (
            lambda: tc.compute_scale_from_amax(1.0, force_pow_2_scales="no"),
            "argument 'force_pow_2_scales' must be a bool",
        ),
        (
            lambda: tc.quantize_mxfp8(np.ones((32, 32), np.float32), use_2d_blocks="False"),
            "'use_2d_blocks' must be a bool",
        ),
        (
            lambda: tc.quantize_mxfp8(np.ones((32, 32), np.float32), swizzled_scales=0),
            "'swizzled_scales' must be a bool",
        ),
        (lambda: tc.quantize_nvfp4(X, block_2d="False"), "argument 'block_2d' must be a bool"),
        (
            lambda: tc.rmsnorm_fwd(X, np.ones(16, np.float32), zero_centered_gamma="False"),
            "'zero_centered_gamma' must be a bool",
        ),
        (lambda: tc.activation_forward(X, 1.0), "argument 'kind' must be an int, got float"),
        (lambda: tc.activation_forward(X, True), "argument 'kind' must be an int, got bool"),
        (lambda: tc.activation_forward(X, 12), "argument 'kind' must be an activation name or code 0 to 11: .*swiglu"),
        (lambda: tc.quantize_fp8_block(np.ones((4, 128), np.float32), block_dim=1.0), "'block_dim' must be an int"),
        (lambda: tc.quantize_fp8_block(np.ones((4, 128), np.float32), block_dim=True), "'block_dim' must be an int"),
        (lambda: tc.quantize_nvfp4(X, stochastic_rounding=True, seed=1.5), "argument 'seed' must be an int, got float"),
        (lambda: tc.quantize_nvfp4(X, seed=-1), "argument 'seed' must be an int in 0 to 18446744073709551615, got -1"),
        (lambda: tc.quantize_nvfp4(X, seed=True), "argument 'seed' must be an int, got bool"),
        (lambda: tc.dequantize_fp8(np.zeros(4, ml_dtypes.float8_e4m3fn), 1 + 2j), "'scale_inv' must hold real numbers"),
        (lambda: tc.dequantize_fp8(np.zeros(4, ml_dtypes.float8_e4m3fn), None), "'scale_inv' is required"),
        (lambda: tc.quantize_fp8(X, 1.0, amax="1"), "'amax' must hold real numbers"),
        (lambda: tc.numpy_dtype(10), "argument 'dtype' kFloat4E2M1 has no NumPy element type"),
        (lambda: tc.numpy_dtype(99), "argument 'dtype' must be a DType code 0 to 10, got 99"),
        (lambda: tc.numpy_dtype("x"), "argument 'dtype' must be a DType"),
        (lambda: tc.pack_fp4(np.uint8(3)), "argument 'values' must have at least 1 dim"),
        (lambda: tc.unpack_fp4(np.uint8(3)), "argument 'packed' must have at least 1 dim"),
        (
            lambda: tc.layernorm_fwd(X, np.ones(16, np.float32), np.zeros(16, np.float32), eps="1e-5"),
            "'eps' must be a real",
        ),
        (
            lambda: tc.delayed_scaling_update([np.zeros((2, 1), np.float32)], [np.ones(1, np.float32)], margin=None),
            "'margin' must be a real",
        ),
    ],
)
def test_strict_arguments(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


def test_numpy_scalars_are_accepted_where_python_ones_are():
    q = tc.quantize_fp8(X, np.float32(2.0), rowwise=np.bool_(True), columnwise=np.True_)
    ref = tc.quantize_fp8(X, 2.0, columnwise=True)
    assert np.array_equal(q.rowwise.view(np.uint8), ref.rowwise.view(np.uint8))
    assert np.array_equal(tc.activation_forward(X, np.int64(7) - 6), tc.activation_forward(X, "relu"))
    assert tc.quantize_fp8_block(np.ones((4, 128), np.float32), block_dim=np.int32(2)).block_dim == 2


def test_zero_d_inputs_keep_their_shape():
    x = np.float32(-2.5)
    assert tc.activation_forward(np.array(x), "relu").shape == ()
    assert tc.dequantize_fp8(np.array(1.0, ml_dtypes.float8_e4m3fn), 2.0).shape == ()
    assert tc.quantize_fp8(np.array(x), 1.0).rowwise.shape == ()
    assert tc.compute_amax(np.array(x)) == 2.5


def test_recipe_format_typo_lists_the_valid_names():
    with pytest.raises(AttributeError, match="Format has no member 'E4M4'; valid names: E2M1, E4M3, E5M2, HYBRID"):
        _ = recipe.Format.E4M4
    assert recipe.Format.E4M3.value.max_fwd == 448


def _step(history, scale, amax):
    """One training step's update: the quantize wrote `amax` into the staging row."""
    history[0, 0] = amax
    return tc.delayed_scaling_update([history], [scale], amax_compute_algo="max", fp8_dtype="e4m3")


@pytest.mark.parametrize("spike", [3e38, np.inf], ids=["huge", "inf"])
def test_delayed_scaling_warns_on_a_suspect_amax_and_recovers_after_the_window(spike):
    length = 4
    history = np.zeros((length, 1), np.float32)
    scale = np.ones(1, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # clean steps must not warn
        assert _step(history, scale, 2.0).ok
    assert scale[0] == np.float32(448.0 / 2.0)
    before = scale[0]
    steps = []
    for amax in [spike] + [2.0] * (length + 1):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = _step(history, scale, amax)
        steps.append((report, [w for w in caught if issubclass(w.category, tc.AmaxWarning)], scale[0]))
    # The spike drives the update of its own step and of the L - 1 after it ...
    for report, caught, value in steps[:length]:
        assert report.suspect == ((0, 0),) and not report.ok
        assert len(caught) == 1 and "tensor 0, column 0" in str(caught[0].message)
        # ... with the reference's rule: fp8_max / amax for a finite amax, the old scale for inf.
        assert value == (np.float32(448.0 / np.float32(spike)) if np.isfinite(spike) else before)
    # Once it has left the window, the scale is the clean one again and nothing warns.
    for report, caught, value in steps[length:]:
        assert report.ok and not caught
        assert value == np.float32(448.0 / 2.0)
