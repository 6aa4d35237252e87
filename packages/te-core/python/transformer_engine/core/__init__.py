"""transformer_engine.core: the native core at the NumPy level.

Every function takes and returns NumPy arrays (FP8 as ml_dtypes arrays) and
runs the core's CPU backend; framework packages call the same C entry points
on their own tensors through `transformer_engine.core.lib`.
"""

from ._native import lib
from .cast import (
    Fp8Tensor,
    compute_amax,
    compute_scale_from_amax,
    dequantize_fp8,
    quantize_fp8,
    quantize_fp8_current_scaling,
)
from .dtypes import DType, numpy_dtype, te_dtype
from .mxfp8 import Mxfp8Tensor, dequantize_mxfp8, mxfp8_scale_shape, quantize_mxfp8
from .scaling import delayed_scaling_update
from .swizzle import swizzle_block_scales, unswizzle_block_scales
from .transpose import transpose

__version__ = lib.version()


def built_with_cuda() -> bool:
    """True when this te-core build has the CUDA backend."""
    return lib.built_with_cuda()


__all__ = [
    "DType",
    "Fp8Tensor",
    "Mxfp8Tensor",
    "built_with_cuda",
    "compute_amax",
    "compute_scale_from_amax",
    "delayed_scaling_update",
    "dequantize_fp8",
    "dequantize_mxfp8",
    "lib",
    "mxfp8_scale_shape",
    "numpy_dtype",
    "quantize_fp8",
    "quantize_fp8_current_scaling",
    "quantize_mxfp8",
    "swizzle_block_scales",
    "te_dtype",
    "transpose",
    "unswizzle_block_scales",
]
