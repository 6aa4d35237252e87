"""The NVFP4 tests on raw device buffers (the `device` fixture): every entry
point on the test's device, compared byte for byte with the NumPy API (the CPU
backend) on the same inputs: amaxes, packed E2M1 data, E4M3 scales including
their zero padding, dequantized values (NaN bits included) and the 2-D
transpose. Output buffers start as 0xA5 so that a missing store shows."""

from __future__ import annotations

import core_device
import ml_dtypes
import numpy as np

import transformer_engine.core as tc
from transformer_engine.core import lib
from transformer_engine.core.dtypes import DType, te_dtype
from transformer_engine.core.nvfp4 import RHT_SIGN_MASK, scale_shape


class Dev:
    """Raw bytes on the test's device (0xA5 unless filled) plus the descriptor of
    the array they hold."""

    def __init__(self, nbytes: int, code: int, shape, fill=None, offset: int = 0):
        self.code, self.shape, self.offset, self.nbytes = int(code), [int(d) for d in shape], offset, int(nbytes)
        self.buf = core_device.Buffer(self.nbytes + offset)
        if fill is not None:
            self.buf.write(offset, np.ascontiguousarray(fill))

    @classmethod
    def of(cls, array: np.ndarray, offset: int = 0) -> Dev:
        array = np.ascontiguousarray(array)
        return cls(array.nbytes, te_dtype(array.dtype), array.shape, array, offset)

    @property
    def desc(self):
        # A bare pointer: keep this Dev alive until the call using it has been enqueued.
        return self.buf.desc(self.offset, self.code, self.shape)

    def bytes(self) -> np.ndarray:
        return self.buf.read(self.offset, self.nbytes)


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


def device_quantize(x, rowwise=True, columnwise=True, seed=0, offset=0, **mode):
    """compute_amax then quantize on the test's device; returns the host copies of the results."""
    m, k = x.size // x.shape[-1], x.shape[-1]
    xd = Dev.of(x)
    mask = RHT_SIGN_MASK if mode.get("random_hadamard") else 0
    amax_row, amax_col = Dev.of(np.float32(7.0)), Dev.of(np.float32(7.0))  # overwritten
    lib.nvfp4_compute_amax(
        xd.desc, amax_row.desc, amax_col.desc, bool(mode.get("random_hadamard")), mask, core_device.stream()
    )
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
        stream=core_device.stream(),
    )
    core_device.sync()
    out = {"amax_rowwise": amax_row.bytes(), "amax_columnwise": amax_col.bytes()}
    if rowwise:
        out["rowwise"], out["rowwise_scale"] = row[0].bytes(), row[1].bytes()
    if columnwise:
        out["columnwise"], out["columnwise_scale"] = col[0].bytes(), col[1].bytes()
    return out


def compare_with_numpy_api(x, rowwise=True, columnwise=True, seed=0, offset=0, **mode):
    got = device_quantize(x, rowwise, columnwise, seed, offset, **mode)
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
    """Both directions on the test's device with the given global amaxes (rowwise, columnwise),
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
        stream=core_device.stream(),
    )
    core_device.sync()
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


def with_negative_nans(rng, x):
    """x with some elements replaced by NaNs whose sign bit is set (and a payload):
    the codes of NaN are +6 whatever the NaN's bits."""
    flat = x.reshape(-1).copy()
    bits = flat.view({2: np.uint16, 4: np.uint32}[flat.dtype.itemsize])
    nan = {2: 0xFFC1 if flat.dtype == ml_dtypes.bfloat16 else 0xFE01, 4: 0xFFC00123}[flat.dtype.itemsize]
    bits[rng.random(flat.size) < 0.02] = nan
    return flat.reshape(x.shape)
