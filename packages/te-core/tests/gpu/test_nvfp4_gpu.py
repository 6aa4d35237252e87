"""NVFP4 on the CUDA backend against the CPU backend: identical bytes.

Every NVFP4 entry point runs on device buffers (torch.uint8 tensors holding raw
bytes; the descriptor carries the core dtype code and the logical shape) and is
compared byte for byte with the CPU backend on the same inputs: amaxes, packed
E2M1 data, E4M3 scales including their zero padding, dequantized values
(NaN bits included) and the 2-D transpose. Output buffers start filled with
0xA5 so that a missing store shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core.dtypes import DType, te_dtype
from transformer_engine.core.nvfp4 import RHT_SIGN_MASK, scale_shape
from transformer_engine.core.testing.seeds import draw_seed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from nvfp4_helpers import INPUT_DTYPES, common_blocks, hostile

pytestmark = [pytest.mark.gpu, pytest.mark.nvfp4]

# Rowwise-only shapes: any rows. Both directions: rows % 16 == 0. They cover
# partial tiles in both dims (tiles are 64 rows x 256 bytes: 64x128 for 16-bit
# inputs, 64x64 for FP32), rows % 32 != 0 (8-byte columnwise stores).
ROWWISE_SHAPES = [(1, 16), (5, 160), (3, 7, 48), (77, 272), (130, 64)]
BOTH_SHAPES = [(16, 16), (48, 64), (80, 272), (3, 16, 32), (128, 256), (192, 4096), (2048, 528)]
MODES = {
    "1d": {},
    "2d": {"block_2d": True},
    "sr": {"stochastic_rounding": True},
    "2d_sr": {"block_2d": True, "stochastic_rounding": True},
    "rht": {"random_hadamard": True},
    "rht_sr": {"random_hadamard": True, "stochastic_rounding": True},
}


@pytest.fixture(autouse=True)
def _require_cuda():
    if not (torch.cuda.is_available() and tc.built_with_cuda()):
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")


@pytest.fixture
def rng():
    return np.random.default_rng(draw_seed())


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


class Dev:
    """Raw bytes on the GPU plus the descriptor of the array they hold."""

    def __init__(self, nbytes: int, code: int, shape, fill=None, offset: int = 0):
        self.code, self.shape, self.offset = int(code), [int(d) for d in shape], offset
        self.t = torch.full((nbytes + offset,), 0xA5, dtype=torch.uint8, device="cuda")
        if fill is not None:
            raw = np.ascontiguousarray(fill).reshape(-1).view(np.uint8)
            self.t[offset:] = torch.from_numpy(raw.copy()).to("cuda")

    @classmethod
    def of(cls, array: np.ndarray, offset: int = 0) -> Dev:
        array = np.ascontiguousarray(array)
        return cls(array.nbytes, te_dtype(array.dtype), array.shape, array, offset)

    @property
    def desc(self):
        # A bare pointer: keep this Dev alive until the call using it has been enqueued.
        return lib.TensorDesc(self.t.data_ptr() + self.offset, self.code, self.shape, 1, self.t.device.index or 0)

    def bytes(self) -> np.ndarray:
        return self.t[self.offset :].cpu().numpy()


def fp4(shape) -> Dev:
    return Dev(int(np.prod(shape)) // 2, DType.kFloat4E2M1, shape)


def scales(rows, cols) -> Dev:
    shape = scale_shape(rows, cols)
    return Dev(shape[0] * shape[1], DType.kFloat8E4M3, shape)


def assert_same(got: np.ndarray, want, what: str):
    want = np.ascontiguousarray(want).reshape(-1).view(np.uint8)
    got = got.reshape(-1)
    assert got.shape == want.shape, f"{what}: {got.size} bytes, want {want.size}"
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {got.size} bytes differ, first at {bad[0]}: "
        f"got {got[bad[0]]:#x}, want {want[bad[0]]:#x}"
    )


def gpu_quantize(x, rowwise=True, columnwise=True, seed=0, offset=0, **mode):
    """compute_amax then quantize on the GPU; returns the CPU-readable results."""
    m, k = x.size // x.shape[-1], x.shape[-1]
    xd = Dev.of(x)
    mask = RHT_SIGN_MASK if mode.get("random_hadamard") else 0
    amax_row, amax_col = Dev.of(np.float32(7.0)), Dev.of(np.float32(7.0))  # overwritten
    lib.nvfp4_compute_amax(xd.desc, amax_row.desc, amax_col.desc, bool(mode.get("random_hadamard")), mask, stream())
    rng_state = Dev.of(np.array([seed, offset], np.uint64).view(np.int64))
    row = (fp4(x.shape), scales(m, k)) if rowwise else (None, None)
    col = (fp4((k, m)), scales(k, m)) if columnwise else (None, None)
    d = lambda dev: None if dev is None else dev.desc
    lib.nvfp4_quantize(
        xd.desc,
        amax_row.desc if rowwise else None,
        d(row[0]),
        d(row[1]),
        amax_col.desc if columnwise else None,
        d(col[0]),
        d(col[1]),
        block_2d=bool(mode.get("block_2d")),
        stochastic_rounding=bool(mode.get("stochastic_rounding")),
        random_hadamard=bool(mode.get("random_hadamard")),
        rht_sign_mask=mask,
        rng_state=rng_state.desc,
        stream=stream(),
    )
    torch.cuda.synchronize()
    out = {"amax_rowwise": amax_row.bytes(), "amax_columnwise": amax_col.bytes()}
    if rowwise:
        out["rowwise"], out["rowwise_scale"] = row[0].bytes(), row[1].bytes()
    if columnwise:
        out["columnwise"], out["columnwise_scale"] = col[0].bytes(), col[1].bytes()
    return out


def compare_with_cpu(x, rowwise=True, columnwise=True, seed=0, offset=0, **mode):
    got = gpu_quantize(x, rowwise, columnwise, seed, offset, **mode)
    mask = RHT_SIGN_MASK if mode.get("random_hadamard") else 0
    want = tc.quantize_nvfp4(
        x, rowwise=rowwise, columnwise=columnwise, seed=seed, offset=offset, rht_sign_mask=mask, **mode
    )
    assert_same(got["amax_rowwise"], want.amax_rowwise, "amax_rowwise")
    assert_same(got["amax_columnwise"], want.amax_columnwise, "amax_columnwise")
    for name in ("rowwise", "rowwise_scale", "columnwise", "columnwise_scale"):
        if name in got:
            assert_same(got[name], getattr(want, name), name)


def quantize_both_with_amaxes(x, amaxes, block_2d=False, stochastic_rounding=False, seed=0, offset=0):
    """Both directions on the GPU with the given global amaxes (rowwise, columnwise),
    compared byte for byte with the CPU backend given the same amaxes."""
    m, k = x.shape
    xd, state = Dev.of(x), Dev.of(np.array([seed, offset], np.uint64).view(np.int64))
    amax_row, amax_col = Dev.of(np.float32(amaxes[0])), Dev.of(np.float32(amaxes[1]))
    row, row_s, col, col_s = fp4((m, k)), scales(m, k), fp4((k, m)), scales(k, m)
    lib.nvfp4_quantize(
        xd.desc,
        amax_row.desc,
        row.desc,
        row_s.desc,
        amax_col.desc,
        col.desc,
        col_s.desc,
        block_2d=block_2d,
        stochastic_rounding=stochastic_rounding,
        random_hadamard=False,
        rht_sign_mask=0,
        rng_state=state.desc,
        stream=stream(),
    )
    torch.cuda.synchronize()
    want = tc.quantize_nvfp4(
        x,
        columnwise=True,
        block_2d=block_2d,
        stochastic_rounding=stochastic_rounding,
        seed=seed,
        offset=offset,
        amax_rowwise=np.float32(amaxes[0]),
        amax_columnwise=np.float32(amaxes[1]),
    )
    assert_same(row.bytes(), want.rowwise, "rowwise")
    assert_same(row_s.bytes(), want.rowwise_scale, "rowwise_scale")
    assert_same(col.bytes(), want.columnwise, "columnwise")
    assert_same(col_s.bytes(), want.columnwise_scale, "columnwise_scale")


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("mode", ["1d", "sr"])
def test_rowwise_only_matches_cpu(rng, shape, dtype, mode):
    x = hostile(rng, shape, dtype)
    compare_with_cpu(x, columnwise=False, seed=int(rng.integers(0, 2**62)), **MODES[mode])


@pytest.mark.parametrize("shape", BOTH_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("mode", list(MODES))
def test_both_directions_match_cpu(rng, shape, dtype, mode):
    x = hostile(rng, shape, dtype, with_inf=rng.random() < 0.3)
    seed, offset = (int(v) for v in rng.integers(0, 2**62, size=2))
    compare_with_cpu(x, seed=seed, offset=offset, **MODES[mode])


@pytest.mark.parametrize("mode", ["1d", "rht", "2d_sr"])
def test_columnwise_only_matches_cpu(rng, mode):
    x = hostile(rng, (96, 208), ml_dtypes.bfloat16)
    compare_with_cpu(x, rowwise=False, seed=5, offset=9, **MODES[mode])


def test_hostile_amaxes(rng):
    """Zero, all-NaN and infinite tensors; denormal inputs (S_enc = FLT_MAX)."""
    for x in (
        np.zeros((32, 48), np.float32),
        np.full((32, 48), np.nan, np.float32),
        (rng.standard_normal((32, 48)) * 1e-41).astype(np.float32),
    ):
        compare_with_cpu(x)
        compare_with_cpu(x, **MODES["rht_sr"])
    x = rng.standard_normal((32, 48)).astype(np.float32)
    x[3, 5] = np.inf
    compare_with_cpu(x, **MODES["sr"])


def with_negative_nans(rng, x):
    """x with some elements replaced by NaNs whose sign bit is set (and a payload):
    the codes of NaN are +6 whatever the NaN's bits."""
    flat = x.reshape(-1).copy()
    bits = flat.view({2: np.uint16, 4: np.uint32}[flat.dtype.itemsize])
    nan = {2: 0xFFC1 if flat.dtype == ml_dtypes.bfloat16 else 0xFE01, 4: 0xFFC00123}[flat.dtype.itemsize]
    bits[rng.random(flat.size) < 0.02] = nan
    return flat.reshape(x.shape)


# More tiles than resident CTAs (each CTA loops, prefetching the next tile; the
# tile steps wrap around the row of tiles), partial tiles on both edges,
# M % 32 == 16 (8-byte columnwise stores).
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("mode", list(MODES))
def test_many_tiles_per_cta_match_cpu(rng, dtype, mode):
    x = with_negative_nans(rng, hostile(rng, (6160, 1040), dtype))
    seed, offset = (int(v) for v in rng.integers(0, 2**62, size=2))
    compare_with_cpu(x, seed=seed, offset=offset, **MODES[mode])


# The kernel of the common case (16-bit input, 1x16 blocks, RNE, no RHT) works
# on tiles of 128 rows x 128 columns: partial tiles in either dimension, a
# single partial tile, M % 32 == 16 (8-byte columnwise stores), K % 32 == 16
# (8-byte rowwise stores), each direction alone and both.
FAST_EDGE_SHAPES = [(48, 160), (4112, 4096), (208, 4112), (144, 400), (272, 48)]


@pytest.mark.parametrize("shape", FAST_EDGE_SHAPES)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("directions", ["both", "rowwise", "columnwise"])
def test_fast_kernel_tile_edges_match_cpu(rng, shape, dtype, directions):
    x = with_negative_nans(rng, hostile(rng, shape, dtype, with_inf=rng.random() < 0.5))
    compare_with_cpu(x, rowwise=directions != "columnwise", columnwise=directions != "rowwise")


@pytest.mark.parametrize("shape", FAST_EDGE_SHAPES)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("directions", ["both", "rowwise", "columnwise"])
@pytest.mark.parametrize("nan_every", [0, 3001], ids=["common", "mixed"])
def test_fast_kernel_common_blocks_match_cpu(rng, shape, dtype, directions, nan_every):
    """Blocks without special values take the fast kernel's packed route (the
    NaN-laced hostile inputs above send nearly every warp to its general
    route); "mixed" puts warps of both routes side by side."""
    x = common_blocks(rng, shape, dtype, nan_every)
    compare_with_cpu(x, rowwise=directions != "columnwise", columnwise=directions != "rowwise")


def test_fast_kernel_common_blocks_different_global_amaxes(rng):
    x = common_blocks(rng, (208, 400), ml_dtypes.bfloat16)
    amax = float(np.max(np.abs(x.astype(np.float32))))
    quantize_both_with_amaxes(x, (amax, amax * 3.0))


@pytest.mark.parametrize("shape", [(5, 160), (130, 4112), (1, 4096)])
def test_fast_kernel_rowwise_any_rows_match_cpu(rng, shape):
    compare_with_cpu(hostile(rng, shape, ml_dtypes.bfloat16), columnwise=False)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_fast_kernel_hostile_amaxes(rng, dtype):
    """Zero (S_enc = 1), all-NaN and denormal 16-bit tensors on the fast kernel."""
    tiny = ml_dtypes.finfo(dtype).smallest_subnormal
    for x in (
        np.zeros((32, 160), dtype),
        np.full((32, 160), np.nan, dtype),
        (rng.integers(-3, 4, (32, 160)) * tiny).astype(dtype),
    ):
        compare_with_cpu(x)


def test_fast_kernel_different_global_amaxes(rng):
    """Each direction quantizes with its own S_enc (its own enc_b table)."""
    x = hostile(rng, (208, 400), ml_dtypes.bfloat16, with_inf=False, with_nan=False)
    amax = float(np.max(np.abs(x.astype(np.float32))))
    quantize_both_with_amaxes(x, (amax, amax * 3.0))


@pytest.mark.parametrize("mode", ["2d", "2d_sr"])
@pytest.mark.parametrize("columnwise_amax_factor", [1.0, 3.0])
def test_2d_with_different_global_amaxes(rng, mode, columnwise_amax_factor):
    """16x16 blocks: the columnwise codes come from the rowwise ones when both
    directions have the same global amax, else they are quantized again."""
    x = with_negative_nans(rng, hostile(rng, (208, 400), ml_dtypes.bfloat16, with_inf=False))
    amax = float(np.nanmax(np.abs(x.astype(np.float32))))
    amaxes = (amax, amax * columnwise_amax_factor)
    quantize_both_with_amaxes(x, amaxes, block_2d=True, stochastic_rounding=mode == "2d_sr", seed=7, offset=11)


@pytest.mark.parametrize("out_dtype", INPUT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 16), (7, 48), (3, 5, 64), (300, 1024), (4095, 4112)])
def test_dequantize_matches_cpu(rng, out_dtype, shape):
    m, k = int(np.prod(shape[:-1])), shape[-1]
    data = rng.integers(0, 256, size=shape[:-1] + (k // 2,), dtype=np.uint8)
    scale = rng.integers(0, 256, size=scale_shape(m, k), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    for amax in (np.float32(3.5), np.float32(0.0), np.float32(np.inf), np.float32(1e-40)):
        out = Dev(int(np.prod(shape)) * np.dtype(out_dtype).itemsize, te_dtype(out_dtype), shape)
        d, s, a = Dev(data.nbytes, DType.kFloat4E2M1, shape, data), Dev.of(scale), Dev.of(amax)
        lib.nvfp4_dequantize(d.desc, s.desc, a.desc, out.desc, stream())
        torch.cuda.synchronize()
        want = tc.dequantize_nvfp4(data, scale, amax, out_dtype)  # NaN scale bytes included
        assert_same(out.bytes(), want, f"dequantize amax={amax}")


@pytest.mark.parametrize("shape", [(16, 16), (48, 80), (3, 32, 64), (1024, 272)])
def test_transpose_2d_matches_cpu_and_columnwise(rng, shape):
    x = hostile(rng, shape, ml_dtypes.bfloat16)
    q = tc.quantize_nvfp4(x, columnwise=True, block_2d=True)
    m, k = x.size // shape[-1], shape[-1]
    col, col_scale = fp4((k, m)), scales(k, m)
    row, row_scale = Dev(q.rowwise.nbytes, DType.kFloat4E2M1, shape, q.rowwise), Dev.of(q.rowwise_scale)
    lib.nvfp4_transpose_2d(row.desc, row_scale.desc, col.desc, col_scale.desc, stream())
    torch.cuda.synchronize()
    assert_same(col.bytes(), q.columnwise, "columnwise")
    assert_same(col_scale.bytes(), q.columnwise_scale, "columnwise_scale")


def test_rng_state_is_read_on_the_device_under_graph_replay(rng):
    """Capture compute_amax + quantize (SR) once; replays with new (seed, offset)
    written into the state tensor give the CPU bytes of those values."""
    x = hostile(rng, (64, 256), ml_dtypes.bfloat16, with_inf=False)
    m, k = 64, 256
    xd, state = Dev.of(x), Dev.of(np.zeros(2, np.int64))
    amax_row, amax_col = Dev.of(np.float32(0)), Dev.of(np.float32(0))
    row, row_s, col, col_s = fp4((m, k)), scales(m, k), fp4((k, m)), scales(k, m)

    def run(s):
        lib.nvfp4_compute_amax(xd.desc, amax_row.desc, amax_col.desc, True, RHT_SIGN_MASK, s)
        lib.nvfp4_quantize(
            xd.desc,
            amax_row.desc,
            row.desc,
            row_s.desc,
            amax_col.desc,
            col.desc,
            col_s.desc,
            stochastic_rounding=True,
            random_hadamard=True,
            rht_sign_mask=RHT_SIGN_MASK,
            rng_state=state.desc,
            stream=s,
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(side.cuda_stream)  # warm-up outside the capture (occupancy queries are cached)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        run(side.cuda_stream)
    for seed, offset in [(1, 2), (2**40 + 3, 17)]:
        state.t.copy_(torch.from_numpy(np.array([seed, offset], np.uint64).view(np.uint8).copy()).to("cuda"))
        graph.replay()
        torch.cuda.synchronize()
        want = tc.quantize_nvfp4(
            x,
            columnwise=True,
            stochastic_rounding=True,
            seed=seed,
            offset=offset,
            random_hadamard=True,
            rht_sign_mask=RHT_SIGN_MASK,
        )
        assert_same(row.bytes(), want.rowwise, "rowwise")
        assert_same(col.bytes(), want.columnwise, "columnwise")
        assert_same(col_s.bytes(), want.columnwise_scale, "columnwise_scale")


def test_unaligned_input_is_rejected(rng):
    x = rng.standard_normal((16, 32)).astype(np.float32)
    xd, amax = Dev.of(x, offset=4), Dev.of(np.float32(0))
    with pytest.raises(ValueError, match="argument 'input' must be 16-byte aligned"):
        lib.nvfp4_compute_amax(xd.desc, amax.desc, None, False, 0, stream())
