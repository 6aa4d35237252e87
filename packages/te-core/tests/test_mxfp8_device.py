"""MXFP8 on every backend: the bindings called with raw buffers on the test's
device (the CPU backend in CI, CUDA on the GPU machine), bit-exact against the
NumPy API and the oracle (reference_mxfp8). The CPU-only cases are in test_mxfp8.py."""

from __future__ import annotations

import math

import core_device
import ml_dtypes
import numpy as np
import pytest
from conftest import CUDA_ONLY, FP8_FORMATS, INPUT_DTYPES, gpu_scale
from test_mxfp8 import MODES, mxfp8_hostile

import transformer_engine.core as tc
from transformer_engine.core import reference_mxfp8 as ref
from transformer_engine.core._arrays import desc
from transformer_engine.core.dtypes import te_dtype
from transformer_engine.core.reference import FP8_NUMPY

pytestmark = [pytest.mark.mxfp8, pytest.mark.swizzle]

lib = tc.lib
E8M0 = ml_dtypes.float8_e8m0fnu

# ---- every backend: raw buffers on the test's device -------------------------
# The bindings called with descriptors of buffers on `device` (offsets for the
# unaligned paths, 0xA5-filled outputs so that an unwritten byte -- scale
# padding included -- shows up): the bytes equal the NumPy API's (the CPU
# backend) and the oracle's. The shapes go beyond SHAPES where a CUDA kernel
# has tiles: K = 32, 96, 160, 416 leave part of a 64- or 128-column tile
# empty; M = 160, 288, 1056 part of a 64- or 128-row tile, with scale padding
# in both directions (1056 / 32 = 33 strips, padded to 36); (512, 4096) and
# (2048, 1024) fill many warps and blocks.

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(d) for d in INPUT_DTYPES]
BACKEND_SHAPES = [(32, 32), (96, 64), (160, 96), (2, 3, 32, 64), (64, 160), (288, 416), (1056, 160)] + gpu_scale(
    (512, 4096), (2048, 1024)
)
BACKEND_ROWWISE_ONLY_SHAPES = [(1, 32), (5, 64), (33, 96), (3, 5, 160), (200, 416)] + gpu_scale((1000, 1024))
NAN_BITS = {
    np.dtype(np.float32): (np.uint32, [0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFC00001]),
    BF16: (np.uint16, [0x7FC0, 0xFFC0, 0x7FFF, 0xFFC1]),
    np.dtype(np.float16): (np.uint16, [0x7E00, 0xFE00, 0x7FFF, 0xFE01]),
}


class Dev:
    """Raw bytes on the test's device for an array of `shape` and numpy `dtype`,
    starting `offset` bytes into the allocation (offset != 0 takes the
    unaligned paths); the bytes start as 0xA5 unless `fill` is given."""

    def __init__(self, shape, dtype, offset=0, fill: np.ndarray | None = None):
        self.shape, self.dtype, self.offset = tuple(shape), np.dtype(dtype), offset
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.buf = core_device.Buffer(self.nbytes + offset)
        if fill is not None:
            self.buf.write(offset, np.ascontiguousarray(fill, self.dtype))

    @property
    def desc(self):
        return self.buf.desc(self.offset, te_dtype(self.dtype), self.shape)

    def numpy(self) -> np.ndarray:
        return self.buf.read(self.offset, self.nbytes).view(self.dtype).reshape(self.shape)


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


def quantize_on_device(x, fmt, mode, swizzled, in_offset=0, out_offset=0):
    rowwise, columnwise, use_2d = MODES[mode]
    x_dev = Dev(x.shape, x.dtype, in_offset, fill=x)
    outs = []
    for wanted, is_col in ((rowwise, False), (columnwise, True)):
        data = Dev(x.shape, FP8_NUMPY[fmt], out_offset) if wanted else None
        scales = Dev(tc.mxfp8_scale_shape(x.shape, is_col), E8M0) if wanted else None
        outs += [data, scales]
    lib.quantize_mxfp8(
        x_dev.desc, *(None if o is None else o.desc for o in outs), use_2d, swizzled, core_device.stream()
    )
    return [None if o is None else o.numpy() for o in outs]


def check_against_numpy_api(x, fmt, mode, swizzled, **offsets):
    rowwise, columnwise, use_2d = MODES[mode]
    got = quantize_on_device(x, fmt, mode, swizzled, **offsets)
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
@pytest.mark.parametrize("shape", BACKEND_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_device_quantize_matches_numpy_api_and_oracle(device, rng, fmt, dtype, shape, mode, swizzled):
    x = with_nan_payloads(mxfp8_hostile(rng, shape, dtype, fmt), rng)
    check_against_numpy_api(x, fmt, mode, swizzled)


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("shape", BACKEND_ROWWISE_ONLY_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_device_rowwise_any_row_count(device, rng, fmt, dtype, shape, swizzled):
    x = with_nan_payloads(mxfp8_hostile(rng, shape, dtype, fmt), rng)
    check_against_numpy_api(x, fmt, "rowwise", swizzled)


@pytest.mark.parametrize("offsets", [{"in_offset": 2}, {"in_offset": 4, "out_offset": 1}, {"out_offset": 2}])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_device_unaligned_pointers_take_the_elementwise_path(device, rng, dtype, mode, offsets):
    x = mxfp8_hostile(rng, (96, 160), dtype, "e4m3")
    if dtype.itemsize == 4 and offsets.get("in_offset", 0) % 4:
        offsets = {**offsets, "in_offset": 4}  # keep FP32 elements 4-byte aligned
    check_against_numpy_api(x, "e4m3", mode, False, **offsets)


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_device_dequantize_matches_numpy_api(device, rng, fmt, out_dtype, columnwise, swizzled):
    """Every FP8 code (NaN and inf included) with every scale byte (0, 254, 255 included)."""
    shape = (64, 320)
    q = rng.integers(0, 256, shape, dtype=np.uint8).view(FP8_NUMPY[fmt])
    s = rng.integers(0, 256, tc.mxfp8_scale_shape(shape, columnwise), dtype=np.uint8)
    s.reshape(-1)[:3] = [0, 254, 255]
    s = s.view(E8M0)
    want = tc.dequantize_mxfp8(q, s, columnwise=columnwise, swizzled_scales=swizzled, out_dtype=out_dtype)
    for offset in (0, 4):  # 4: not 16-byte aligned
        q_dev, s_dev = Dev(shape, q.dtype, offset, fill=q), Dev(s.shape, E8M0, fill=s)
        out = Dev(shape, out_dtype, offset)
        lib.dequantize_mxfp8(q_dev.desc, s_dev.desc, out.desc, columnwise, swizzled, core_device.stream())
        assert_same(out.numpy(), want, f"dequantize {fmt} -> {np.dtype(out_dtype)} offset={offset}")


@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("tiles", [(1, 1), (3, 2), (2, 33)])
def test_device_swizzle_matches_numpy_api(device, rng, columnwise, tiles):
    shape = (tiles[0] * 128, tiles[1] * 4)
    shape = shape[::-1] if columnwise else shape
    s = rng.integers(0, 256, shape, dtype=np.uint8).view(E8M0)
    for fn, cpu in (
        (lib.swizzle_block_scales, tc.swizzle_block_scales),
        (lib.unswizzle_block_scales, tc.unswizzle_block_scales),
    ):
        src, dst = Dev(shape, E8M0, fill=s), Dev(shape, E8M0)
        fn(src.desc, dst.desc, columnwise, core_device.stream())
        assert_same(dst.numpy(), cpu(s, columnwise=columnwise), f"{fn.__name__} columnwise={columnwise}")


def test_device_empty_input(device):
    x = Dev((0, 64), np.float32)
    rows = Dev((0, 64), FP8_NUMPY["e4m3"])
    scales = Dev(tc.mxfp8_scale_shape((0, 64)), E8M0)
    lib.quantize_mxfp8(x.desc, rows.desc, scales.desc, None, None, False, False, core_device.stream())
    core_device.sync()
    assert scales.numpy().size == 0


@CUDA_ONLY
def test_cuda_input_with_host_outputs_is_rejected(device):
    x = Dev((32, 64), np.float32, fill=np.ones((32, 64), np.float32))
    rows, scales = np.zeros((32, 64), FP8_NUMPY["e4m3"]), np.zeros((128, 4), E8M0)  # on the host
    with pytest.raises(ValueError, match=r"argument 'rowwise' must be on the device of 'input' \(cuda:"):
        lib.quantize_mxfp8(x.desc, desc(rows), desc(scales), None, None, False, False, core_device.stream())
