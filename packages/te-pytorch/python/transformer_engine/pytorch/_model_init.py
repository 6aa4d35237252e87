"""quantized_model_init: modules whose weights exist only in a quantized format.

    with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
        layer = te.Linear(1024, 1024)
    # layer.weight is a torch.nn.Parameter that is a Float8Tensor: no
    # high-precision copy exists. Forward uses its bytes as the GEMM operand
    # directly; an optimizer step (p.add_, p.copy_, addcdiv_, ...) computes
    #     W <- quantize(update(dequantize(W)))
    # in place (QuantizedTensor.__torch_dispatch__ requantizes in-place ops).

The weight format follows the recipe (§2.5 / §3 of the reference): Float8Tensor
(DelayedScaling, Float8CurrentScaling), MXFP8Tensor, Float8BlockwiseQTensor,
NVFP4Tensor. A module records the context at construction (attributes
primary_weights_in_fp8, preserve_high_precision_init_val), so a module
created on the meta device is quantized when reset_parameters() materializes
it later. Modules created with gradients disabled (inference) keep only the
rowwise copy of each weight.

With preserve_high_precision_init_val=True each weight also keeps its
initial high-precision value on the CPU: param.get_high_precision_init_val()
returns it and param.clear_high_precision_init_val() frees it (e.g. to seed
FP32 master weights of an optimizer, then release the memory).
"""

from __future__ import annotations

import contextlib
import types
import warnings

import torch

from transformer_engine.common.recipe import Recipe

from .recipe_state import check_recipe_support, operand_kind_of


class _ModelInitState:
    """The innermost active quantized_model_init: enabled, recipe, preserve."""

    enabled = False
    recipe = None
    preserve = False


def model_init_settings():
    """(recipe, preserve_high_precision_init_val) of the active quantized_model_init, or None."""
    s = _ModelInitState
    return (s.recipe, s.preserve) if s.enabled else None


@contextlib.contextmanager
def quantized_model_init(enabled: bool = True, recipe=None, preserve_high_precision_init_val: bool = False):
    """TE modules created inside hold their weights only in `recipe`'s quantized format.

    enabled: False makes the region a no-op (high-precision weights); nestable,
    the innermost region wins. recipe: a transformer_engine.common.recipe
    Recipe (None: get_default_recipe()). preserve_high_precision_init_val:
    keep each weight's initial value on the CPU (see the module docstring).
    """
    from .quantization import get_default_recipe  # (quantization.py re-exports this module)

    for name, value in (("enabled", enabled), ("preserve_high_precision_init_val", preserve_high_precision_init_val)):
        if not isinstance(value, bool):
            raise TypeError(f"quantized_model_init: {name} must be a bool, got {type(value).__name__}")
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(
            "quantized_model_init: recipe must be a transformer_engine.common.recipe.Recipe or None, "
            f"got {type(recipe).__name__}"
        )
    if enabled:
        recipe = get_default_recipe() if recipe is None else recipe
        check_recipe_support(recipe)
    s = _ModelInitState
    saved = (s.enabled, s.recipe, s.preserve)
    s.enabled, s.recipe, s.preserve = enabled, recipe, preserve_high_precision_init_val
    try:
        yield
    finally:
        s.enabled, s.recipe, s.preserve = saved


def fp8_model_init(enabled: bool = True, recipe=None, preserve_high_precision_init_val: bool = False):
    """Deprecated name of quantized_model_init (the reference renamed it in v2.9)."""
    warnings.warn(
        "fp8_model_init is deprecated; use te.quantized_model_init(enabled, recipe, preserve_high_precision_init_val)",
        DeprecationWarning,
        stacklevel=2,
    )
    return quantized_model_init(
        enabled=enabled, recipe=recipe, preserve_high_precision_init_val=preserve_high_precision_init_val
    )


# --------------------------------------------------------------------------- weights


def _get_high_precision_init_val(self):
    """The weight's initial high-precision value (a CPU tensor), or None once cleared."""
    return getattr(self, "_high_precision_init_val", None)


def _clear_high_precision_init_val(self) -> None:
    """Frees the CPU copy of the initial value."""
    self._high_precision_init_val = None


def quantized_parameter(
    value: torch.Tensor, quantizer, *, columnwise: bool, preserve: bool, requires_grad: bool = True
) -> torch.nn.Parameter:
    """value (high precision, freshly initialized) as a Parameter holding only its quantized form.

    columnwise: also quantize the copy the transposed GEMMs (dgrad) read;
    False for inference. The quantizer is the module's weight quantizer: it
    stays attached, so in-place updates requantize with the module's state.
    """
    value = value.detach()
    saved = (quantizer.rowwise_usage, quantizer.columnwise_usage)
    quantizer.set_usage(rowwise=True, columnwise=columnwise)
    try:
        with torch.no_grad():
            quantized = quantizer.quantize(value)
    finally:
        quantizer.set_usage(rowwise=saved[0], columnwise=saved[1])
    param = torch.nn.Parameter(quantized, requires_grad=requires_grad)
    if preserve:
        param._high_precision_init_val = value.to("cpu", copy=True)
        param.get_high_precision_init_val = types.MethodType(_get_high_precision_init_val, param)
        param.clear_high_precision_init_val = types.MethodType(_clear_high_precision_init_val, param)
    return param


def weight_format(weight) -> str | None:
    """The format key of a quantized weight ("fp8", "mxfp8", "fp8_block", "nvfp4"), None if not quantized."""
    from .tensor import Float8BlockwiseQTensor, Float8Tensor, MXFP8Tensor, NVFP4Tensor

    for cls, key in (
        (Float8Tensor, "fp8"),
        (MXFP8Tensor, "mxfp8"),
        (Float8BlockwiseQTensor, "fp8_block"),
        (NVFP4Tensor, "nvfp4"),
    ):
        if isinstance(weight, cls):
            return key
    return None


def check_weight_recipe(owner: str, name: str, weight, recipe) -> None:
    """RuntimeError when a quantized weight cannot run under `recipe` (its format differs)."""
    fmt = weight_format(weight)
    if fmt is not None and operand_kind_of(recipe) != fmt:
        raise RuntimeError(
            f"Recipe mismatch for '{name}' of {owner}: the weight was created under quantized_model_init as a "
            f"{type(weight).__name__}, which {type(recipe).__name__} cannot use. Run the module under a recipe of "
            "the weight's format, or create it under quantized_model_init with this recipe"
        )
