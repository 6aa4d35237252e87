"""ScalingMode: how a quantizer scales a tensor (the reference library's names)."""

from __future__ import annotations

from enum import Enum


class ScalingMode(Enum):
    """NO_SCALING: no quantization (high-precision GEMMs).

    DELAYED_TENSOR_SCALING: one FP32 scale per tensor, computed from the amax
    history of earlier steps (DelayedScaling).
    CURRENT_TENSOR_SCALING: one FP32 scale per tensor, computed from the
    tensor's own amax at each cast (Float8CurrentScaling).
    MXFP8_1D_SCALING: one E8M0 (power-of-two) scale per block of 32 elements,
    from the block's own amax (MXFP8BlockScaling).
    FP8_BLOCK_SCALING: one FP32 scale per 1x128 block or 128x128 tile, from the
    block's own amax (Float8BlockScaling; te-jax's name: the reference's JAX has
    no such mode).

    NVFP4_1D_SCALING / NVFP4_2D_SCALING: E2M1 data, one E4M3 scale per 16 elements
    (per 16x16 tile for 2D: weights by default) and a global FP32 scale from the
    tensor's amax (NVFP4BlockScaling).
    """

    NO_SCALING = "no_scaling"
    DELAYED_TENSOR_SCALING = "delayed_tensor_scaling"
    CURRENT_TENSOR_SCALING = "current_tensor_scaling"
    MXFP8_1D_SCALING = "mxfp8_1d_scaling"
    FP8_BLOCK_SCALING = "fp8_block_scaling"
    NVFP4_1D_SCALING = "nvfp4_1d_scaling"
    NVFP4_2D_SCALING = "nvfp4_2d_scaling"

    def is_tensor_scaling(self) -> bool:
        """One scale per tensor (delayed or current scaling)."""
        return self in (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING)
