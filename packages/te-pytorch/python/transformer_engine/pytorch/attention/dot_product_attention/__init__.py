"""te.DotProductAttention and its backends."""

from .dot_product_attention import DotProductAttention

__all__ = ["DotProductAttention"]
