"""Per-module recipe state: everything that differs between recipes.

A module that runs under FP8 asks RecipeState.create(recipe, mode, n) for the
state of its n forward (or backward) tensors when its recipe changes, builds
its quantizers from it, and from then on asks that object -- never the
recipe's kind -- what the recipe means for each forward (RecipeState's
docstring lists the questions). One class per recipe family, chosen once by
the table _STATE_CLASSES. Forward slots per GEMM g are 3g + {0: input,
1: weight, 2: output}; backward slots 2g + {0: grad_output, 1: grad_input}
(the reference's layout, which fp8_meta and checkpoints expose).

- DelayedScaling: `scale` FP32 [n] (init 1) and `amax_history` FP32 [L, n]
  (init 0). Quantizer i scales with scale[i] and max-accumulates its amax into
  amax_history[0][i] (the staging row); the update after the step rolls the
  history and recomputes the scales (quantization.py, §3.3 of the reference).
- Float8CurrentScaling: stateless; each tensor is scaled by its own amax.
- MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling: stateless block
  quantizers (one BlockScalingRecipeState subclass each) configured from the
  recipe's fields (§3.2, §3.5-3.7 of the reference).
- CustomRecipe, and the options each class lists in unsupported_options: not
  implemented yet in te-pytorch; create() says so instead of faking them.

The FP8 dimension rule (which GEMM shapes each format can run) is here too,
in check_fp8_dims, the only copy.
"""

from __future__ import annotations

import torch

from transformer_engine.common.recipe import Format, Recipe
from transformer_engine.core import DType

from .kernels._common import FLOAT32, compiling, desc
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
    cls = _STATE_CLASSES.get(recipe._kind)
    if cls is None:
        raise TypeError(
            f"recipe {type(recipe).__name__} is not a quantization recipe (it derives from none of "
            "DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling)"
        )
    found = cls.unsupported_options(recipe)
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


# The FP8 dimension rule, per operand kind: (tokens, in_features,
# out_features) multiples. Each quantized dim is the reduction dim K of one of
# a Linear's three GEMMs (fprop, dgrad, wgrad). Per-tensor FP8 takes the
# reference's rule (tokens and out_features by 8, in_features by 16:
# assert_dim_for_fp8_exec); te_gemm wants 16 everywhere, so kernels/gemm.py
# pads the other GEMMs internally. The block formats need whole blocks.
_DIM_RULES = {
    "fp8": ((8, 16, 8), "FP8 GEMMs need"),
    "fp8_block": ((16, 16, 16), "FP8 block-scaled GEMMs need"),
    "mxfp8": ((32, 32, 32), "MXFP8 has one scale per 32 elements along each dim, so it needs"),
    "nvfp4": ((32, 32, 32), "NVFP4 has one scale per 16 elements and its GEMMs take K in steps of 32, so it needs"),
}


def check_fp8_dims(kind: str, tokens: int, in_features: int, out_features: int, owner: str) -> None:
    """ValueError naming the dims operand kind `kind` cannot take, and how to pad them.

    The one place the rule lives: modules call it through RecipeState.check_dims."""
    (mt, mi, mo), why = _DIM_RULES[kind]
    if tokens % mt or in_features % mi or out_features % mo:
        raise ValueError(
            f"{owner} under {kind.upper()} quantization: {why} the number of tokens (the product of the "
            f"input's leading dims) divisible by {mt}, in_features by {mi} and out_features by {mo}, got "
            f"tokens={tokens}, in_features={in_features}, out_features={out_features}. Pad the sequence or "
            f"batch to a multiple of {mt} (e.g. torch.nn.functional.pad) and the feature sizes of the "
            "layer, or run this layer outside te.autocast"
        )


def _role(mode: str, i: int) -> str:
    """The tensor a slot holds: forward 3g+1 is a weight, 3g+0/3g+2 inputs; backward slots are gradients."""
    if mode == "forward":
        return "weight" if i % 3 == 1 else "input"
    return "grad"


class RecipeState:
    """The quantization state of one module for one direction, and everything
    a module needs to know about its recipe.

    A module gets one per direction from create() when its recipe changes
    (TransformerEngineBaseModule._build_fp8_state) and asks it, never the
    recipe's kind, on each forward:
      make_quantizers()     the quantizer of each slot (module docstring)
      check_dims(...)       the recipe's FP8 dimension rule (ValueError)
      split_accumulator     use_split_accumulator of the fprop/dgrad/wgrad GEMMs
      operand_kind          "fp8" (per-tensor), "fp8_block", "mxfp8" or "nvfp4"
      per_tensor            one scale per tensor: its bytes transpose exactly
                            into the columnwise copy
      delayed               scales are state, updated after the step from the
                            amax history: kernels may write FP8 with the
                            quantizer's scale, calibration records amaxes,
                            checkpoints save them, torch.compile is refused
      on_forward(manager)   per-forward bookkeeping (delayed: queue the update)
      backward_queue(...)   the update queue this module's backward must run
      adopt(old)            keep values of the state this one replaces
    """

    recipe: Recipe
    mode: str  # "forward" or "backward"
    operand_kind = "fp8"
    per_tensor = True
    delayed = False

    def __init__(self, recipe, mode: str, num_quantizers: int, device) -> None:
        self.recipe = recipe
        self.mode = mode
        self.dtype = fp8_dtype_for(recipe, mode == "forward")
        self.num_quantizers = num_quantizers
        self._device = device
        self.split_accumulator = mm_split_accumulator(recipe)
        self._dim_multiples = _DIM_RULES[self.operand_kind][0]
        # The owning module's lock (base.py sets it); a state made on its own has none.
        self.lock = None

    @property
    def device(self) -> torch.device:
        return self._device

    @staticmethod
    def create(recipe, *, mode: str, num_quantizers: int, device) -> RecipeState:
        check_recipe_support(recipe)
        return state_class(recipe)(recipe, mode, num_quantizers, device)

    @staticmethod
    def unsupported_options(recipe) -> list[str]:
        """The recipe's settings te-pytorch cannot honour yet (check_recipe_support)."""
        return []

    def make_quantizers(self) -> list:
        raise NotImplementedError

    def check_dims(self, tokens: int, in_features: int, out_features: int, owner: str) -> None:
        """ValueError when a GEMM of these dims cannot run under this recipe (check_fp8_dims)."""
        mt, mi, mo = self._dim_multiples  # (the common case, that every dim is fine, costs no call)
        if tokens % mt or in_features % mi or out_features % mo:
            check_fp8_dims(self.operand_kind, tokens, in_features, out_features, owner)

    def on_forward(self, manager) -> None:
        """Called by each forward under the recipe, after the state is in sync; stateless recipes do nothing."""

    def backward_queue(self, manager):
        """The update queue the caller's backward must run (None: nothing to update)."""
        return None

    def adopt(self, old) -> None:
        """Keeps what is worth keeping of `old`, the state this one replaces (stateless: nothing)."""


class DelayedScalingRecipeState(RecipeState):
    """scale [n] and amax_history [L, n] of a module's forward or backward tensors."""

    delayed = True

    def __init__(self, recipe, mode: str, num_quantizers: int, device) -> None:
        super().__init__(recipe, mode, num_quantizers, device)
        self.scale = torch.ones(num_quantizers, dtype=torch.float32, device=device)
        self.amax_history = torch.zeros(recipe.amax_history_len, num_quantizers, dtype=torch.float32, device=device)
        self._descs = None

    @property
    def device(self) -> torch.device:  # (the state follows its tensors)
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

    def on_forward(self, manager) -> None:
        """Refuses torch.compile; queues this (forward) state for the update at the autocast's exit."""
        if compiling():
            raise RuntimeError(
                "DelayedScaling cannot run under torch.compile: its amax history and scales are "
                "updated outside the graph after each step. Use recipe.Float8CurrentScaling() "
                "with torch.compile, or run this model eagerly"
            )
        manager.forward_queue.add(self, manager.fp8_group)

    def backward_queue(self, manager):
        """Registers this (backward) state for the update after backward; returns
        the region's queue if the caller must run it (it was the first FP8
        module of the region, so its backward runs last), else None."""
        queue = manager.backward_queue
        queue.add(self, manager.fp8_group)
        if queue.owner_taken:
            return None
        queue.owner_taken = True
        return queue

    def adopt(self, old) -> None:
        """Keeps the scales and the newest amaxes of a delayed-scaling state built
        for an earlier recipe (history length or other parameters changed)."""
        if not isinstance(old, DelayedScalingRecipeState):
            return
        self.scale.copy_(old.scale.to(self.device))
        keep = min(old.amax_history.shape[0], self.amax_history.shape[0]) - 1
        if keep > 0:
            self.amax_history[-keep:] = old.amax_history[-keep:].to(self.device)


class Float8CurrentScalingRecipeState(RecipeState):
    """Current scaling keeps no state: just the quantizer settings of the recipe."""

    def make_quantizers(self) -> list:
        r = self.recipe
        qparams = {"input": r.fp8_quant_fwd_inp, "weight": r.fp8_quant_fwd_weight, "grad": r.fp8_quant_bwd_grad}
        quantizers = []
        for i in range(self.num_quantizers):
            q = qparams[_role(self.mode, i)]
            quantizers.append(
                Float8CurrentScalingQuantizer(
                    self.dtype, self.device, force_pow_2_scales=q.power_2_scale, amax_epsilon=q.amax_epsilon
                )
            )
        return quantizers


class BlockScalingRecipeState(RecipeState):
    """MXFP8 / FP8 block / NVFP4: stateless; one quantizer per slot, set by its role.

    Roles: forward slot 3g+0 input, 3g+1 weight, 3g+2 output (as the input);
    backward 2g+0 grad_output, 2g+1 grad_input (as the gradient). Subclasses
    give _quantizer(role).
    """

    per_tensor = False

    @staticmethod
    def unsupported_options(recipe) -> list[str]:
        if getattr(recipe, "backward_override", None) is not None:
            return [f"backward_override={recipe.backward_override!r}"]
        return []

    def make_quantizers(self) -> list:
        return [self._quantizer(_role(self.mode, i)) for i in range(self.num_quantizers)]

    def _quantizer(self, role: str):
        raise NotImplementedError


class MXFP8BlockScalingRecipeState(BlockScalingRecipeState):
    operand_kind = "mxfp8"

    def _quantizer(self, role: str):
        r = self.recipe
        return MXFP8Quantizer(self.dtype, with_2d_quantization=role == "weight" and r.enable_2d_quantization)


class Float8BlockScalingRecipeState(BlockScalingRecipeState):
    operand_kind = "fp8_block"

    def _quantizer(self, role: str):
        r = self.recipe
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


class NVFP4BlockScalingRecipeState(BlockScalingRecipeState):
    operand_kind = "nvfp4"

    @staticmethod
    def unsupported_options(recipe) -> list[str]:
        found = BlockScalingRecipeState.unsupported_options(recipe)
        if recipe.row_scaled_activation:
            found.append("row_scaled_activation=True")
        if recipe.nvfp4_4over6 != "none":
            found.append(f"nvfp4_4over6={recipe.nvfp4_4over6!r}")
        return found

    def _quantizer(self, role: str):
        r = self.recipe
        qparams = {"input": r.fp4_quant_fwd_inp, "weight": r.fp4_quant_fwd_weight, "grad": r.fp4_quant_bwd_grad}[role]
        rht = qparams.random_hadamard_transform
        return NVFP4Quantizer(
            with_rht=rht,
            with_post_rht_amax=rht,
            with_2d_quantization=qparams.fp4_2d_quantization,
            stochastic_rounding=qparams.stochastic_rounding,
        )


# The one table from a recipe's kind to its state class (Recipe._kind; a
# subclass of a recipe inherits its parent's kind).
_STATE_CLASSES = {
    "delayed": DelayedScalingRecipeState,
    "current": Float8CurrentScalingRecipeState,
    "mxfp8": MXFP8BlockScalingRecipeState,
    "block": Float8BlockScalingRecipeState,
    "nvfp4": NVFP4BlockScalingRecipeState,
}


def state_class(recipe) -> type[RecipeState]:
    """The RecipeState class of a supported recipe (check_recipe_support first)."""
    return _STATE_CLASSES[recipe._kind]


def operand_kind_of(recipe) -> str | None:
    """The operand kind (the quantized tensors' format) of a recipe's tensors; None where unsupported."""
    cls = _STATE_CLASSES.get(recipe._kind)
    return None if cls is None else cls.operand_kind


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
