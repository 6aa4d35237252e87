"""transformer_engine.pytorch: Transformer Engine for PyTorch.

    import transformer_engine.pytorch as te

Pure Python on top of te-core's native core: nothing here is compiled against
torch, so any torch >= 2.1 works, CPU-only builds included (the core's CPU
backend then emulates FP8 numerics bit-exactly).

This is the package skeleton: version, FP8 availability, QuantizerRole. The
modules (Linear, LayerNormLinear, LayerNormMLP, ...), autocast and the
quantized tensors come in later work; they are absent, not stubbed.
"""

import re as _re

import torch as _torch
import transformer_engine.core  # noqa: F401 - loads the native core once, up front
from transformer_engine.common.recipe import QuantizerRole

from .device import get_device_compute_capability, is_fp8_available

__version__ = "0.1.0"

__all__ = [
    "QuantizerRole",
    "get_device_compute_capability",
    "is_fp8_available",
]


def _check_torch_version() -> None:
    match = _re.match(r"(\d+)\.(\d+)", _torch.__version__)
    if match is None or (int(match[1]), int(match[2])) < (2, 1):
        raise ImportError(f"transformer_engine.pytorch needs torch >= 2.1, found {_torch.__version__}")


_check_torch_version()
