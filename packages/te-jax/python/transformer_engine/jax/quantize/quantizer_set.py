"""QuantizerSet (the quantizers of one dense layer) and QuantizerFactory (sets from recipes)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from transformer_engine.common import recipe as recipe_lib

from .quantizer import (
    CurrentScaleQuantizer,
    DelayedScaleQuantizer,
    Float8BlockQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
    rng_state_from_key,
)
from .scaling_modes import ScalingMode


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizerSet:
    """The quantizers of one GEMM layer: x (input, forward), kernel (weight,
    forward) and dgrad (the output gradient, backward). All three None: no
    quantization (noop_quantizer_set).

    A pytree: delayed-scaling state is in its leaves. Give each dense call its
    own set (the updated state of a set comes back as its gradient, and JAX
    would add the "gradients" of a set used twice)."""

    x: Quantizer | None = None
    kernel: Quantizer | None = None
    dgrad: Quantizer | None = None

    @property
    def is_noop(self) -> bool:
        return self.x is None and self.kernel is None and self.dgrad is None

    @property
    def scaling_mode(self) -> ScalingMode:
        return ScalingMode.NO_SCALING if self.is_noop else self.x.scaling_mode


jax.tree_util.register_dataclass(QuantizerSet)

noop_quantizer_set = QuantizerSet()

_E4M3 = jnp.dtype(jnp.float8_e4m3fn)  # forward tensors, and every tensor under Format.E4M3
_E5M2 = jnp.dtype(jnp.float8_e5m2)  # backward tensors under Format.HYBRID


def _backward_dtype(fp8_format) -> jnp.dtype:
    return _E5M2 if fp8_format is recipe_lib.Format.HYBRID else _E4M3


class QuantizerFactory:
    """Builds quantizers and quantizer sets."""

    @staticmethod
    def create(scaling_mode: ScalingMode, q_dtype=jnp.float8_e4m3fn, **kwargs) -> Quantizer | None:
        """One quantizer of `scaling_mode` (None for NO_SCALING); kwargs are the
        quantizer's other fields (margin, amax_history, power_2_scale, ...)."""
        if scaling_mode is ScalingMode.NO_SCALING:
            return None
        if scaling_mode is ScalingMode.DELAYED_TENSOR_SCALING:
            return DelayedScaleQuantizer(q_dtype=jnp.dtype(q_dtype), **kwargs)
        if scaling_mode is ScalingMode.CURRENT_TENSOR_SCALING:
            return CurrentScaleQuantizer(q_dtype=jnp.dtype(q_dtype), **kwargs)
        if scaling_mode is ScalingMode.MXFP8_1D_SCALING:
            return MXFP8Quantizer(q_dtype=jnp.dtype(q_dtype), **kwargs)
        if scaling_mode is ScalingMode.FP8_BLOCK_SCALING:
            return Float8BlockQuantizer(q_dtype=jnp.dtype(q_dtype), **kwargs)
        if scaling_mode in (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING):
            kwargs.setdefault("block_2d", scaling_mode is ScalingMode.NVFP4_2D_SCALING)
            return NVFP4Quantizer(**kwargs)
        raise ValueError(f"argument 'scaling_mode' must be a ScalingMode, got {scaling_mode!r}")

    @staticmethod
    def create_set(recipe=None, rng_key=None) -> QuantizerSet:
        """The quantizer set of one layer for `recipe`: None gives noop_quantizer_set
        (autocast's recipe is not consulted here: the Flax modules read it).

        DelayedScaling: x and kernel E4M3, dgrad E5M2 under Format.HYBRID (E4M3
        under Format.E4M3); scale 1 and a zero history of amax_history_len; margin
        and amax_compute_algo ("max" or "most_recent") from the recipe.
        reduce_amax is not read: over a mesh every amax is max-reduced (docs/te_jax.md).
        Float8CurrentScaling: the same formats; power_2_scale and amax_epsilon
        from fp8_quant_fwd_inp / fwd_weight / bwd_grad.
        MXFP8BlockScaling: MXFP8 quantizers, E4M3 (dgrad E5M2 under Format.HYBRID);
        the kernel's with 32x32 blocks when enable_2d_quantization.
        Float8BlockScaling: FP8-block quantizers (``x_block_scaling_dim``,
        ``w_block_scaling_dim``, ``grad_block_scaling_dim`` 1 or 2; power_2_scale and
        amax_epsilon from the three QParams).
        NVFP4BlockScaling: NVFP4 quantizers from fp4_quant_fwd_inp / fwd_weight /
        bwd_grad (random_hadamard_transform, fp4_2d_quantization, stochastic_rounding
        drawing from keys split off PRNGKey(0); create_set(recipe, rng_key) takes another).
        """
        if recipe is None:
            return noop_quantizer_set
        check_recipe_supported(recipe, "QuantizerFactory.create_set")
        if recipe.mxfp8():
            return _mxfp8_set(recipe)
        if recipe.float8_block_scaling():
            return _fp8_block_set(recipe)
        if recipe.nvfp4():
            return _nvfp4_set(recipe, rng_key)
        return _delayed_set(recipe) if recipe.delayed() else _current_set(recipe)


def check_recipe_supported(recipe, caller: str) -> None:
    """Raises unless te-jax can run `recipe`: TypeError for a non-recipe,
    NotImplementedError naming what is missing (`caller` starts the message)."""
    if not isinstance(recipe, recipe_lib.Recipe):
        raise TypeError(
            f"argument 'recipe' must be None or a transformer_engine.common.recipe recipe, got {type(recipe).__name__}"
        )
    if recipe.delayed():
        if callable(recipe.amax_compute_algo) or recipe.scaling_factor_compute_algo is not None:
            raise NotImplementedError(
                "DelayedScaling in te-jax: amax_compute_algo must be 'max' or 'most_recent' and "
                "scaling_factor_compute_algo None (callables are not supported)"
            )
    elif recipe.nvfp4():
        _check_nvfp4(recipe)
    elif recipe.float8_current_scaling() or recipe.mxfp8() or recipe.float8_block_scaling():
        if recipe.backward_override is not None:
            raise NotImplementedError(
                f"{type(recipe).__name__} in te-jax: backward_override must be None, got {recipe.backward_override!r}"
            )
    else:
        raise NotImplementedError(
            f"{caller}: {type(recipe).__name__} is not supported by te-jax yet (supported: DelayedScaling, "
            "Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling; custom recipes "
            "are not yet available in te-jax)"
        )


def _delayed_set(recipe) -> QuantizerSet:
    def make(q_dtype):
        return DelayedScaleQuantizer(
            scale=jnp.ones((1,), jnp.float32),
            amax_history=jnp.zeros((recipe.amax_history_len,), jnp.float32),
            q_dtype=q_dtype,
            margin=float(recipe.margin),
            amax_compute_algo=recipe.amax_compute_algo,
        )

    return QuantizerSet(make(_E4M3), make(_E4M3), make(_backward_dtype(recipe.fp8_format)))


def _current_set(recipe) -> QuantizerSet:
    def make(q_dtype, qparams):
        return CurrentScaleQuantizer(
            q_dtype=q_dtype, power_2_scale=qparams.power_2_scale, amax_epsilon=float(qparams.amax_epsilon)
        )

    return QuantizerSet(
        make(_E4M3, recipe.fp8_quant_fwd_inp),
        make(_E4M3, recipe.fp8_quant_fwd_weight),
        make(_backward_dtype(recipe.fp8_format), recipe.fp8_quant_bwd_grad),
    )


def _mxfp8_set(recipe) -> QuantizerSet:
    two_d = bool(getattr(recipe, "enable_2d_quantization", False))
    return QuantizerSet(
        MXFP8Quantizer(q_dtype=_E4M3),
        MXFP8Quantizer(q_dtype=_E4M3, use_2d_blocks=two_d),
        MXFP8Quantizer(q_dtype=_backward_dtype(recipe.fp8_format)),
    )


def _fp8_block_set(recipe) -> QuantizerSet:
    def make(q_dtype, dim, qparams):
        return Float8BlockQuantizer(
            q_dtype=q_dtype,
            block_2d=dim == 2,
            power_2_scale=qparams.power_2_scale,
            amax_epsilon=float(qparams.amax_epsilon),
        )

    return QuantizerSet(
        make(_E4M3, recipe.x_block_scaling_dim, recipe.fp8_quant_fwd_inp),
        make(_E4M3, recipe.w_block_scaling_dim, recipe.fp8_quant_fwd_weight),
        make(_backward_dtype(recipe.fp8_format), recipe.grad_block_scaling_dim, recipe.fp8_quant_bwd_grad),
    )


def _check_nvfp4(recipe) -> None:
    name = "NVFP4BlockScaling in te-jax"
    if recipe.backward_override is not None:
        raise NotImplementedError(f"{name}: backward_override must be None, got {recipe.backward_override!r}")
    if recipe.row_scaled_activation or recipe.nvfp4_4over6 != "none":
        raise NotImplementedError(f"{name}: row_scaled_activation and nvfp4_4over6 are not yet supported")
    inp, weight, grad = recipe.fp4_quant_fwd_inp, recipe.fp4_quant_fwd_weight, recipe.fp4_quant_bwd_grad
    # The RHT must sit on both operands of the GEMM it transforms ((X H)^T (H^T dY) = X^T dY): the
    # wgrad operands (x's and dY's columnwise copies); the weight's copies feed fprop and dgrad.
    if weight.random_hadamard_transform or inp.random_hadamard_transform != grad.random_hadamard_transform:
        raise NotImplementedError(
            f"{name}: the random Hadamard transform must be on both wgrad operands (fp4_quant_fwd_inp and "
            "fp4_quant_bwd_grad) or neither, and not on the weight"
        )


def _nvfp4_set(recipe, rng_key=None) -> QuantizerSet:
    def make(qparams, key=None):
        return NVFP4Quantizer(
            rng_state=rng_state_from_key(key) if qparams.stochastic_rounding else None,
            block_2d=bool(qparams.fp4_2d_quantization),
            stochastic_rounding=bool(qparams.stochastic_rounding),
            random_hadamard=bool(qparams.random_hadamard_transform),
        )

    keys = jax.random.split(jax.random.PRNGKey(0) if rng_key is None else rng_key, 3)
    return QuantizerSet(
        make(recipe.fp4_quant_fwd_inp, keys[0]),
        make(recipe.fp4_quant_fwd_weight, keys[1]),
        make(recipe.fp4_quant_bwd_grad, keys[2]),
    )
