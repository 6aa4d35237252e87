"""Fused RoPE on the CPU backend against the float64 oracle (reference_rope): every layout,
partial rotary, interleaved or not, thd with empty / trailing sequences, start positions,
context parallelism; hostile values; argument errors."""

from __future__ import annotations

import backend_checks as bc
import core_device
import numpy as np
import pytest
from conftest import CUDA_ONLY
from rope_cases import CASES, FLOAT_DTYPES, case_inputs, freqs_for, rope_input

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core import reference_norm as nref
from transformer_engine.core import reference_rope as rref
from transformer_engine.core._arrays import desc
from transformer_engine.core.rope import TENSOR_FORMATS

pytestmark = [pytest.mark.rope]


def run(case, x, freqs, interleaved, backward=False):
    fn = tc.fused_rope_backward if backward else tc.fused_rope_forward
    return fn(x, freqs, interleaved=interleaved, **case.kwargs())


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_rope_against_oracle(rng, case, dtype, interleaved, backward):
    x, freqs = case_inputs(rng, case, dtype)
    out = run(case, x, freqs, interleaved, backward)
    assert out.dtype == np.dtype(dtype) and out.shape == x.shape
    exact, bound = rref.rope(x, freqs, interleaved=interleaved, backward=backward, **case.kwargs())
    nref.assert_within(out, exact, bound, f"{case} {'bwd' if backward else 'fwd'}")
    # Unrotated elements (past d2, thd tokens of no sequence) are the input's bits.
    untouched = bound == 0
    np.testing.assert_array_equal(
        out.view(np.uint8).reshape(*x.shape, -1)[untouched], x.view(np.uint8).reshape(*x.shape, -1)[untouched]
    )


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_large_angles(rng, interleaved):
    case = CASES[0]
    x, _ = case_inputs(rng, case, np.float32)
    freqs = freqs_for(rng, 5, 16, large=True)
    for backward in (False, True):
        out = run(case, x, freqs, interleaved, backward)
        exact, bound = rref.rope(x, freqs, interleaved=interleaved, backward=backward)
        nref.assert_within(out, exact, bound, "large angles")


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_backward_inverts_forward_for_rope_frequencies(rng, interleaved):
    """With RotaryPositionEmbedding's frequencies the backward is the rotation by -theta."""
    x = rope_input(rng, (9, 2, 4, 32), np.float32, specials=False)
    freqs = freqs_for(rng, 9, 24, duplicated=True, interleaved=interleaved)
    y = tc.fused_rope_forward(x, freqs, "sbhd", interleaved=interleaved)
    back = tc.fused_rope_backward(y, freqs, "sbhd", interleaved=interleaved)
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5 * np.abs(x).max())
    assert not np.array_equal(y, x)


def test_thd_equals_padded_bshd(rng):
    """Positions restart per sequence: thd gives the per-sequence bshd results."""
    lens = [3, 5, 1]
    cu = np.cumsum([0] + lens).astype(np.int32)
    x = rope_input(rng, (sum(lens), 2, 8), np.float32, specials=False)
    freqs = freqs_for(rng, 6, 8)
    out = tc.fused_rope_forward(x, freqs, "thd", cu_seqlens=cu)
    for k in range(len(lens)):
        seq = x[cu[k] : cu[k + 1]][None]
        ref = tc.fused_rope_forward(seq, freqs, "bshd")[0]
        np.testing.assert_array_equal(out[cu[k] : cu[k + 1]], ref)


def test_layouts_agree(rng):
    x = rope_input(rng, (6, 3, 2, 10), np.float32)
    freqs = freqs_for(rng, 6, 10)
    sbhd = tc.fused_rope_forward(x, freqs, "sbhd")
    bshd = tc.fused_rope_forward(np.ascontiguousarray(x.transpose(1, 0, 2, 3)), freqs, "bshd")
    np.testing.assert_array_equal(sbhd.transpose(1, 0, 2, 3).view(np.uint32), bshd.view(np.uint32))


def _err(match, **kw):
    x = kw.pop("x", np.ones((4, 2, 2, 8), np.float32))
    freqs = kw.pop("freqs", np.zeros((4, 1, 1, 8), np.float32))
    exc = kw.pop("exc", ValueError)
    with pytest.raises(exc, match=match):
        tc.fused_rope_forward(x, freqs, **kw)


def test_argument_errors():
    f = np.zeros((4, 1, 1, 8), np.float32)
    _err("tensor_format", tensor_format="bhsd")
    _err("must have 4 dimensions", x=np.ones((4, 2, 8), np.float32))
    _err("must have 3 dimensions", tensor_format="thd", cu_seqlens=[0, 4])
    _err("even", freqs=np.zeros((4, 1, 1, 7), np.float32))
    _err(r"\[2, d = 8\]", freqs=np.zeros((4, 1, 1, 10), np.float32))
    _err("middle dimensions 1", freqs=np.zeros((4, 2, 1, 8), np.float32))
    _err("float32", freqs=f.astype(np.float16), exc=TypeError)
    _err("must be float32, bfloat16 or float16", x=np.ones((4, 2, 2, 8), np.int32), exc=TypeError)
    _err("'cu_seqlens' is required", x=np.ones((4, 2, 8), np.float32), tensor_format="thd")
    _err("only for tensor_format thd", cu_seqlens=[0, 4])
    _err("not supported with cp_size > 1", start_positions=[0, 0], cp_size=2)
    _err("cp_rank", cp_size=2, cp_rank=2)
    _err("cp_size >= 1", cp_size=0)
    _err(r"positions 0..4 but 'freqs' has 4 rows", x=np.ones((5, 2, 2, 8), np.float32))
    _err("start_positions' must be INT32 \\[2\\]", start_positions=[0, 1, 2])
    _err(r"reads positions 1..4", start_positions=[0, 1])
    _err("must be even", x=np.ones((3, 2, 2, 8), np.float32), freqs=np.zeros((12, 1, 1, 8), np.float32), cp_size=2)
    thd = dict(x=np.ones((6, 2, 8), np.float32), tensor_format="thd")
    _err("non-decreasing", cu_seqlens=[0, 4, 2], **thd)
    _err("multiple of 2 \\* cp_size", cu_seqlens=[0, 6], cp_size=2, freqs=np.zeros((12, 1, 1, 8), np.float32), **thd)
    _err("past the 6 tokens", cu_seqlens=[0, 4, 8], freqs=np.zeros((8, 1, 1, 8), np.float32), **thd)
    _err("reads positions 0..5", cu_seqlens=[0, 6], **thd)


def test_errors_name_the_entry_point():
    with pytest.raises(ValueError, match="te_rope_bwd"):
        tc.fused_rope_backward(np.ones((4, 2, 2, 8), np.float32), np.zeros((4, 1, 1, 9), np.float32))


def test_empty_tensor():
    x = np.ones((0, 2, 2, 8), np.float32)
    assert tc.fused_rope_forward(x, np.zeros((1, 1, 1, 8), np.float32)).shape == x.shape


# ---- every backend, raw buffers ----------------------------------------------
# On the test's device (backend_checks buffers): against the float64 oracle within
# its bounds (which cover CUDA's sinf/cosf), against the CPU backend within the sum
# of both bounds, copied elements bit for bit; and the CUDA-only behaviour of
# positions past freqs (NaN).
_DTYPE_IDS = lambda d: np.dtype(d).name  # noqa: E731


def _on_device(a):
    return None if a is None else bc.DeviceArray.of(a)


def device_rope(x, freqs, case_kw, interleaved, backward):
    kw = dict(case_kw)
    dx, df = bc.DeviceArray.of(x), bc.DeviceArray.of(freqs)
    cu, st = _on_device(kw["cu_seqlens"]), _on_device(kw["start_positions"])
    out = bc.DeviceArray(x.shape, x.dtype)
    entry = lib.rope_bwd if backward else lib.rope_fwd
    entry(
        dx.desc,
        df.desc,
        None if cu is None else cu.desc,
        None if st is None else st.desc,
        TENSOR_FORMATS[kw["tensor_format"]],
        interleaved,
        kw["cp_size"],
        kw["cp_rank"],
        out.desc,
        core_device.stream(),
    )
    return out.numpy()


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=_DTYPE_IDS)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_device_rope(device, rng, case, dtype, interleaved, backward):
    x, freqs = case_inputs(rng, case, dtype)
    got = device_rope(x, freqs, case.kwargs(), interleaved, backward)
    exact, bound = rref.rope(x, freqs, interleaved=interleaved, backward=backward, **case.kwargs())
    nref.assert_within(got, exact, bound, f"{device} {case}")
    fn = tc.fused_rope_backward if backward else tc.fused_rope_forward
    cpu = fn(x, freqs, interleaved=interleaved, **case.kwargs())
    nref.assert_within(got, cpu.astype(np.float64), 2 * bound, f"{device} vs cpu {case}")
    untouched = bound == 0
    assert np.array_equal(
        got.view(np.uint8).reshape(*x.shape, -1)[untouched], x.view(np.uint8).reshape(*x.shape, -1)[untouched]
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=_DTYPE_IDS)
@pytest.mark.gpu_scale
def test_device_rope_large(device, rng, dtype):
    """Many tokens and heads, large angles (range reduction on both backends)."""
    x = rope_input(rng, (512, 4, 8, 128), dtype)
    freqs = freqs_for(rng, 512, 96, large=True)
    kw = dict(tensor_format="sbhd", start_positions=None, cu_seqlens=None, cp_size=1, cp_rank=0)
    for backward in (False, True):
        got = device_rope(x, freqs, kw, True, backward)
        exact, bound = rref.rope(x, freqs, interleaved=True, backward=backward)
        nref.assert_within(got, exact, bound, f"{device} large")


@CUDA_ONLY
def test_cuda_rope_positions_past_freqs_are_nan(device, rng):
    """Device cu_seqlens the host cannot read: a sequence longer than freqs gives NaN in
    its rotated elements (never an out-of-bounds read); the CPU rejects the call."""
    x = rope_input(rng, (10, 2, 8), np.float32, specials=False)
    freqs = freqs_for(rng, 4, 6)
    kw = dict(
        tensor_format="thd", start_positions=None, cu_seqlens=np.array([0, 3, 10], np.int32), cp_size=1, cp_rank=0
    )
    got = device_rope(x, freqs, kw, False, False)
    assert np.isnan(got[3 + 4 :, :, :6]).all()  # positions 4.. of the second sequence
    assert not np.isnan(got[: 3 + 4]).any()
    np.testing.assert_array_equal(got[:, :, 6:], x[:, :, 6:])
    with pytest.raises(ValueError, match="reads positions 0..6"):
        tc.fused_rope_forward(x, freqs, **kw)


@CUDA_ONLY
def test_cuda_rope_rejects_mixed_devices(device, rng):
    x = bc.DeviceArray.of(rope_input(rng, (4, 1, 2, 8), np.float32))
    freqs = freqs_for(rng, 4, 8)
    out = bc.DeviceArray((4, 1, 2, 8), np.float32)
    with pytest.raises(ValueError, match="freqs"):
        lib.rope_fwd(x.desc, desc(freqs), None, None, 1, False, 1, 0, out.desc, core_device.stream())
