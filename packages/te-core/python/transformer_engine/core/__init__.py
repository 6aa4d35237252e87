"""transformer_engine.core: the native core at the NumPy level.

Every function takes and returns NumPy arrays (FP8 as ml_dtypes arrays) and
runs the core's CPU backend; framework packages call the same C entry points
on their own tensors through `transformer_engine.core.lib`.
"""

from ._native import lib
from .activation import (
    ACTIVATIONS,
    ActivationGrad,
    ForwardColumnwise,
    HighPrecisionOutput,
    activation_backward,
    activation_forward,
)
from .attention import AttentionForward, AttentionGrad, attention_backend, attention_bwd, attention_fwd
from .cast import (
    Fp8Tensor,
    compute_amax,
    compute_scale_from_amax,
    dequantize_fp8,
    quantize_fp8,
    quantize_fp8_current_scaling,
)
from .dtypes import DType, numpy_dtype, te_dtype
from .fp8_block import (
    Fp8BlockTensor,
    dequantize_fp8_block,
    fp8_block_scale_shape,
    quantize_fp8_block,
    transpose_fp8_block_2d,
)
from .gemm import GemmOutput, gemm
from .gemm_block import (
    BlockOperand,
    GemmBlockResult,
    gemm_block,
    gemm_block_grouped,
    operand,
    plan_gemm_block,
)
from .mxfp8 import Mxfp8Tensor, dequantize_mxfp8, mxfp8_scale_shape, quantize_mxfp8
from .norm import NormForward, layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd
from .nvfp4 import (
    Nvfp4Tensor,
    compute_amax_nvfp4,
    dequantize_nvfp4,
    pack_fp4,
    quantize_nvfp4,
    rht_sign_mask_from_seed,
    transpose_nvfp4_2d,
    unpack_fp4,
)
from .rope import fused_rope_backward, fused_rope_forward
from .scaling import AmaxWarning, ScalingUpdate, delayed_scaling_update
from .softmax import (
    scaled_aligned_causal_masked_softmax_backward,
    scaled_aligned_causal_masked_softmax_forward,
    scaled_masked_softmax_backward,
    scaled_masked_softmax_forward,
    scaled_softmax_backward,
    scaled_softmax_forward,
    scaled_upper_triang_masked_softmax_backward,
    scaled_upper_triang_masked_softmax_forward,
)
from .swizzle import swizzle_block_scales, unswizzle_block_scales
from .transpose import transpose

__version__ = lib.version()


def built_with_cuda() -> bool:
    """True when this te-core build has the CUDA backend."""
    return lib.built_with_cuda()


__all__ = [
    "ACTIVATIONS",
    "ActivationGrad",
    "AmaxWarning",
    "ForwardColumnwise",
    "HighPrecisionOutput",
    "activation_backward",
    "activation_forward",
    "AttentionForward",
    "AttentionGrad",
    "attention_backend",
    "attention_bwd",
    "attention_fwd",
    "BlockOperand",
    "DType",
    "Fp8BlockTensor",
    "Fp8Tensor",
    "GemmBlockResult",
    "GemmOutput",
    "Mxfp8Tensor",
    "NormForward",
    "Nvfp4Tensor",
    "built_with_cuda",
    "compute_amax",
    "compute_amax_nvfp4",
    "compute_scale_from_amax",
    "delayed_scaling_update",
    "dequantize_fp8",
    "dequantize_fp8_block",
    "dequantize_mxfp8",
    "dequantize_nvfp4",
    "fp8_block_scale_shape",
    "gemm",
    "gemm_block",
    "gemm_block_grouped",
    "layernorm_bwd",
    "layernorm_fwd",
    "lib",
    "mxfp8_scale_shape",
    "numpy_dtype",
    "operand",
    "pack_fp4",
    "plan_gemm_block",
    "quantize_fp8",
    "quantize_fp8_block",
    "quantize_fp8_current_scaling",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "rht_sign_mask_from_seed",
    "rmsnorm_bwd",
    "rmsnorm_fwd",
    "ScalingUpdate",
    "swizzle_block_scales",
    "te_dtype",
    "transpose",
    "transpose_fp8_block_2d",
    "transpose_nvfp4_2d",
    "unpack_fp4",
    "unswizzle_block_scales",
    "fused_rope_backward",
    "fused_rope_forward",
    "scaled_aligned_causal_masked_softmax_backward",
    "scaled_aligned_causal_masked_softmax_forward",
    "scaled_masked_softmax_backward",
    "scaled_masked_softmax_forward",
    "scaled_softmax_backward",
    "scaled_softmax_forward",
    "scaled_upper_triang_masked_softmax_backward",
    "scaled_upper_triang_masked_softmax_forward",
]
