"""What the current device and the installed core can run.

The is_*_available functions answer as the reference does: whether the format
runs natively (its kernels and GEMMs on this GPU), a bool, or (bool, reason)
with return_reason=True, reason "" when available. Unlike the reference,
every format also runs where the answer is False: on the CPU (te-core's CPU
backend, bit-exact numerics) and, for the block-scaled formats, on GPUs
without their native GEMM (quantization on the GPU, GEMM on dequantized
operands). The reason says so, so that callers know it is emulation.
"""

from __future__ import annotations

import re

import torch

from transformer_engine import core


def get_device_compute_capability() -> tuple[int, int]:
    """(major, minor) compute capability of the current CUDA device."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props.major, props.minor


def get_cudnn_version() -> tuple[int, int, int]:
    """(major, minor, patch) of the cuDNN torch runs with.

    te does not link cuDNN itself (its attention is te-core's own kernel), so
    this is torch's; RuntimeError when torch has none (CPU-only builds)."""
    encoded = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if not encoded:
        raise RuntimeError("get_cudnn_version: this torch build has no cuDNN (a CPU-only build?)")
    # cuDNN 9 encodes major * 10000 + minor * 100 + patch; older ones major * 1000 + minor * 100 + patch.
    magnitude = 10000 if encoded >= 90000 else 1000
    return encoded // magnitude, (encoded % magnitude) // 100, encoded % 100


def _cuda_version(text: str | None) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match[1]), int(match[2])) if match else (0, 0)


def _device_reason(what: str) -> str:
    """The reason when no GPU can run `what` natively, or "" when one might."""
    if not torch.cuda.is_available():
        return (
            f"no CUDA device is visible to torch: {what} runs emulated on the CPU "
            "(te-core's CPU backend, the same bytes as the GPU, slower)"
        )
    if not core.built_with_cuda():
        return (
            f"te-core was built without its CUDA backend (TE_WITH_CUDA=OFF), so {what} runs emulated on the CPU; "
            "rebuild it with CUDA to run it on the GPU"
        )
    return ""


def _fp8_support() -> tuple[bool, str]:
    reason = _device_reason("FP8")
    if reason:
        return False, reason
    capability = get_device_compute_capability()
    if capability < (8, 9):
        return False, (
            f"FP8 needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
            f"the current device has {capability[0]}.{capability[1]}"
        )
    if capability == (8, 9) and _cuda_version(torch.version.cuda) < (12, 1):
        return False, f"FP8 on compute capability 8.9 needs CUDA 12.1 or newer, torch has {torch.version.cuda}"
    return True, ""


def _block_support(what: str, native: str, emulated: str, is_native) -> tuple[bool, str]:
    """Native support of a block-scaled format: is_native(capability, cuda) -> bool."""
    reason = _device_reason(what)
    if reason:
        return False, reason
    capability = get_device_compute_capability()
    if is_native(capability, _cuda_version(torch.version.cuda)):
        return True, ""
    return False, (
        f"{what} GEMMs need {native}; the current device has {capability[0]}.{capability[1]}, where "
        f"te runs {what} {emulated}"
    )


_EMULATED_GEMM = "emulated: quantization on the GPU, GEMMs on the dequantized operands"


def _mxfp8_support() -> tuple[bool, str]:
    return _block_support(
        "MXFP8", "compute capability 10.x (Blackwell)", _EMULATED_GEMM, lambda cc, cuda: 10 <= cc[0] < 12
    )


def _fp8_block_scaling_support() -> tuple[bool, str]:
    return _block_support(
        "FP8 block scaling",
        "compute capability 9.0 (Hopper) and CUDA 12.9 or newer",
        _EMULATED_GEMM,
        lambda cc, cuda: cc[0] == 9 and cuda >= (12, 9),
    )


def _nvfp4_support() -> tuple[bool, str]:
    return _block_support("NVFP4", "compute capability 10.x (Blackwell)", _EMULATED_GEMM, lambda cc, cuda: cc[0] == 10)


def _answer(support, return_reason: bool):
    available, reason = support()
    return (available, reason) if return_reason else available


def is_fp8_available(return_reason: bool = False):
    """Whether per-tensor FP8 (DelayedScaling, Float8CurrentScaling) runs natively on the current GPU.

    Needs a CUDA device with compute capability >= 8.9 (CUDA >= 12.1 on 8.9)
    and a te-core build with the CUDA backend. Returns a bool, or
    (bool, reason) with return_reason=True; reason is "" when available.
    """
    return _answer(_fp8_support, return_reason)


def is_mxfp8_available(return_reason: bool = False):
    """Whether MXFP8BlockScaling runs natively (compute capability 10.x); see is_fp8_available."""
    return _answer(_mxfp8_support, return_reason)


def is_fp8_block_scaling_available(return_reason: bool = False):
    """Whether Float8BlockScaling runs natively (compute capability 9.0, CUDA >= 12.9); see is_fp8_available."""
    return _answer(_fp8_block_scaling_support, return_reason)


def is_nvfp4_available(return_reason: bool = False):
    """Whether NVFP4BlockScaling runs natively (compute capability 10.x); see is_fp8_available."""
    return _answer(_nvfp4_support, return_reason)


def _bf16_support() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return True, ""  # (the CPU computes in BF16: torch and te-core's CPU backend)
    capability = get_device_compute_capability()
    if capability < (8, 0):
        return (
            False,
            f"BF16 needs compute capability 8.0 or newer; the current device has {capability[0]}.{capability[1]}",
        )
    return True, ""


def is_bf16_available(return_reason: bool = False):
    """Whether BF16 compute is available (compute capability >= 8.0; always on the CPU)."""
    return _answer(_bf16_support, return_reason)
