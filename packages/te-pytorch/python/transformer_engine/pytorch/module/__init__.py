"""TE modules: Linear, LayerNormLinear, LayerNormMLP, LayerNorm, RMSNorm."""

from .base import TransformerEngineBaseModule
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .normalization import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "LayerNormLinear", "LayerNormMLP", "Linear", "RMSNorm", "TransformerEngineBaseModule"]
