"""Quantization recipes: how tensors are cast to FP8/FP4 during training.

Framework-agnostic configuration, shared by transformer_engine.pytorch and
transformer_engine.jax. Names, fields, defaults and checks follow the reference
library's ``transformer_engine.common.recipe`` so user code needs no change:

    from transformer_engine.common import recipe
    fp8_recipe = recipe.DelayedScaling(margin=0, fp8_format=recipe.Format.HYBRID)

Recipes are frozen dataclasses (see ``Recipe``). Defaults that come from
environment variables are read when a recipe is constructed (docs/envvars.md).
A field value a recipe does not allow raises RecipeValidationError (a
ValueError and an AssertionError) naming the recipe, the field and the rule;
a value of the wrong type raises TypeError.
"""

from ._base import (
    Format,
    FormatLimits,
    MMParams,
    QParams,
    Recipe,
    RecipeValidationError,
)
from ._block import Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling
from ._custom import CustomRecipe, QuantizerRole
from ._per_tensor import DelayedScaling, Float8CurrentScaling

__all__ = [
    "CustomRecipe",
    "DelayedScaling",
    "Float8BlockScaling",
    "Float8CurrentScaling",
    "Format",
    "FormatLimits",
    "MMParams",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
    "QParams",
    "QuantizerRole",
    "Recipe",
    "RecipeValidationError",
]

# The classes live in private modules; give them their public module so that
# pickles (checkpoints) and reprs name transformer_engine.common.recipe.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
