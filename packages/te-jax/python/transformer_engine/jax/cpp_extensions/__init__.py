"""te-core's kernels as JAX functions (XLA FFI custom calls, CPU and CUDA).

The building blocks of transformer_engine.jax's functional ops and Flax
modules; like the reference library's cpp_extensions, usable directly.
"""

from .activation import ActivationOutput, activation_bwd, activation_fwd
from .attention import AttentionForward, AttentionGrad, attention_bwd, attention_fwd, make_rng_state
from .block import gemm_block, nvfp4_amax, quantize_fp8_block, quantize_mxfp8, quantize_nvfp4
from .cast import compute_amax, delayed_scaling_update, dequantize_fp8, quantize_fp8, quantize_fp8_current_scaling
from .gemm import gemm
from .norm import NormForward, layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd
from .softmax import (
    scaled_masked_softmax_bwd,
    scaled_masked_softmax_fwd,
    scaled_softmax_bwd,
    scaled_softmax_fwd,
    scaled_upper_triang_masked_softmax_bwd,
    scaled_upper_triang_masked_softmax_fwd,
)

__all__ = [
    "ActivationOutput",
    "AttentionForward",
    "AttentionGrad",
    "NormForward",
    "activation_bwd",
    "activation_fwd",
    "attention_bwd",
    "attention_fwd",
    "compute_amax",
    "delayed_scaling_update",
    "dequantize_fp8",
    "gemm",
    "gemm_block",
    "layernorm_bwd",
    "layernorm_fwd",
    "make_rng_state",
    "nvfp4_amax",
    "quantize_fp8",
    "quantize_fp8_block",
    "quantize_fp8_current_scaling",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "rmsnorm_bwd",
    "rmsnorm_fwd",
    "scaled_masked_softmax_bwd",
    "scaled_masked_softmax_fwd",
    "scaled_softmax_bwd",
    "scaled_softmax_fwd",
    "scaled_upper_triang_masked_softmax_bwd",
    "scaled_upper_triang_masked_softmax_fwd",
]
