"""MXFP8 and the block-scale swizzle on the CUDA backend: the same bytes as the
CPU backend (and the NumPy oracle) for every mode, format and input type.

Device buffers are torch.uint8 tensors holding raw bytes; descriptors carry the
core dtype code and the logical shape. Output buffers start filled with 0xA5,
so a byte the kernel forgets to write (scale padding included) shows up.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_mxfp8 import MODES, mxfp8_hostile  # noqa: E402  (tests/ is on sys.path via conftest)

import transformer_engine.core as tc  # noqa: E402
from transformer_engine.core import reference_mxfp8 as ref  # noqa: E402
from transformer_engine.core._arrays import desc as host_desc  # noqa: E402
from transformer_engine.core.dtypes import te_dtype  # noqa: E402
from transformer_engine.core.reference import FP8_NUMPY  # noqa: E402
from transformer_engine.core.testing.seeds import draw_seed  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.mxfp8, pytest.mark.swizzle]
lib = tc.lib
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
BF16 = np.dtype(ml_dtypes.bfloat16)
INPUT_DTYPES = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
FORMATS = ["e4m3", "e5m2"]
# M % 32 == 0 (every mode). K = 32, 96, 160, 416 leave part of a 64- or
# 128-column tile empty; M = 160, 288, 1056 part of a 64- or 128-row tile, and
# give scale padding in both directions (1056 / 32 = 33 strips, padded to 36);
# (512, 4096) and (2048, 1024) fill many warps and blocks.
SHAPES = [(32, 32), (96, 64), (160, 96), (2, 3, 32, 64), (64, 160), (288, 416), (1056, 160), (512, 4096), (2048, 1024)]
ROWWISE_ONLY_SHAPES = [(1, 32), (5, 64), (33, 96), (3, 5, 160), (200, 416), (1000, 1024)]
NAN_BITS = {
    np.dtype(np.float32): (np.uint32, [0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFC00001]),
    BF16: (np.uint16, [0x7FC0, 0xFFC0, 0x7FFF, 0xFFC1]),
    np.dtype(np.float16): (np.uint16, [0x7E00, 0xFE00, 0x7FFF, 0xFE01]),
}


@pytest.fixture(autouse=True)
def _require_cuda():
    if not (torch.cuda.is_available() and tc.built_with_cuda()):
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")


class Dev:
    """Raw bytes on the GPU for an array of `shape` and numpy `dtype`, starting
    `offset` bytes into the allocation (offset != 0 takes the unaligned paths)."""

    def __init__(self, shape, dtype, offset=0, fill: np.ndarray | None = None):
        self.shape, self.dtype, self.offset = tuple(shape), np.dtype(dtype), offset
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.buf = torch.full((nbytes + offset,), 0xA5, dtype=torch.uint8, device="cuda")
        if fill is not None:
            raw = np.ascontiguousarray(fill, self.dtype).reshape(-1).view(np.uint8)
            self.buf[offset:] = torch.from_numpy(raw.copy()).cuda()

    @property
    def desc(self):
        return lib.TensorDesc(
            self.buf.data_ptr() + self.offset,
            int(te_dtype(self.dtype)),
            list(self.shape),
            1,
            self.buf.device.index or 0,
        )

    def numpy(self) -> np.ndarray:
        return self.buf[self.offset :].cpu().numpy().view(self.dtype).reshape(self.shape)


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def with_nan_payloads(x: np.ndarray, rng) -> np.ndarray:
    """x with ~1% of its elements replaced by NaNs of both signs and several payloads."""
    x = x.copy()
    uint, patterns = NAN_BITS[x.dtype]
    flat = x.reshape(-1).view(uint)
    at = np.flatnonzero(rng.random(flat.size) < 0.01)
    flat[at] = rng.choice(np.array(patterns, uint), at.size)
    return x


def assert_same(got: np.ndarray, want: np.ndarray, what: str):
    g, w = got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8)
    bad = np.flatnonzero(g != w)
    if bad.size:
        i = bad[0]
        pytest.fail(f"{what}: {bad.size} of {g.size} bytes differ, first at {i}: got 0x{g[i]:02x}, want 0x{w[i]:02x}")


def quantize_on_gpu(x, fmt, mode, swizzled, in_offset=0, out_offset=0):
    rowwise, columnwise, use_2d = MODES[mode]
    x_dev = Dev(x.shape, x.dtype, in_offset, fill=x)
    outs = []
    for wanted, is_col in ((rowwise, False), (columnwise, True)):
        data = Dev(x.shape, FP8_NUMPY[fmt], out_offset) if wanted else None
        scales = Dev(tc.mxfp8_scale_shape(x.shape, is_col), E8M0) if wanted else None
        outs += [data, scales]
    lib.quantize_mxfp8(x_dev.desc, *(None if o is None else o.desc for o in outs), use_2d, swizzled, stream())
    return [None if o is None else o.numpy() for o in outs]


def check_against_cpu(x, fmt, mode, swizzled, **offsets):
    rowwise, columnwise, use_2d = MODES[mode]
    got = quantize_on_gpu(x, fmt, mode, swizzled, **offsets)
    want = tc.quantize_mxfp8(
        x, fmt, rowwise=rowwise, columnwise=columnwise, use_2d_blocks=use_2d, swizzled_scales=swizzled
    )
    names = ["rowwise", "rowwise_scale_inv", "columnwise", "columnwise_scale_inv"]
    for name, g, w in zip(names, got, want[:4]):
        assert (g is None) == (w is None), name
        if g is not None:
            assert_same(g, w, f"{name} ({mode}, {fmt}, {x.dtype}, {x.shape}, swizzled={swizzled})")
    # and the oracle, for the directions computed
    for is_col, data, scales in ((False, got[0], got[1]), (True, got[2], got[3])):
        if data is not None:
            q, s = ref.quantize_mxfp8(x, fmt, columnwise=is_col, use_2d_blocks=use_2d, swizzled=swizzled)
            assert_same(data, q, "data vs oracle")
            assert_same(scales, s, "scales vs oracle")


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_matches_cpu(fmt, dtype, shape, mode, swizzled):
    rng = np.random.default_rng(draw_seed())
    x = with_nan_payloads(mxfp8_hostile(rng, shape, dtype, fmt), rng)
    check_against_cpu(x, fmt, mode, swizzled)


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("shape", ROWWISE_ONLY_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_rowwise_any_row_count_matches_cpu(fmt, dtype, shape, swizzled):
    rng = np.random.default_rng(draw_seed())
    x = with_nan_payloads(mxfp8_hostile(rng, shape, dtype, fmt), rng)
    check_against_cpu(x, fmt, "rowwise", swizzled)


@pytest.mark.parametrize("offsets", [{"in_offset": 2}, {"in_offset": 4, "out_offset": 1}, {"out_offset": 2}])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
def test_unaligned_pointers_take_the_elementwise_path(dtype, mode, offsets):
    rng = np.random.default_rng(draw_seed())
    x = mxfp8_hostile(rng, (96, 160), dtype, "e4m3")
    if dtype.itemsize == 4 and offsets.get("in_offset", 0) % 4:
        offsets = {**offsets, "in_offset": 4}  # keep FP32 elements 4-byte aligned
    check_against_cpu(x, "e4m3", mode, False, **offsets)


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("out_dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_matches_cpu(fmt, out_dtype, columnwise, swizzled):
    """Every FP8 code (NaN and inf included) with every scale byte (0, 254, 255 included)."""
    rng = np.random.default_rng(draw_seed())
    shape = (64, 320)
    q = rng.integers(0, 256, shape, dtype=np.uint8).view(FP8_NUMPY[fmt])
    s = rng.integers(0, 256, tc.mxfp8_scale_shape(shape, columnwise), dtype=np.uint8)
    s.reshape(-1)[:3] = [0, 254, 255]
    s = s.view(E8M0)
    want = tc.dequantize_mxfp8(q, s, columnwise=columnwise, swizzled_scales=swizzled, out_dtype=out_dtype)
    for offset in (0, 4):  # 4: not 16-byte aligned
        q_dev, s_dev = Dev(shape, q.dtype, offset, fill=q), Dev(s.shape, E8M0, fill=s)
        out = Dev(shape, out_dtype, offset)
        lib.dequantize_mxfp8(q_dev.desc, s_dev.desc, out.desc, columnwise, swizzled, stream())
        assert_same(out.numpy(), want, f"dequantize {fmt} -> {np.dtype(out_dtype)} offset={offset}")


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("tiles", [(1, 1), (3, 2), (2, 33)])
def test_swizzle_matches_cpu(columnwise, tiles):
    rng = np.random.default_rng(draw_seed())
    shape = (tiles[0] * 128, tiles[1] * 4)
    shape = shape[::-1] if columnwise else shape
    s = rng.integers(0, 256, shape, dtype=np.uint8).view(E8M0)
    for fn, cpu in (
        (lib.swizzle_block_scales, tc.swizzle_block_scales),
        (lib.unswizzle_block_scales, tc.unswizzle_block_scales),
    ):
        src, dst = Dev(shape, E8M0, fill=s), Dev(shape, E8M0)
        fn(src.desc, dst.desc, columnwise, stream())
        assert_same(dst.numpy(), cpu(s, columnwise=columnwise), f"{fn.__name__} columnwise={columnwise}")


def test_empty_input():
    x = Dev((0, 64), np.float32)
    rows = Dev((0, 64), FP8_NUMPY["e4m3"])
    scales = Dev(tc.mxfp8_scale_shape((0, 64)), E8M0)
    lib.quantize_mxfp8(x.desc, rows.desc, scales.desc, None, None, False, False, stream())
    torch.cuda.synchronize()
    assert scales.numpy().size == 0


def test_mixed_devices_are_rejected():
    x = Dev((32, 64), np.float32, fill=np.ones((32, 64), np.float32))
    rows, scales = np.zeros((32, 64), FP8_NUMPY["e4m3"]), np.zeros((128, 4), E8M0)  # on the host
    with pytest.raises(ValueError, match=r"argument 'rowwise' must be on the device of 'input' \(cuda:"):
        lib.quantize_mxfp8(x.desc, host_desc(rows), host_desc(scales), None, None, False, False, stream())
