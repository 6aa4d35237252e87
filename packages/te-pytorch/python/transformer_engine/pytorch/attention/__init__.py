"""Attention: DotProductAttention, MultiheadAttention, InferenceParams (KV
cache) and rotary position embeddings, at the reference's module paths."""

from .dot_product_attention import DotProductAttention
from .inference import InferenceParams
from .multi_head_attention import MultiheadAttention
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = [
    "DotProductAttention",
    "InferenceParams",
    "MultiheadAttention",
    "RotaryPositionEmbedding",
    "apply_rotary_pos_emb",
]
