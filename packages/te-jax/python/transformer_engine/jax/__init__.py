"""transformer_engine.jax: Transformer Engine for JAX.

    import transformer_engine.jax as te_jax
    from transformer_engine.jax import flax as te_flax

Today: `cpp_extensions`, te-core's per-tensor FP8 kernels and GEMM as JAX
functions (XLA FFI custom calls with CPU and CUDA handlers; jit and vmap
work); `quantize`, the per-tensor FP8 quantizers and quantizer sets; the
functional ops with custom VJPs `dense.dense`, `layernorm.layernorm`,
`layernorm_dense.layernorm_dense`, `layernorm_mlp.layernorm_mlp`,
`activation.activation`, `softmax.softmax` and `attention.fused_attn`; `autocast` (the recipe of the
Flax modules), `update_collections`, `MeshResource` and `sharding` (the ops partition over
a jax.sharding.Mesh, docs/te_jax.md) and the Flax
modules `flax.DenseGeneral`, `LayerNorm`, `LayerNormDenseGeneral`, `LayerNormMLP`,
`DotProductAttention`, `MultiHeadAttention`, `RelativePositionBiases` and
`TransformerLayer`. The other functional ops (grouped_dense, ...) come in later work;
they are absent, not stubbed. Recipes are shared with PyTorch: transformer_engine.common.recipe.
"""

import importlib as _importlib

import jax as _jax  # noqa: F401 - fail here, clearly, when JAX is missing
import transformer_engine.core  # noqa: F401 - loads the native core once, up front

__version__ = "2.20.0.1"

_SUBMODULES = (
    "activation",
    "attention",
    "cpp_extensions",
    "dense",
    "flax",
    "layernorm",
    "layernorm_dense",
    "layernorm_mlp",
    "quantize",
    "sharding",
    "softmax",
)
# name -> the submodule defining it, imported on first access
_LAZY_NAMES = {
    "NVTE_FP8_COLLECTION_NAME": "quantize.helper",
    "autocast": "quantize.helper",
    "fp8_autocast": "quantize.helper",
    "update_collections": "quantize.helper",
    "MeshResource": "sharding",
}

__all__ = [*_LAZY_NAMES, *_SUBMODULES]


def __getattr__(name):
    # te_jax.flax without importing flax for users who never touch it, and
    # cpp_extensions (which registers the FFI targets), the ops and quantize on
    # first use (autocast and friends with quantize, which registers nothing):
    # importing transformer_engine.jax stays cheap.
    if name in _SUBMODULES:
        return _importlib.import_module(f".{name}", __name__)
    if name in _LAZY_NAMES:
        return getattr(_importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
