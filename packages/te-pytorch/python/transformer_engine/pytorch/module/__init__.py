"""TE modules: Linear, LayerNormLinear, LayerNormMLP, LayerNorm, RMSNorm, GroupedLinear, Fp8Padding, Fp8Unpadding."""

from .base import TransformerEngineBaseModule
from .fp8_padding import Fp8Padding, Fp8Unpadding
from .grouped_linear import GroupedLinear
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .normalization import LayerNorm, RMSNorm

__all__ = [
    "Fp8Padding",
    "Fp8Unpadding",
    "GroupedLinear",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "RMSNorm",
    "TransformerEngineBaseModule",
]
