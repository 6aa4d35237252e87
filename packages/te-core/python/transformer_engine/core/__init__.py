"""transformer_engine.core: the native core at the NumPy level.

Every function takes and returns NumPy arrays (FP8 as ml_dtypes arrays) and
runs the core's CPU backend; framework packages call the same C entry points
on their own tensors through `transformer_engine.core.lib`.
"""

from ._native import lib
from .activation import (
    ACTIVATIONS,
    ActivationGrad,
    activation_backward,
    activation_forward,
)
from .cast import (
    Fp8Tensor,
    compute_amax,
    compute_scale_from_amax,
    dequantize_fp8,
    quantize_fp8,
    quantize_fp8_current_scaling,
)
from .dtypes import DType, numpy_dtype, te_dtype
from .gemm import GemmOutput, gemm
from .scaling import delayed_scaling_update
from .transpose import transpose

__version__ = lib.version()


def built_with_cuda() -> bool:
    """True when this te-core build has the CUDA backend."""
    return lib.built_with_cuda()


__all__ = [
    "ACTIVATIONS",
    "ActivationGrad",
    "activation_backward",
    "activation_forward",
    "DType",
    "Fp8Tensor",
    "GemmOutput",
    "built_with_cuda",
    "compute_amax",
    "compute_scale_from_amax",
    "delayed_scaling_update",
    "dequantize_fp8",
    "gemm",
    "lib",
    "numpy_dtype",
    "quantize_fp8",
    "quantize_fp8_current_scaling",
    "te_dtype",
    "transpose",
]
