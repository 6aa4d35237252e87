"""ScalingMode: how a quantizer scales a tensor (the reference library's names)."""

from __future__ import annotations

from enum import Enum


class ScalingMode(Enum):
    """NO_SCALING: no quantization (high-precision GEMMs).

    DELAYED_TENSOR_SCALING: one FP32 scale per tensor, computed from the amax
    history of earlier steps (DelayedScaling).
    CURRENT_TENSOR_SCALING: one FP32 scale per tensor, computed from the
    tensor's own amax at each cast (Float8CurrentScaling).

    Block modes (MXFP8_1D_SCALING, NVFP4_*) arrive with their quantizers.
    """

    NO_SCALING = "no_scaling"
    DELAYED_TENSOR_SCALING = "delayed_tensor_scaling"
    CURRENT_TENSOR_SCALING = "current_tensor_scaling"
