"""Raw byte buffers on the device a test runs on, for tests that call the
bindings (`lib.*`) with descriptors: one test body checks the CPU backend and,
marked gpu, the CUDA backend (the `device` fixture in conftest.py, the same
shape as te-pytorch's and te-jax's).

The fixture makes its device current for the test (as torch.set_default_device
does for torch), so that buffer helpers deep in a test's helpers need no device
argument: `Buffer(nbytes)` is host memory (a NumPy uint8 array) under "cpu" and
a CUDA allocation (a torch uint8 tensor; torch is imported only then) under
"cuda". A buffer starts filled with a byte pattern (0xA5 unless told), so a
byte the backend forgets to write shows up on either device.
"""

from __future__ import annotations

import contextlib

import numpy as np

from transformer_engine.core import lib

_CURRENT = ["cpu"]


def current() -> str:
    """The device the running test checks: "cpu" or "cuda"."""
    return _CURRENT[0]


@contextlib.contextmanager
def use(device: str):
    _CURRENT[0], previous = device, _CURRENT[0]
    try:
        yield device
    finally:
        _CURRENT[0] = previous


def cuda_ready() -> bool:
    """A CUDA device visible to torch and a te-core build with the CUDA backend."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available() and lib.built_with_cuda())


def _torch():
    import torch

    return torch


def stream() -> int:
    """The stream argument of a binding call: torch's current CUDA stream, 0 on the CPU."""
    if current() == "cpu":
        return 0
    return _torch().cuda.current_stream().cuda_stream


def sync() -> None:
    """Waits for the device's queued work (a no-op on the CPU, where calls are synchronous)."""
    if current() == "cuda":
        _torch().cuda.synchronize()


class Buffer:
    """`nbytes` bytes on the current device, each `fill` (0xA5 by default)."""

    def __init__(self, nbytes: int, fill: int = 0xA5) -> None:
        self.device = current()
        self.nbytes = int(nbytes)
        if self.device == "cpu":
            self.storage = np.full(self.nbytes, fill, np.uint8)
        else:
            torch = _torch()
            self.storage = torch.full((self.nbytes,), fill, dtype=torch.uint8, device="cuda")

    @property
    def ptr(self) -> int:
        if self.device == "cpu":
            return self.storage.ctypes.data
        return self.storage.data_ptr()

    @property
    def device_index(self) -> int:
        return 0 if self.device == "cpu" else (self.storage.device.index or 0)

    def write(self, offset: int, raw: np.ndarray) -> None:
        """Copies the bytes of `raw` (any array, viewed as uint8) to offset `offset`."""
        raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        if self.device == "cpu":
            self.storage[offset : offset + raw.size] = raw
        else:
            self.storage[offset : offset + raw.size] = _torch().from_numpy(raw.copy()).cuda()

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """nbytes bytes from `offset`, as a host uint8 array (a copy)."""
        if self.device == "cpu":
            return self.storage[offset : offset + nbytes].copy()
        return self.storage[offset : offset + nbytes].cpu().numpy()

    @property
    def device_type(self) -> int:
        """The descriptor's device type code of this buffer: 0 CPU, 1 CUDA."""
        return 0 if self.device == "cpu" else 1

    def desc(self, offset: int, dtype_code: int, shape) -> lib.TensorDesc:
        return lib.TensorDesc(self.ptr + offset, int(dtype_code), list(shape), self.device_type, self.device_index)

    def sync(self) -> None:
        """Waits for the queued work of this buffer's device."""
        if self.device == "cuda":
            _torch().cuda.synchronize()
