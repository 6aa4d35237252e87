"""transformer_engine.jax.flax: Flax linen modules of Transformer Engine.

    from transformer_engine.jax import flax as te_flax

DenseGeneral, LayerNorm, LayerNormDenseGeneral and LayerNormMLP (module.py);
DotProductAttention, MultiHeadAttention, TransformerLayer, ... come in later work.
"""

try:
    import flax as _flax  # noqa: F401
except ImportError as error:  # pragma: no cover - flax is a dependency of te-jax
    raise ImportError("transformer_engine.jax.flax needs flax: pip install 'flax>=0.7.1'") from error

from .module import DenseGeneral, LayerNorm, LayerNormDenseGeneral, LayerNormMLP, TransformerEngineBase

__all__ = ["DenseGeneral", "LayerNorm", "LayerNormDenseGeneral", "LayerNormMLP", "TransformerEngineBase"]
