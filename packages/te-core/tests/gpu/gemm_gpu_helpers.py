"""The device buffers of the attention GPU tests (gpu/test_attention_*_gpu.py,
not yet folded into tests/ with the `device` fixture): gemm_device's
DeviceArray, always on CUDA."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import core_device  # noqa: E402
import gemm_device  # noqa: E402


class DeviceArray(gemm_device.DeviceArray):
    def __init__(self, *args, **kwargs) -> None:
        with core_device.use("cuda"):
            super().__init__(*args, **kwargs)
