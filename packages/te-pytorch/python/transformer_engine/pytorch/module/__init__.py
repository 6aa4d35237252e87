"""TE modules: Linear, LayerNorm, RMSNorm."""

from .base import TransformerEngineBaseModule
from .linear import Linear
from .normalization import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "Linear", "RMSNorm", "TransformerEngineBaseModule"]
