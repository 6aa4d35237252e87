"""te-core kernels as torch operators (namespace `te`: torch.ops.te.*).

Each op is registered with torch.library (one implementation for CPU and CUDA
tensors: it builds te-core descriptors and calls the core on the tensors'
device and current stream) plus a fake kernel for torch.compile. The public
functions here call the implementations directly in eager mode and the
registered ops while torch.compile traces. Autograd lives in the modules, not
in these ops.
"""

from .activation import activation_bwd, activation_fwd
from .cast import (
    compute_amax,
    compute_scale_from_amax,
    dequantize_fp8,
    quantize_fp8,
    quantize_fp8_current_scaling,
)
from .gemm import gemm, gemm_accumulate
from .norm import norm_bwd, norm_fwd
from .recipe import delayed_scaling_update

__all__ = [
    "activation_bwd",
    "activation_fwd",
    "compute_amax",
    "compute_scale_from_amax",
    "delayed_scaling_update",
    "dequantize_fp8",
    "gemm",
    "gemm_accumulate",
    "norm_bwd",
    "norm_fwd",
    "quantize_fp8",
    "quantize_fp8_current_scaling",
]
