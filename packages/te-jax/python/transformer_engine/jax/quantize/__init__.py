"""transformer_engine.jax.quantize: quantizers and quantizer sets.

    from transformer_engine.jax.quantize import QuantizerFactory
    qs = QuantizerFactory.create_set(recipe.DelayedScaling(amax_history_len=16))
    y = te_jax.dense.dense(x, kernel, quantizer_set=qs)

Quantizers are immutable pytrees; delayed-scaling state (scale, amax_history)
is in their leaves and comes out of a training step as the gradient of the
quantizer set (see transformer_engine.jax.dense). autocast (helper.py) sets
the recipe that the Flax modules build their quantizer sets from.
"""

from .helper import (
    NVTE_FP8_COLLECTION_NAME,
    autocast,
    fp8_autocast,
    get_fp8_recipe,
    is_fp8_enabled,
    update_collections,
)
from .quantizer import (
    BlockScaledTensor,
    CurrentScaleQuantizer,
    DelayedScaleQuantizer,
    Float8BlockQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
    ScaledTensor,
)
from .quantizer_set import QuantizerFactory, QuantizerSet, noop_quantizer_set
from .scaling_modes import ScalingMode

__all__ = [
    "NVTE_FP8_COLLECTION_NAME",
    "BlockScaledTensor",
    "CurrentScaleQuantizer",
    "DelayedScaleQuantizer",
    "Float8BlockQuantizer",
    "MXFP8Quantizer",
    "NVFP4Quantizer",
    "Quantizer",
    "QuantizerFactory",
    "QuantizerSet",
    "ScaledTensor",
    "ScalingMode",
    "autocast",
    "fp8_autocast",
    "get_fp8_recipe",
    "is_fp8_enabled",
    "noop_quantizer_set",
    "update_collections",
]
