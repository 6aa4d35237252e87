"""transformer_engine.common: the framework-agnostic Python part of Transformer
Engine (recipes and formats). Pure Python; it loads no native library, so
``from transformer_engine.common import recipe`` works without a GPU and
without importing any framework. The native core is transformer_engine.core.
"""

from . import recipe

__all__ = ["recipe"]
