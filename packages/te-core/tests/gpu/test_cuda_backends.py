"""CUDA backends of the core against the CPU backend: identical bytes.

Every CUDA entry point is called on device buffers (allocated with torch, passed
as raw pointers through `transformer_engine.core.lib.TensorDesc`) and compared
with the CPU backend run on NumPy copies of the same inputs. Quantized bytes,
amax, scale and scale_inv must be bit-identical; dequantized NaNs only need to
be NaN in the same places (their payload is not specified).

Device buffers hold raw bytes (torch.uint8); the descriptor carries the core
dtype code and the logical shape, so no torch FP8/BF16 dtype is involved.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transformer_engine.core as te_core  # noqa: E402
from transformer_engine.core import lib  # noqa: E402
from transformer_engine.core.dtypes import DType, te_dtype  # noqa: E402
from transformer_engine.core.testing.seeds import draw_seed  # noqa: E402
from transformer_engine.core.testing.tolerances import smallest_normal, smallest_subnormal  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.cast, pytest.mark.transpose, pytest.mark.recipe]

BF16 = np.dtype(ml_dtypes.bfloat16)
INPUT_DTYPES = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
FP8 = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2)}
LAYOUTS = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}
# Odd shapes first; (32768, 64) and (256, 192) take the vectorized full-tile
# paths, (1000, 1000) the 8-byte columnwise stores, (3, 7, 33) unaligned rows.
SHAPES = [
    (1, 16),
    (5, 160),
    (217, 256),
    (3, 7, 33),
    (2, 3, 5, 64),
    (32768, 64),
    (1000, 1000),
    (77, 1),
    (1, 300),
    (300,),
    (130, 72),
    (256, 192),
]
# Quiet NaN bit patterns of each input type, both signs and several payloads.
NAN_BITS = {
    np.dtype(np.float32): (np.uint32, [0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFC00001]),
    BF16: (np.uint16, [0x7FC0, 0xFFC0, 0x7FFF, 0xFFC1]),
    np.dtype(np.float16): (np.uint16, [0x7E00, 0xFE00, 0x7FFF, 0xFE01]),
}
# (smallest subnormal, smallest normal) of each input type.
TINY = {d: (smallest_subnormal(d), smallest_normal(d)) for d in (np.dtype(np.float32), BF16, np.dtype(np.float16))}


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and te_core.built_with_cuda()


@pytest.fixture(autouse=True)
def _require_cuda():
    if not _cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


class DeviceArray:
    """A CUDA buffer of raw bytes plus the core descriptor of the array it holds.

    offset (bytes) shifts the data pointer, to exercise the unaligned paths.
    Unwritten bytes read back as 0xA5, so a missing store is seen.
    Keep the DeviceArray alive until the call that uses its descriptor has been
    enqueued: the descriptor is a bare pointer, and a freed buffer is handed to
    the next torch allocation (whose fill kernel runs before ours).
    """

    def __init__(self, shape, dtype, offset: int = 0, fill: np.ndarray | None = None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.code = int(te_dtype(self.dtype))
        self.offset = offset
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.buffer = torch.full((self.nbytes + offset,), 0xA5, dtype=torch.uint8, device="cuda")
        if fill is not None:
            raw = np.ascontiguousarray(fill, dtype=self.dtype).reshape(-1).view(np.uint8)
            self.buffer[offset:] = torch.from_numpy(raw.copy()).to("cuda")

    @classmethod
    def of(cls, array: np.ndarray, offset: int = 0) -> DeviceArray:
        return cls(array.shape, array.dtype, offset, fill=array)

    @property
    def desc(self):
        pointer = self.buffer.data_ptr() + self.offset if self.nbytes else 0
        return lib.TensorDesc(pointer, self.code, list(self.shape), 1, self.buffer.device.index or 0)

    def numpy(self) -> np.ndarray:
        raw = self.buffer[self.offset :].cpu().numpy()
        return raw.view(self.dtype).reshape(self.shape)


def scalar(value=0.0) -> DeviceArray:
    return DeviceArray.of(np.array(value, dtype=np.float32))


# ---------------------------------------------------------------- comparisons


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same_bytes(got, want, what: str, context: str = ""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    g, w = _bits(got), _bits(want)
    bad = np.flatnonzero(g != w)
    if bad.size:
        i = bad[0]
        pytest.fail(
            f"{what}: {bad.size} of {g.size} differ ({context}); first at flat index {i}: "
            f"got 0x{int(g[i]):x}, want 0x{int(w[i]):x}"
        )


def assert_same_values_nan_anywhere(got, want, what: str, context: str = ""):
    """Bytes equal except that NaN only has to meet NaN (any payload/sign)."""
    g32, w32 = np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32)
    g_nan, w_nan = np.isnan(g32), np.isnan(w32)
    bad = np.flatnonzero((g_nan != w_nan).reshape(-1))
    if bad.size:
        pytest.fail(f"{what}: NaN positions differ at {bad.size} places ({context}), first {bad[0]}")
    keep = ~w_nan
    assert_same_bytes(np.asarray(got)[keep], np.asarray(want)[keep], what, context)


# ---------------------------------------------------------------- inputs


def make_input(shape, dtype, rng, kind: str = "hostile") -> np.ndarray:
    """Random values of `dtype` with the hostile ones mixed in.

    kind: "hostile" (+-inf included), "finite" (no inf: current scaling then
    gets a real scale) or "tiny" (subnormals and the smallest normals only).
    Quiet NaNs of both signs are in every kind (amax must ignore them).
    """
    dtype = np.dtype(dtype)
    n = math.prod(shape)
    sub, normal = TINY[dtype]
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    if kind == "tiny":
        x = sign * np.exp(rng.uniform(np.log(sub), np.log(normal * 16), n))
    else:
        x = rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)
        specials = [
            0.0,
            -0.0,
            448.0,
            -448.0,
            464.0,
            480.0,
            57344.0,
            -57344.0,
            59392.0,
            61440.0,
            1e4,
            -3e4,
            60000.0,
            sub,
            -sub,
            normal,
            -normal,
            3 * sub,
            1e-7,
            -2.5e-5,
        ]
        if kind == "hostile":
            specials += [np.inf, -np.inf]
            if dtype != np.float16:
                specials += [1e6, -1e20, 3e38]
        pick = rng.random(n) < 0.05
        x[pick] = rng.choice(np.array(specials), int(pick.sum()))
    with np.errstate(over="ignore", invalid="ignore"):
        out = x.astype(np.float32).astype(dtype)
    uint, patterns = NAN_BITS[dtype]
    nan_at = np.flatnonzero(rng.random(n) < 0.01)
    out.view(uint)[nan_at] = rng.choice(np.array(patterns, dtype=uint), nan_at.size)
    return out.reshape(shape)


def matrix(shape) -> tuple[int, int]:
    cols = shape[-1] if shape else 1
    return math.prod(shape) // cols if cols else math.prod(shape[:-1]), cols


def _ctx(rng_seed, **kw) -> str:
    return ", ".join([f"seed={rng_seed}"] + [f"{k}={v}" for k, v in kw.items()])


@pytest.fixture
def rng_and_seed():
    seed = draw_seed()
    return np.random.default_rng(seed), seed


# ---------------------------------------------------------------- quantize


def _outputs(shape, fp8: str, rowwise: bool, columnwise: bool, offset: int = 0):
    rows, cols = matrix(shape)
    row = DeviceArray(shape, FP8[fp8], offset) if rowwise else None
    col = DeviceArray((cols, rows), FP8[fp8], offset) if columnwise else None
    return row, col


def _desc(d):
    return None if d is None else d.desc


def _check_fp8_outputs(row, col, want, ctx):
    if row is not None:
        assert_same_bytes(row.numpy(), want.rowwise, "rowwise", ctx)
    if col is not None:
        assert_same_bytes(col.numpy(), want.columnwise, "columnwise", ctx)


def run_delayed(x, scale, fp8, layout, amax0, x_offset=0, out_offset=0):
    """GPU and CPU delayed-scaling quantize of x; returns nothing, asserts."""
    rowwise, columnwise = LAYOUTS[layout]
    dx = DeviceArray.of(x, x_offset)
    row, col = _outputs(x.shape, fp8, rowwise, columnwise, out_offset)
    d_scale, d_inv, d_amax = scalar(scale), scalar(-1.0), scalar(amax0)
    lib.quantize_fp8(dx.desc, d_scale.desc, _desc(row), _desc(col), d_inv.desc, d_amax.desc, _stream())
    want = te_core.quantize_fp8(
        x, np.float32(scale), fp8, rowwise=rowwise, columnwise=columnwise, amax=np.float32(amax0)
    )
    return row, col, d_inv, d_amax, want


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_quantize_delayed(shape, dtype, fp8, layout, rng_and_seed):
    rng, seed = rng_and_seed
    x = make_input(shape, dtype, rng)
    # (scale, amax already in the buffer): the amax is max-accumulated, NaN replaced.
    for scale, amax0 in [(1.0, 0.0), (3.7, 7.5), (1.0e4, 1e30), (0.0625, np.nan), (2.0**-20, -1.0)]:
        ctx = _ctx(seed, scale=scale, amax0=amax0)
        row, col, d_inv, d_amax, want = run_delayed(x, scale, fp8, layout, amax0)
        _check_fp8_outputs(row, col, want, ctx)
        assert_same_bytes(d_inv.numpy(), want.scale_inv, "scale_inv", ctx)
        assert_same_bytes(d_amax.numpy(), want.amax, "amax", ctx)


@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
def test_quantize_rounding_ties_and_saturation(dtype, fp8, rng_and_seed):
    """Every FP8 value, every midpoint between neighbours (RNE ties), their
    neighbours one input-ulp away, and values past the FP8 max, at power-of-two
    scales (so that x * scale is exact and the ties stay ties)."""
    rng, seed = rng_and_seed
    grid = np.arange(256, dtype=np.uint8).view(FP8[fp8]).astype(np.float32)
    grid = np.unique(np.abs(grid[np.isfinite(grid)]))
    mids = (grid[:-1] + grid[1:]) / 2
    top = grid[-1]
    beyond = np.array([top * 1.03125, top * 1.0625, top * 1.09375, top * 1.5, top * 4], np.float32)
    base = np.concatenate(
        [grid, mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf)), beyond]
    )
    base = np.concatenate([base, -base])
    for scale in [1.0, 2.0**-3, 2.0**5]:
        with np.errstate(over="ignore"):
            x = (base / np.float32(scale)).astype(dtype)
        x = rng.permutation(x)
        cols = 64
        x = np.concatenate([x, np.zeros((-x.size) % cols, dtype)]).reshape(-1, cols)
        ctx = _ctx(seed, scale=scale)
        row, col, d_inv, d_amax, want = run_delayed(x, scale, fp8, "both", 0.0)
        _check_fp8_outputs(row, col, want, ctx)
        assert_same_bytes(d_amax.numpy(), want.amax, "amax", ctx)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(256, 192), (130, 72), (64, 48)], ids=str)
def test_quantize_unaligned_pointers(shape, dtype, layout, rng_and_seed):
    """Data pointers off the 16-byte grid take the element-wise paths."""
    rng, seed = rng_and_seed
    x = make_input(shape, dtype, rng)
    for x_offset, out_offset in [(dtype.itemsize, 0), (0, 1), (dtype.itemsize * 3, 2)]:
        ctx = _ctx(seed, x_offset=x_offset, out_offset=out_offset)
        row, col, d_inv, d_amax, want = run_delayed(x, 3.7, "e4m3", layout, 0.0, x_offset, out_offset)
        _check_fp8_outputs(row, col, want, ctx)
        assert_same_bytes(d_amax.numpy(), want.amax, "amax", ctx)


# (force_pow_2_scales, amax_epsilon, input kind)
CURRENT_CONFIGS = [
    (False, 0.0, "finite"),
    (True, 0.0, "finite"),
    (False, 0.0, "hostile"),
    (False, 1e6, "finite"),
    (True, 1e-2, "tiny"),
    (False, 0.0, "tiny"),
]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES + [(0, 16)], ids=str)
def test_quantize_current_scaling(shape, dtype, fp8, layout, rng_and_seed):
    rng, seed = rng_and_seed
    rowwise, columnwise = LAYOUTS[layout]
    for pow2, eps, kind in CURRENT_CONFIGS:
        ctx = _ctx(seed, force_pow2=pow2, eps=eps, kind=kind)
        x = make_input(shape, dtype, rng, kind)
        dx = DeviceArray.of(x)
        row, col = _outputs(shape, fp8, rowwise, columnwise)
        d_scale, d_inv, d_amax = scalar(-1.0), scalar(-1.0), scalar(-1.0)
        lib.quantize_fp8_current_scaling(
            dx.desc, _desc(row), _desc(col), d_scale.desc, d_inv.desc, d_amax.desc, pow2, eps, _stream()
        )
        want = te_core.quantize_fp8_current_scaling(
            x, fp8, rowwise=rowwise, columnwise=columnwise, force_pow_2_scales=pow2, amax_epsilon=eps
        )
        assert_same_bytes(d_amax.numpy(), want.amax, "amax", ctx)
        assert_same_bytes(d_scale.numpy(), want.scale, "scale", ctx)
        assert_same_bytes(d_inv.numpy(), want.scale_inv, "scale_inv", ctx)
        _check_fp8_outputs(row, col, want, ctx)


# ---------------------------------------------------------------- amax, scale


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES + [(0, 16), (4097,)], ids=str)
def test_compute_amax(shape, dtype, rng_and_seed):
    rng, seed = rng_and_seed
    for kind in ["hostile", "finite", "tiny"]:
        x = make_input(shape, dtype, rng, kind)
        for offset in [0, dtype.itemsize]:
            d_amax = scalar(123.0)  # overwritten, not accumulated
            dx = DeviceArray.of(x, offset)
            lib.compute_amax(dx.desc, d_amax.desc, _stream())
            ctx = _ctx(seed, kind=kind, offset=offset)
            assert_same_bytes(d_amax.numpy(), np.float32(te_core.compute_amax(x)), "amax", ctx)


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
def test_compute_amax_all_nan(dtype):
    uint, patterns = NAN_BITS[np.dtype(dtype)]
    x = np.array(patterns * 300, dtype=uint).view(dtype).reshape(40, 30)
    d_amax = scalar(5.0)
    dx = DeviceArray.of(x)
    lib.compute_amax(dx.desc, d_amax.desc, _stream())
    assert_same_bytes(d_amax.numpy(), np.float32(0.0), "amax")


AMAX_VALUES = [0.0, -1.0, 2.0**-149, 1e-38, 1e-30, 1e-3, 1.0, 3.0, 448.0, 57344.0, 1e30, 3.4e38, np.inf, np.nan]


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-3, 10.0])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("fp8", list(FP8))
def test_scale_from_amax(fp8, pow2, eps):
    for amax in AMAX_VALUES:
        d_amax, d_scale, d_inv = scalar(amax), scalar(-1.0), scalar(-1.0)
        lib.compute_scale_from_amax(d_amax.desc, d_scale.desc, d_inv.desc, int(te_dtype(fp8)), pow2, eps, _stream())
        scale, scale_inv = te_core.compute_scale_from_amax(amax, fp8, force_pow_2_scales=pow2, amax_epsilon=eps)
        ctx = f"amax={amax}"
        assert_same_bytes(d_scale.numpy(), np.float32(scale), "scale", ctx)
        assert_same_bytes(d_inv.numpy(), np.float32(scale_inv), "scale_inv", ctx)


# ---------------------------------------------------------------- dequantize

SCALE_INVS = [1.0, 0.0123, 2.0**-10, 1e30, 3e38, 1e-45, 0.0, np.inf, np.nan, -2.5]


@pytest.mark.parametrize("out_dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("shape", [(1, 16), (5, 160), (3, 7, 33), (256, 256), (1000, 1000), (77,)], ids=str)
def test_dequantize(shape, fp8, out_dtype, rng_and_seed):
    rng, seed = rng_and_seed
    n = math.prod(shape)
    codes = np.concatenate([np.arange(256, dtype=np.uint8), rng.integers(0, 256, n, dtype=np.uint8)])
    q = rng.permutation(codes)[:n].view(FP8[fp8]).reshape(shape)
    for scale_inv in SCALE_INVS:
        unaligned = (1, np.dtype(out_dtype).itemsize)  # pointers stay element-aligned
        for offsets in [(0, 0), unaligned] if scale_inv == 0.0123 else [(0, 0)]:
            dq, d_inv = DeviceArray.of(q, offsets[0]), scalar(scale_inv)
            out = DeviceArray(shape, out_dtype, offsets[1])
            lib.dequantize_fp8(dq.desc, d_inv.desc, out.desc, _stream())
            want = te_core.dequantize_fp8(q, np.float32(scale_inv), out_dtype)
            ctx = _ctx(seed, scale_inv=scale_inv, offsets=offsets)
            assert_same_values_nan_anywhere(out.numpy(), want, "dequantized", ctx)


# ---------------------------------------------------------------- transpose

TRANSPOSE_DTYPES = [
    np.dtype(np.uint8),
    FP8["e4m3"],
    np.dtype(np.int16),
    BF16,
    np.dtype(np.float32),
    np.dtype(np.int32),
    np.dtype(np.int64),
]


@pytest.mark.parametrize("dtype", TRANSPOSE_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES + [(0, 5), (129, 65)], ids=str)
def test_transpose(shape, dtype, rng_and_seed):
    rng, seed = rng_and_seed
    n = math.prod(shape)
    x = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)
    rows, cols = matrix(shape)
    for offset in [0, dtype.itemsize]:
        out = DeviceArray((cols, rows), dtype, offset)
        dx = DeviceArray.of(x, offset)
        lib.transpose(dx.desc, out.desc, _stream())
        assert_same_bytes(out.numpy(), te_core.transpose(x), "transpose", _ctx(seed, offset=offset))


# ---------------------------------------------------------------- delayed-scaling update


def _amax_values(rng, shape):
    """Positive amaxes with zeros, subnormals, huge, inf and NaN mixed in."""
    a = (10.0 ** rng.uniform(-6, 6, shape)).astype(np.float32)
    specials = np.array([0.0, 0.0, 0.0, np.inf, np.nan, 1e-42, 3e38, 1.0], np.float32)
    pick = rng.random(shape) < 0.25
    a[pick] = rng.choice(specials, int(pick.sum()))
    return a


@pytest.mark.parametrize("num_groups", [3, 150])  # 150 > one launch's groups
@pytest.mark.parametrize("with_scale_inv", [True, False])
@pytest.mark.parametrize("with_buffer", [False, True])
@pytest.mark.parametrize("margin", [0.0, 1.0])
@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length", [1, 16, 300, 1024])  # 300: a partial pass of the warp roll
def test_delayed_scaling_update(length, algo, fp8, margin, with_buffer, with_scale_inv, num_groups, rng_and_seed):
    rng, seed = rng_and_seed
    sizes = [int(s) for s in rng.integers(1, 6, num_groups)]
    sizes[0] = 300  # more columns than threads in a block
    histories = [_amax_values(rng, (length, n)) for n in sizes]
    for h in histories[::3]:
        h[0, :] = 0.0  # nothing staged: no roll unless the buffer has a value
    scales = [(10.0 ** rng.uniform(-3, 3, n)).astype(np.float32) for n in sizes]
    invs = [np.full(n, -7.0, np.float32) for n in sizes] if with_scale_inv else None
    buffer = None
    if with_buffer:
        buffer = _amax_values(rng, (sum(sizes),))
        buffer[rng.random(buffer.size) < 0.4] = 0.0  # zeros fall back to the history's row 0

    d_hist = [DeviceArray.of(h) for h in histories]
    d_scales = [DeviceArray.of(s) for s in scales]
    d_invs = [DeviceArray.of(i) for i in invs] if invs is not None else None
    d_buffer = DeviceArray.of(buffer) if buffer is not None else None
    algo_code = {"max": lib.AmaxComputeAlgo.MAX, "most_recent": lib.AmaxComputeAlgo.MOST_RECENT}[algo]
    lib.delayed_scaling_update(
        _desc(d_buffer),
        [d.desc for d in d_hist],
        [d.desc for d in d_scales],
        None if d_invs is None else [d.desc for d in d_invs],
        algo_code,
        int(te_dtype(fp8)),
        margin,
        _stream(),
    )

    te_core.delayed_scaling_update(
        histories, scales, invs, amax_reduction_buffer=buffer, amax_compute_algo=algo, fp8_dtype=fp8, margin=margin
    )
    for k in range(num_groups):
        ctx = _ctx(seed, group=k)
        assert_same_bytes(d_hist[k].numpy(), histories[k], "amax_history", ctx)
        assert_same_bytes(d_scales[k].numpy(), scales[k], "scale", ctx)
        if invs is not None:
            assert_same_bytes(d_invs[k].numpy(), invs[k], "scale_inv", ctx)


def test_dtype_codes_match_the_core():
    """The descriptors above use te_dtype codes; make sure they are the C API's."""
    assert int(te_dtype(FP8["e4m3"])) == DType.kFloat8E4M3
    assert int(te_dtype(BF16)) == DType.kBFloat16
