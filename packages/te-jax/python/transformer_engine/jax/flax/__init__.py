"""transformer_engine.jax.flax: Flax linen modules of Transformer Engine.

    from transformer_engine.jax import flax as te_flax

DenseGeneral, LayerNorm, LayerNormDenseGeneral and LayerNormMLP (module.py);
DotProductAttention and RelativePositionBiases (attention.py), MultiHeadAttention
(multi_head_attention.py), TransformerLayer and TransformerLayerType (transformer.py);
extend_logical_axis_rules (te's logical axes added to flax's rules; ..sharding).
"""

try:
    import flax as _flax  # noqa: F401
except ImportError as error:  # pragma: no cover - flax is a dependency of te-jax
    raise ImportError("transformer_engine.jax.flax needs flax: pip install 'flax>=0.7.1'") from error

from ..sharding import extend_logical_axis_rules
from .attention import DotProductAttention, RelativePositionBiases
from .module import DenseGeneral, LayerNorm, LayerNormDenseGeneral, LayerNormMLP, TransformerEngineBase
from .multi_head_attention import MultiHeadAttention
from .transformer import TransformerLayer, TransformerLayerType

__all__ = [
    "DenseGeneral",
    "DotProductAttention",
    "LayerNorm",
    "LayerNormDenseGeneral",
    "LayerNormMLP",
    "MultiHeadAttention",
    "RelativePositionBiases",
    "TransformerEngineBase",
    "TransformerLayer",
    "TransformerLayerType",
    "extend_logical_axis_rules",
]
