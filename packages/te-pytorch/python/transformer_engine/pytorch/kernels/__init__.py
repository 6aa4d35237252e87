"""te-core kernels as torch operators (namespace `te`: torch.ops.te.*).

Each op is registered with torch.library (one implementation for CPU and CUDA
tensors: it builds te-core descriptors and calls the core on the tensors'
device and current stream) plus a fake kernel for torch.compile. The public
functions here call the implementations directly in eager mode and the
registered ops while torch.compile traces. Autograd lives in the modules, not
in these ops.
"""

from .activation import activation_bwd, activation_bwd_fwd_columnwise, activation_fwd
from .attention import attention_bwd, attention_fwd
from .cast import (
    compute_amax,
    compute_scale_from_amax,
    dequantize_fp8,
    quantize_fp8,
    quantize_fp8_current_scaling,
)
from .fp8_block import dequantize_fp8_block, quantize_fp8_block
from .gemm import gemm, gemm_accumulate
from .gemm_block import gemm_block, gemm_block_accumulate
from .mxfp8 import dequantize_mxfp8, quantize_mxfp8
from .norm import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd
from .nvfp4 import dequantize_nvfp4, quantize_nvfp4
from .recipe import delayed_scaling_update
from .rope import rope_bwd, rope_fwd
from .transpose import transpose

__all__ = [
    "activation_bwd",
    "activation_bwd_fwd_columnwise",
    "activation_fwd",
    "attention_bwd",
    "attention_fwd",
    "compute_amax",
    "compute_scale_from_amax",
    "delayed_scaling_update",
    "dequantize_fp8",
    "dequantize_fp8_block",
    "dequantize_mxfp8",
    "dequantize_nvfp4",
    "gemm",
    "gemm_accumulate",
    "gemm_block",
    "gemm_block_accumulate",
    "layernorm_bwd",
    "layernorm_fwd",
    "quantize_fp8",
    "quantize_fp8_block",
    "quantize_fp8_current_scaling",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "rope_bwd",
    "rope_fwd",
    "rmsnorm_bwd",
    "rmsnorm_fwd",
    "transpose",
]
