"""Per-module recipe state: the recipe -> quantizer factory.

A module that runs under FP8 asks RecipeState.create(recipe, mode, n) for the
state of its n forward (or backward) tensors and builds its quantizers from
it. Forward slots per GEMM g are 3g + {0: input, 1: weight, 2: output};
backward slots 2g + {0: grad_output, 1: grad_input} (the reference's layout,
which fp8_meta and checkpoints expose).

- DelayedScaling: `scale` FP32 [n] (init 1) and `amax_history` FP32 [L, n]
  (init 0). Quantizer i scales with scale[i] and max-accumulates its amax into
  amax_history[0][i] (the staging row); the update after the step rolls the
  history and recomputes the scales (quantization.py, §3.3 of the reference).
- Float8CurrentScaling: stateless; each tensor is scaled by its own amax.
- MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling: stateless block
  quantizers (BlockScalingRecipeState) configured from the recipe's fields
  (§3.2, §3.5-3.7 of the reference).
- CustomRecipe, and the options listed in _unsupported_options: not
  implemented yet in te-pytorch; create() says so instead of faking them.
"""

from __future__ import annotations

import torch

from transformer_engine.common.recipe import Format, Recipe
from transformer_engine.core import DType

from .kernels._common import FLOAT32, desc
from .tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)

_COMING = {
    "custom": ("CustomRecipe", "the custom quantizer factory"),
}
_BLOCK_KINDS = ("mxfp8", "block", "nvfp4")


def _unsupported_options(recipe) -> list[str]:
    """Recipe settings the block recipes of te-pytorch cannot honour yet."""
    found = []
    if getattr(recipe, "backward_override", None) is not None:
        found.append(f"backward_override={recipe.backward_override!r}")
    if recipe._kind == "nvfp4":
        if recipe.row_scaled_activation:
            found.append("row_scaled_activation=True")
        for name in ("nvfp4_4over6",):
            if getattr(recipe, name) != "none":
                found.append(f"{name}={getattr(recipe, name)!r}")
    return found


def check_recipe_support(recipe) -> None:
    """Raises for a recipe te-pytorch cannot run (yet); a clear message each time."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a transformer_engine.common.recipe.Recipe, got {type(recipe).__name__}")
    if recipe._kind in _COMING:
        name, quantizer = _COMING[recipe._kind]
        raise NotImplementedError(
            f"{name} is not supported by transformer_engine.pytorch yet: its quantizer "
            f"({quantizer}) is coming in a later release. Use recipe.DelayedScaling() or "
            "recipe.Float8CurrentScaling() meanwhile."
        )
    if recipe._kind in _BLOCK_KINDS:
        found = _unsupported_options(recipe)
        if found:
            raise NotImplementedError(
                f"{type(recipe).__name__}: {', '.join(found)} is not yet supported by "
                "transformer_engine.pytorch; leave these options at their defaults"
            )


def fp8_dtype_for(recipe, forward: bool) -> DType:
    """E4M3 for forward tensors; E5M2 for backward ones under Format.HYBRID."""
    if not forward and recipe.fp8_format is Format.HYBRID:
        return DType.kFloat8E5M2
    return DType.kFloat8E4M3


class RecipeState:
    """The quantization state of one module for one direction."""

    recipe: Recipe
    mode: str  # "forward" or "backward"

    @staticmethod
    def create(recipe, *, mode: str, num_quantizers: int, device) -> RecipeState:
        check_recipe_support(recipe)
        if recipe.delayed():
            return DelayedScalingRecipeState(recipe, mode, num_quantizers, device)
        if recipe._kind in _BLOCK_KINDS:
            return BlockScalingRecipeState(recipe, mode, num_quantizers, device)
        return Float8CurrentScalingRecipeState(recipe, mode, num_quantizers, device)

    def make_quantizers(self) -> list:
        raise NotImplementedError


class DelayedScalingRecipeState(RecipeState):
    """scale [n] and amax_history [L, n] of a module's forward or backward tensors."""

    def __init__(self, recipe, mode: str, num_quantizers: int, device) -> None:
        self.recipe = recipe
        self.mode = mode
        self.dtype = fp8_dtype_for(recipe, mode == "forward")
        self.scale = torch.ones(num_quantizers, dtype=torch.float32, device=device)
        self.amax_history = torch.zeros(recipe.amax_history_len, num_quantizers, dtype=torch.float32, device=device)
        self._descs = None

    @property
    def device(self) -> torch.device:
        return self.scale.device

    def update_descs(self) -> tuple:
        """te-core descriptors of (amax_history, scale) for the fused update,
        cached while the state holds the same tensors (they are updated in place)."""
        descs = self._descs
        if descs is None or descs[2] is not self.amax_history or descs[3] is not self.scale:
            history, scale = self.amax_history, self.scale
            descs = self._descs = (desc(history, FLOAT32), desc(scale, FLOAT32), history, scale)
        return descs

    def make_quantizers(self) -> list:
        staging = self.amax_history[0]
        return [
            Float8Quantizer(self.scale[i : i + 1], staging[i : i + 1], self.dtype) for i in range(self.scale.numel())
        ]

    def adopt(self, old: DelayedScalingRecipeState) -> None:
        """Keeps the scales and the newest amaxes of a state built for an
        earlier recipe (history length or other parameters changed)."""
        self.scale.copy_(old.scale.to(self.device))
        keep = min(old.amax_history.shape[0], self.amax_history.shape[0]) - 1
        if keep > 0:
            self.amax_history[-keep:] = old.amax_history[-keep:].to(self.device)


class Float8CurrentScalingRecipeState(RecipeState):
    """Current scaling keeps no state: just the quantizer settings of the recipe."""

    def __init__(self, recipe, mode: str, num_quantizers: int, device) -> None:
        self.recipe = recipe
        self.mode = mode
        self.dtype = fp8_dtype_for(recipe, mode == "forward")
        self.num_quantizers = num_quantizers
        self.device = device

    def make_quantizers(self) -> list:
        recipe = self.recipe
        quantizers = []
        for i in range(self.num_quantizers):
            if self.mode == "forward":
                qparams = recipe.fp8_quant_fwd_weight if i % 3 == 1 else recipe.fp8_quant_fwd_inp
            else:
                qparams = recipe.fp8_quant_bwd_grad
            quantizers.append(
                Float8CurrentScalingQuantizer(
                    self.dtype, self.device, force_pow_2_scales=qparams.power_2_scale, amax_epsilon=qparams.amax_epsilon
                )
            )
        return quantizers


class BlockScalingRecipeState(RecipeState):
    """MXFP8 / FP8 block / NVFP4: stateless; one quantizer per slot, set by its role.

    Roles: forward slot 3g+0 input, 3g+1 weight, 3g+2 output (as the input);
    backward 2g+0 grad_output, 2g+1 grad_input (as the gradient).
    """

    def __init__(self, recipe, mode: str, num_quantizers: int, device) -> None:
        self.recipe = recipe
        self.mode = mode
        self.dtype = fp8_dtype_for(recipe, mode == "forward")
        self.num_quantizers = num_quantizers
        self.device = device

    def _role(self, i: int) -> str:
        if self.mode == "forward":
            return "weight" if i % 3 == 1 else "input"
        return "grad"

    def make_quantizers(self) -> list:
        return [self._quantizer(self._role(i)) for i in range(self.num_quantizers)]

    def _quantizer(self, role: str):
        r = self.recipe
        if r._kind == "mxfp8":
            return MXFP8Quantizer(self.dtype, with_2d_quantization=role == "weight" and r.enable_2d_quantization)
        if r._kind == "block":
            dim = {"input": r.x_block_scaling_dim, "weight": r.w_block_scaling_dim, "grad": r.grad_block_scaling_dim}
            qparams = {"input": r.fp8_quant_fwd_inp, "weight": r.fp8_quant_fwd_weight, "grad": r.fp8_quant_bwd_grad}
            return Float8BlockQuantizer(
                self.dtype,
                rowwise=True,
                columnwise=True,
                amax_epsilon=qparams[role].amax_epsilon,
                force_pow_2_scales=qparams[role].power_2_scale,
                block_scaling_dim=dim[role],
            )
        qparams = {"input": r.fp4_quant_fwd_inp, "weight": r.fp4_quant_fwd_weight, "grad": r.fp4_quant_bwd_grad}[role]
        rht = qparams.random_hadamard_transform
        return NVFP4Quantizer(
            with_rht=rht,
            with_post_rht_amax=rht,
            with_2d_quantization=qparams.fp4_2d_quantization,
            stochastic_rounding=qparams.stochastic_rounding,
        )


def mm_split_accumulator(recipe) -> tuple[bool, bool, bool]:
    """use_split_accumulator of the fprop, dgrad and wgrad GEMMs.

    Recipes with fp8_gemm_* fields give them; DelayedScaling has none and the
    reference modules then use fprop=False (fast accumulation), dgrad=wgrad=True.
    """
    if hasattr(recipe, "fp8_gemm_fprop"):
        return (
            recipe.fp8_gemm_fprop.use_split_accumulator,
            recipe.fp8_gemm_dgrad.use_split_accumulator,
            recipe.fp8_gemm_wgrad.use_split_accumulator,
        )
    return (False, True, True)
