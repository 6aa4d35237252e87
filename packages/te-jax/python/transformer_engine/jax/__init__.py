"""transformer_engine.jax: Transformer Engine for JAX.

    import transformer_engine.jax as te_jax
    from transformer_engine.jax import flax as te_flax

The package skeleton: version and layout. The functional ops, autocast,
MeshResource and the XLA FFI targets come in later work; they are absent,
not stubbed. Recipes are shared with PyTorch: transformer_engine.common.recipe.
"""

import importlib as _importlib

import jax as _jax  # noqa: F401 - fail here, clearly, when JAX is missing
import transformer_engine.core  # noqa: F401 - loads the native core once, up front

__version__ = "0.1.0"

__all__ = ["flax"]


def __getattr__(name):
    # te_jax.flax without importing flax for users who never touch it.
    if name == "flax":
        return _importlib.import_module(".flax", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
