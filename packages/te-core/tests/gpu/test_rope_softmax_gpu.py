"""Fused RoPE and fused softmax on the CUDA backend: against the float64 oracles within
their bounds (which cover CUDA's sinf/cosf/expf), against the CPU backend within the sum
of both bounds, copied elements bit for bit, the softmax backward bit for bit equal to
the CPU's (same summation order, _rn arithmetic, no transcendental), in-place backward,
long rows, and the CUDA-only behaviour of RoPE positions past freqs (NaN)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gemm_gpu_helpers import DeviceArray  # noqa: E402
from rope_cases import CASES as ROPE_CASES  # noqa: E402
from rope_cases import FLOAT_DTYPES, case_inputs, freqs_for, rope_input  # noqa: E402
from softmax_cases import BACKWARD, case_id, forward, inputs, logits  # noqa: E402
from softmax_cases import CASES as SOFTMAX_CASES  # noqa: E402

import transformer_engine.core as tc  # noqa: E402
from transformer_engine.core import lib  # noqa: E402
from transformer_engine.core import norm_reference as nref  # noqa: E402
from transformer_engine.core import reference_rope as rref  # noqa: E402
from transformer_engine.core import reference_softmax as sref  # noqa: E402
from transformer_engine.core.rope import TENSOR_FORMATS  # noqa: E402

pytestmark = [pytest.mark.rope, pytest.mark.softmax, pytest.mark.gpu]
DTYPE_IDS = lambda d: np.dtype(d).name  # noqa: E731


@pytest.fixture(autouse=True)
def _require_cuda():
    if not (torch.cuda.is_available() and tc.built_with_cuda()):
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def _opt(a):
    return None if a is None else DeviceArray.of(a)


def gpu_rope(x, freqs, case_kw, interleaved, backward):
    kw = dict(case_kw)
    dx, df = DeviceArray.of(x), DeviceArray.of(freqs)
    cu, st = _opt(kw["cu_seqlens"]), _opt(kw["start_positions"])
    out = DeviceArray(x.shape, x.dtype)
    entry = lib.rope_bwd if backward else lib.rope_fwd
    entry(
        dx.desc(),
        df.desc(),
        None if cu is None else cu.desc(),
        None if st is None else st.desc(),
        TENSOR_FORMATS[kw["tensor_format"]],
        interleaved,
        kw["cp_size"],
        kw["cp_rank"],
        out.desc(),
        _stream(),
    )
    return out.numpy()


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", ROPE_CASES, ids=repr)
def test_rope_cuda(rng, case, dtype, interleaved, backward):
    x, freqs = case_inputs(rng, case, dtype)
    got = gpu_rope(x, freqs, case.kwargs(), interleaved, backward)
    exact, bound = rref.rope(x, freqs, interleaved=interleaved, backward=backward, **case.kwargs())
    nref.assert_within(got, exact, bound, f"cuda {case}")
    fn = tc.fused_rope_backward if backward else tc.fused_rope_forward
    cpu = fn(x, freqs, interleaved=interleaved, **case.kwargs())
    nref.assert_within(got, cpu.astype(np.float64), 2 * bound, f"cuda vs cpu {case}")
    untouched = bound == 0
    assert np.array_equal(
        got.view(np.uint8).reshape(*x.shape, -1)[untouched], x.view(np.uint8).reshape(*x.shape, -1)[untouched]
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_rope_cuda_large(rng, dtype):
    """Many tokens and heads, large angles (range reduction on both backends)."""
    x = rope_input(rng, (512, 4, 8, 128), dtype)
    freqs = freqs_for(rng, 512, 96, large=True)
    kw = dict(tensor_format="sbhd", start_positions=None, cu_seqlens=None, cp_size=1, cp_rank=0)
    for backward in (False, True):
        got = gpu_rope(x, freqs, kw, True, backward)
        exact, bound = rref.rope(x, freqs, interleaved=True, backward=backward)
        nref.assert_within(got, exact, bound, "cuda large")


def test_rope_cuda_positions_past_freqs_are_nan(rng):
    """Device cu_seqlens the host cannot read: a sequence longer than freqs gives NaN in
    its rotated elements (never an out-of-bounds read); the CPU rejects the call."""
    x = rope_input(rng, (10, 2, 8), np.float32, specials=False)
    freqs = freqs_for(rng, 4, 6)
    kw = dict(
        tensor_format="thd", start_positions=None, cu_seqlens=np.array([0, 3, 10], np.int32), cp_size=1, cp_rank=0
    )
    got = gpu_rope(x, freqs, kw, False, False)
    assert np.isnan(got[3 + 4 :, :, :6]).all()  # positions 4.. of the second sequence
    assert not np.isnan(got[: 3 + 4]).any()
    np.testing.assert_array_equal(got[:, :, 6:], x[:, :, 6:])
    with pytest.raises(ValueError, match="reads positions 0..6"):
        tc.fused_rope_forward(x, freqs, **kw)


def test_rope_cuda_rejects_mixed_devices(rng):
    x = DeviceArray.of(rope_input(rng, (4, 1, 2, 8), np.float32))
    freqs = freqs_for(rng, 4, 8)
    out = DeviceArray((4, 1, 2, 8), np.float32)
    from transformer_engine.core._arrays import desc

    with pytest.raises(ValueError, match="freqs"):
        lib.rope_fwd(x.desc(), desc(freqs), None, None, 1, False, 1, 0, out.desc(), _stream())


def gpu_softmax_forward(kind, x, mask, scale):
    dx, y = DeviceArray.of(x), DeviceArray(x.shape, x.dtype)
    if kind == "masked":
        dm = DeviceArray.of(mask)
        lib.scaled_masked_softmax_fwd(dx.desc(), dm.desc(), scale, y.desc(), _stream())
    else:
        entry = {
            "plain": lib.scaled_softmax_fwd,
            "causal": lib.scaled_upper_triang_masked_softmax_fwd,
            "bottom_right": lib.scaled_aligned_causal_masked_softmax_fwd,
        }[kind]
        entry(dx.desc(), scale, y.desc(), _stream())
    return y.numpy()


def assert_same_bits(got, want, what):
    """Bit for bit, except that a NaN's sign and payload may differ (x86 and the GPU make
    different NaNs from the same operation)."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{what}: NaN positions differ"
    keep = ~np.isnan(w)
    bits = lambda a: a.view(np.uint8).reshape(*a.shape, -1)[keep]  # noqa: E731
    np.testing.assert_array_equal(bits(got), bits(want), err_msg=what)


BWD_ENTRY = {
    "plain": "scaled_softmax_bwd",
    "masked": "scaled_masked_softmax_bwd",
    "causal": "scaled_upper_triang_masked_softmax_bwd",
    "bottom_right": "scaled_aligned_causal_masked_softmax_bwd",
}

LONG = [
    ("plain", (3, 16384)),
    ("masked", (2, 4, 64, 1000)),
    ("causal", (8, 512, 512)),
    ("bottom_right", (2, 8, 128, 700)),
    ("plain", (4096, 128)),
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", SOFTMAX_CASES + LONG, ids=case_id)
def test_softmax_cuda(rng, case, dtype):
    kind, shape = case
    x, mask, scale = inputs(rng, case, dtype)
    y = gpu_softmax_forward(kind, x, mask, scale)
    exact, bound = sref.forward(x, scale, kind, mask)
    nref.assert_within(y, exact, bound, f"cuda fwd {case_id(case)}")
    y_cpu = forward(kind, x, mask, scale)
    nref.assert_within(y, y_cpu.astype(np.float64), 2 * bound, f"cuda vs cpu fwd {case_id(case)}")

    # Backward from the CPU's y, so that both backends see the same inputs: same bits.
    dy = (rng.standard_normal(shape) * rng.choice([1e-2, 1.0, 30.0], shape)).astype(dtype)
    d_dy, d_y, d_dx = DeviceArray.of(dy), DeviceArray.of(y_cpu), DeviceArray(shape, dtype)
    getattr(lib, BWD_ENTRY[kind])(d_dy.desc(), d_y.desc(), scale, d_dx.desc(), _stream())
    dx = d_dx.numpy()
    dx_cpu = BACKWARD[kind](dy, y_cpu, scale)
    assert_same_bits(dx, dx_cpu, f"cuda vs cpu bwd {case_id(case)}")
    # In place (dx = dy) on the device.
    getattr(lib, BWD_ENTRY[kind])(d_dy.desc(), d_y.desc(), scale, d_dy.desc(), _stream())
    assert_same_bits(d_dy.numpy(), dx_cpu, f"cuda bwd in place {case_id(case)}")


def test_softmax_cuda_in_place_forward(rng):
    x = logits(rng, (37, 300), np.float32)
    d = DeviceArray.of(x)
    lib.scaled_softmax_fwd(d.desc(), 0.5, d.desc(), _stream())
    exact, bound = sref.forward(x, 0.5)
    nref.assert_within(d.numpy(), exact, bound, "in place")
