"""Quantized tensors and quantizers: per-tensor FP8, MXFP8, FP8 block scaling, NVFP4.

Every class is registered with torch.serialization.add_safe_globals so that
torch.load(..., weights_only=True) (torch's default) restores them.
"""

import torch

from . import _block_tensor, float8_blockwise_tensor, mxfp8_tensor, nvfp4_tensor
from .float8_blockwise_tensor import Float8BlockQuantizer, Float8BlockwiseQTensor
from .float8_tensor import (
    SAFE_GLOBALS,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
)
from .mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
from .nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor
from .quantized_tensor import QuantizedTensor, Quantizer

torch.serialization.add_safe_globals(SAFE_GLOBALS)
torch.serialization.add_safe_globals(
    [_block_tensor._rebuild_block_tensor]
    + mxfp8_tensor.SAFE_GLOBALS
    + float8_blockwise_tensor.SAFE_GLOBALS
    + nvfp4_tensor.SAFE_GLOBALS
)

__all__ = [
    "Float8BlockQuantizer",
    "Float8BlockwiseQTensor",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "QuantizedTensor",
    "Quantizer",
]
