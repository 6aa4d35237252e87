"""transformer_engine.jax: Transformer Engine for JAX.

    import transformer_engine.jax as te_jax
    from transformer_engine.jax import flax as te_flax

Today: `cpp_extensions`, te-core's per-tensor FP8 kernels and GEMM as JAX
functions (XLA FFI custom calls with CPU and CUDA handlers; jit and vmap
work); `quantize`, the per-tensor FP8 quantizers and quantizer sets; and
`dense.dense`, the functional FP8 dense layer with a custom VJP. The other
functional ops (layernorm_dense, ...), autocast, MeshResource and the Flax
modules come in later work; they are absent, not stubbed. Recipes are shared with PyTorch:
transformer_engine.common.recipe.
"""

import importlib as _importlib

import jax as _jax  # noqa: F401 - fail here, clearly, when JAX is missing
import transformer_engine.core  # noqa: F401 - loads the native core once, up front

__version__ = "0.1.0"

__all__ = ["cpp_extensions", "dense", "flax", "quantize"]


def __getattr__(name):
    # te_jax.flax without importing flax for users who never touch it, and
    # cpp_extensions (which registers the FFI targets), dense and quantize on
    # first use: importing transformer_engine.jax stays cheap.
    if name in __all__:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
