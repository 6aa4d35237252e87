"""Quantized tensors and quantizers (per-tensor FP8 today).

Every class is registered with torch.serialization.add_safe_globals so that
torch.load(..., weights_only=True) (torch's default) restores them.
"""

import torch

from .float8_tensor import (
    SAFE_GLOBALS,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
)
from .quantized_tensor import QuantizedTensor, Quantizer

torch.serialization.add_safe_globals(SAFE_GLOBALS)

__all__ = [
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "QuantizedTensor",
    "Quantizer",
]
