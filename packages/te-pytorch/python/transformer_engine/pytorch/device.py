"""What the current device and the installed core can run."""

from __future__ import annotations

import re

import torch

from transformer_engine import core


def get_device_compute_capability() -> tuple[int, int]:
    """(major, minor) compute capability of the current CUDA device."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props.major, props.minor


def _cuda_version(text: str | None) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match[1]), int(match[2])) if match else (0, 0)


def _fp8_support() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, (
            "no CUDA device is visible to torch (FP8 numerics can still be emulated "
            "on the CPU by te-core's CPU backend)"
        )
    capability = get_device_compute_capability()
    if capability < (8, 9):
        return False, (
            f"FP8 needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
            f"the current device has {capability[0]}.{capability[1]}"
        )
    if capability == (8, 9) and _cuda_version(torch.version.cuda) < (12, 1):
        return False, f"FP8 on compute capability 8.9 needs CUDA 12.1 or newer, torch has {torch.version.cuda}"
    if not core.built_with_cuda():
        return False, (
            "te-core was built without its CUDA backend (TE_WITH_CUDA=OFF); rebuild it with CUDA to run FP8 on the GPU"
        )
    return True, ""


def is_fp8_available(return_reason: bool = False):
    """Whether per-tensor FP8 runs on the current GPU.

    Needs a CUDA device with compute capability >= 8.9 (CUDA >= 12.1 on 8.9)
    and a te-core build with the CUDA backend. Returns a bool, or
    (bool, reason) with return_reason=True; reason is "" when available.
    """
    available, reason = _fp8_support()
    return (available, reason) if return_reason else available
