"""te-core's kernels as JAX functions (XLA FFI custom calls, CPU and CUDA).

The building blocks of transformer_engine.jax's functional ops and Flax
modules; like the reference library's cpp_extensions, usable directly.
"""

from .cast import compute_amax, delayed_scaling_update, dequantize_fp8, quantize_fp8, quantize_fp8_current_scaling
from .gemm import gemm

__all__ = [
    "compute_amax",
    "delayed_scaling_update",
    "dequantize_fp8",
    "gemm",
    "quantize_fp8",
    "quantize_fp8_current_scaling",
]
