"""Helpers of the tests that call the bindings on raw device buffers (the
`device` fixture: the CPU backend, and the CUDA backend marked gpu): buffers
with descriptors, byte comparisons, hostile inputs.

Those tests compare each backend's bytes with the NumPy API's (which runs the
CPU backend; the oracle checks of each family check that one). On the CUDA
device that is the CPU == CUDA contract; on the CPU it checks the raw-buffer
path: outputs prefilled with 0xA5 (an unwritten byte, padding included,
shows) and pointers off the 16-byte grid.
"""

from __future__ import annotations

import math

import core_device
import ml_dtypes
import numpy as np
import pytest
from conftest import gpu_scale

from transformer_engine.core import lib
from transformer_engine.core.dtypes import te_dtype
from transformer_engine.core.testing.tolerances import smallest_normal, smallest_subnormal

BF16 = np.dtype(ml_dtypes.bfloat16)
INPUT_DTYPES = [np.dtype(np.float32), BF16, np.dtype(np.float16)]
FP8 = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2)}
LAYOUTS = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}
# Odd shapes first; (32768, 64) and (256, 192) take the CUDA kernels'
# vectorized full-tile paths, (1000, 1000) the 8-byte columnwise stores,
# (3, 7, 33) unaligned rows. The two large ones run on CUDA only (gpu_scale).
SHAPES = [
    (1, 16),
    (5, 160),
    (217, 256),
    (3, 7, 33),
    (2, 3, 5, 64),
    *gpu_scale((32768, 64), (1000, 1000)),
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


class DeviceArray:
    """Raw bytes on the test's device (core_device) plus the core descriptor of
    the array they hold.

    offset (bytes) shifts the data pointer, to exercise the unaligned paths.
    Unwritten bytes read back as 0xA5, so a missing store is seen.
    Keep the DeviceArray alive until the call that uses its descriptor has been
    enqueued: the descriptor is a bare pointer, and a freed CUDA buffer is
    handed to the next torch allocation (whose fill kernel runs before ours).
    """

    def __init__(self, shape, dtype, offset: int = 0, fill: np.ndarray | None = None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.code = int(te_dtype(self.dtype))
        self.offset = offset
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.buffer = core_device.Buffer(self.nbytes + offset)
        if fill is not None:
            self.buffer.write(offset, np.ascontiguousarray(fill, dtype=self.dtype))

    @classmethod
    def of(cls, array: np.ndarray, offset: int = 0) -> DeviceArray:
        return cls(array.shape, array.dtype, offset, fill=array)

    @property
    def desc(self):
        if not self.nbytes:  # (an empty array: a null pointer, as the core expects)
            return lib.TensorDesc(0, self.code, list(self.shape), self.buffer.device_type, self.buffer.device_index)
        return self.buffer.desc(self.offset, self.code, self.shape)

    def numpy(self) -> np.ndarray:
        return self.buffer.read(self.offset, self.nbytes).view(self.dtype).reshape(self.shape)


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


def desc_or_none(d):
    return None if d is None else d.desc


def ctx(rng_seed, **kw) -> str:
    return ", ".join([f"seed={rng_seed}"] + [f"{k}={v}" for k, v in kw.items()])
