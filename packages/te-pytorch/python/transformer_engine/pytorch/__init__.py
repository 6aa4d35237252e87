"""transformer_engine.pytorch: Transformer Engine for PyTorch::

    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    layer = te.Linear(768, 3072)
    with te.autocast(recipe=recipe.DelayedScaling()):
        out = layer(inp)
    out.sum().backward()

Pure Python on top of te-core's native core: nothing here is compiled against
torch, so any torch >= 2.4 works, CPU-only builds included (the core's CPU
backend then runs every op and emulates the FP8 numerics bit-exactly).

Implemented: Linear, LayerNormLinear, LayerNormMLP (LayerNorm or RMSNorm;
gelu, relu, silu, qgelu, srelu and the gated geglu, reglu, swiglu, qgeglu,
sreglu, glu, clamped_swiglu), LayerNorm, RMSNorm; DotProductAttention (te-core's fused attention op, torch SDPA or
an unfused torch backend), MultiheadAttention, TransformerLayer,
RotaryPositionEmbedding / attention.rope.apply_rotary_pos_emb and
InferenceParams (KV cache, contiguous or paged); autocast (and the deprecated
fp8_autocast) and quantized_model_init (te.Linear weights held only in a
quantized format; the deprecated fp8_model_init) with DelayedScaling,
Float8CurrentScaling and the block-scaled recipes MXFP8BlockScaling,
Float8BlockScaling and NVFP4BlockScaling (the GEMMs of every module;
emulated where the device has no native kernel, with a one-time
warning); Float8Tensor, MXFP8Tensor, Float8BlockwiseQTensor, NVFP4Tensor and
their quantizers; the fusible operations of te.ops (Sequential, BasicLinear,
Linear, Bias, the norms and activations, ...); the te-core ops as torch.ops.te.*. The rest of the
reference's API comes later.
"""

import re as _re

import torch as _torch

import transformer_engine.core  # noqa: F401 - loads the native core once, up front
from transformer_engine.common.recipe import QuantizerRole
from transformer_engine.core import DType


def _check_torch_version() -> None:
    # torch.library.custom_op and register_fake arrived in torch 2.4.
    match = _re.match(r"(\d+)\.(\d+)", _torch.__version__)
    if match is None or (int(match[1]), int(match[2])) < (2, 4):
        raise ImportError(f"transformer_engine.pytorch needs torch >= 2.4, found {_torch.__version__}")


_check_torch_version()

from . import attention, kernels, ops
from .attention import (
    DotProductAttention,
    InferenceParams,
    MultiheadAttention,
    RotaryPositionEmbedding,
)
from .device import (
    get_cudnn_version,
    get_device_compute_capability,
    is_bf16_available,
    is_fp8_available,
    is_fp8_block_scaling_available,
    is_mxfp8_available,
    is_nvfp4_available,
)
from .distributed import CudaRNGStatesTracker, checkpoint
from .graph import make_graphed_callables
from .module import Fp8Padding, Fp8Unpadding, GroupedLinear, LayerNorm, LayerNormLinear, LayerNormMLP, Linear, RMSNorm
from .permutation import (
    moe_permute,
    moe_permute_and_pad_with_probs,
    moe_permute_with_probs,
    moe_sort_chunks_by_index,
    moe_sort_chunks_by_index_with_probs,
    moe_unpermute,
)
from .quantization import (
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    get_default_recipe,
    quantized_model_init,
)
from .tensor import (
    Float8BlockQuantizer,
    Float8BlockwiseQTensor,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    MXFP8Quantizer,
    MXFP8Tensor,
    NVFP4Quantizer,
    NVFP4Tensor,
    QuantizedTensor,
    Quantizer,
)
from .transformer import TransformerLayer

__version__ = "2.20.0.1"

__all__ = [
    "CudaRNGStatesTracker",
    "DType",
    "DotProductAttention",
    "FP8GlobalStateManager",
    "InferenceParams",
    "Float8BlockQuantizer",
    "Float8BlockwiseQTensor",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "LayerNorm",
    "Fp8Padding",
    "Fp8Unpadding",
    "GroupedLinear",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "MXFP8Quantizer",
    "MultiheadAttention",
    "MXFP8Tensor",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "QuantizedTensor",
    "Quantizer",
    "QuantizerRole",
    "RMSNorm",
    "RotaryPositionEmbedding",
    "TransformerLayer",
    "attention",
    "autocast",
    "checkpoint",
    "fp8_autocast",
    "fp8_model_init",
    "get_default_recipe",
    "get_cudnn_version",
    "get_device_compute_capability",
    "is_bf16_available",
    "is_fp8_available",
    "is_fp8_block_scaling_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "kernels",
    "moe_permute",
    "moe_permute_and_pad_with_probs",
    "moe_permute_with_probs",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "moe_unpermute",
    "make_graphed_callables",
    "ops",
    "quantized_model_init",
]
