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

    NVFP4 modes arrive with their quantizers.
    """

    NO_SCALING = "no_scaling"
    DELAYED_TENSOR_SCALING = "delayed_tensor_scaling"
    CURRENT_TENSOR_SCALING = "current_tensor_scaling"
    MXFP8_1D_SCALING = "mxfp8_1d_scaling"
    FP8_BLOCK_SCALING = "fp8_block_scaling"

    def is_tensor_scaling(self) -> bool:
        """One scale per tensor (delayed or current scaling)."""
        return self in (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING)
