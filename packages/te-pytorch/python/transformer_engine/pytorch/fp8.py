"""transformer_engine.pytorch.fp8: the reference's deprecated module, kept for
code written against TE < 2.9 (Accelerate imports check_mxfp8_support from
here). Everything lives in transformer_engine.pytorch (quantization) now;
importing this module warns once.

    check_fp8_support()                  (bool, reason)  = te.is_fp8_available(return_reason=True)
    check_mxfp8_support()                (bool, reason)  = te.is_mxfp8_available(return_reason=True)
    check_fp8_block_scaling_support()    (bool, reason)
    check_nvfp4_support()                (bool, reason)
    get_fp8_te_dtype(recipe, fprop_tensor=True)  DType.kFloat8E4M3 or kFloat8E5M2
    get_fp4_te_dtype(recipe)             DType.kFloat4E2M1
    get_fp8_max(recipe, fprop_tensor=True)       448.0 (E4M3) or 57344.0 (E5M2)
    get_default_fp8_recipe()             = te.get_default_recipe()
    FP8GlobalStateManager, fp8_autocast, fp8_model_init, autocast, quantized_model_init
"""

from __future__ import annotations

import warnings

from transformer_engine.core import DType

from ._model_init import fp8_model_init, quantized_model_init
from .device import (
    _fp8_block_scaling_support,
    _fp8_support,
    _mxfp8_support,
    _nvfp4_support,
)
from .quantization import FP8GlobalStateManager, autocast, fp8_autocast, get_default_recipe
from .recipe_state import fp8_dtype_for

warnings.warn(
    "transformer_engine.pytorch.fp8 is deprecated: import from transformer_engine.pytorch "
    "(te.is_fp8_available, te.autocast, te.quantized_model_init, te.FP8GlobalStateManager)",
    DeprecationWarning,
    stacklevel=2,
)


def check_fp8_support() -> tuple[bool, str]:
    """(available, reason) of per-tensor FP8 on the current device (te.is_fp8_available)."""
    return _fp8_support()


def check_mxfp8_support() -> tuple[bool, str]:
    """(available, reason) of MXFP8 on the current device (te.is_mxfp8_available)."""
    return _mxfp8_support()


def check_fp8_block_scaling_support() -> tuple[bool, str]:
    """(available, reason) of FP8 block scaling on the current device."""
    return _fp8_block_scaling_support()


def check_nvfp4_support() -> tuple[bool, str]:
    """(available, reason) of NVFP4 on the current device."""
    return _nvfp4_support()


def get_fp8_te_dtype(fp8_recipe, fprop_tensor: bool = True) -> DType:
    """E4M3, or E5M2 for backward tensors under Format.HYBRID."""
    return fp8_dtype_for(fp8_recipe, fprop_tensor)


def get_fp4_te_dtype(fp4_recipe) -> DType:
    """The FP4 element type (E2M1) of an NVFP4 recipe."""
    if not fp4_recipe.nvfp4():
        raise ValueError(f"get_fp4_te_dtype needs an NVFP4BlockScaling recipe, got {type(fp4_recipe).__name__}")
    return DType.kFloat4E2M1


def get_fp8_max(fp8_recipe, fprop_tensor: bool = True) -> float:
    """The largest finite value of the recipe's FP8 type for this tensor."""
    limits = fp8_recipe.fp8_format.value
    return float(limits.max_fwd if fprop_tensor else limits.max_bwd)


def get_default_fp8_recipe():
    """The recipe autocast uses when given none (te.get_default_recipe)."""
    return get_default_recipe()


__all__ = [
    "FP8GlobalStateManager",
    "autocast",
    "check_fp8_block_scaling_support",
    "check_fp8_support",
    "check_mxfp8_support",
    "check_nvfp4_support",
    "fp8_autocast",
    "fp8_model_init",
    "get_default_fp8_recipe",
    "get_fp4_te_dtype",
    "get_fp8_max",
    "get_fp8_te_dtype",
    "quantized_model_init",
]
