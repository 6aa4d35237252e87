"""Flax linen modules over te-jax's functional ops: DenseGeneral so far.

    with te_jax.autocast(enabled=True, recipe=recipe.DelayedScaling()):
        model = te_flax.DenseGeneral(features=1024)
        variables = model.init(rng, x)      # {"params": {kernel, bias}, "fp8_metas": {...}}

A module builds its quantizer set when it is traced, from the recipe of the
innermost enabled autocast (high precision without one). Delayed-scaling state
is a Flax variable per quantizer array in the "fp8_metas" collection:

    x_scale (1,), x_amax_history (L,)              the input's quantizer
    kernel_scale, kernel_amax_history              the weight's
    grad_scale, grad_amax_history                  the output gradient's (dgrad)

(initial scale 1, history zeros, L = the recipe's amax_history_len). These
variables are read, never written, by apply: their "gradient" is their next
value (transformer_engine.jax.dense's convention), so a training step takes
the gradient with respect to every collection but "params" and merges it back
with update_collections. Current scaling keeps no state and adds no variables.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn  # (ruff's isort files it apart: this package is named flax too)

import jax.numpy as jnp

from ..dense import dense
from ..quantize import (
    NVTE_FP8_COLLECTION_NAME,
    QuantizerFactory,
    QuantizerSet,
    ScalingMode,
    get_fp8_recipe,
)

Initializer = Callable[..., Any]


def default_kernel_init(key, shape, dtype=jnp.float32):
    """Flax's variance_scaling(1.0, "fan_in", "truncated_normal") with fan_in
    = shape[0], the input features, also when the output is several dims."""
    out_axes = tuple(range(1, len(shape)))
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=0, out_axis=out_axes)(
        key, shape, dtype
    )


class TransformerEngineBase(nn.Module):
    """Base of te-jax's Flax modules: the quantizer sets of their GEMMs."""

    def generate_quantizer_set(self, postfix: str = "") -> QuantizerSet:
        """The quantizer set of one GEMM under the active autocast recipe (the
        no-op set outside autocast). Delayed scaling: each quantizer's scale and
        amax_history come from (and, at init, are created as) variables
        "{x,kernel,grad}{postfix}_{scale,amax_history}" of the "fp8_metas" collection."""
        template = QuantizerFactory.create_set(get_fp8_recipe())
        if template.scaling_mode is not ScalingMode.DELAYED_TENSOR_SCALING:
            return template
        return QuantizerSet(
            x=self._delayed_state(f"x{postfix}", template.x),
            kernel=self._delayed_state(f"kernel{postfix}", template.kernel),
            dgrad=self._delayed_state(f"grad{postfix}", template.dgrad),
        )

    def _delayed_state(self, name: str, quantizer):
        """quantizer with its scale and amax_history taken from this module's fp8_metas variables."""
        state = {}
        for field in ("scale", "amax_history"):
            var_name = f"{name}_{field}"
            initial = getattr(quantizer, field)
            exists = self.has_variable(NVTE_FP8_COLLECTION_NAME, var_name)
            if not exists and not self.is_mutable_collection(NVTE_FP8_COLLECTION_NAME):
                raise ValueError(
                    f"{type(self).__name__} {self.name!r} has no '{NVTE_FP8_COLLECTION_NAME}' variable {var_name!r}: "
                    "the model was initialized without DelayedScaling; run model.init under the autocast "
                    "(enabled=True, recipe=DelayedScaling(...)) the model is applied with"
                )
            value = self.variable(NVTE_FP8_COLLECTION_NAME, var_name, lambda v=initial: v).value
            if tuple(value.shape) != tuple(initial.shape):
                raise ValueError(
                    f"{type(self).__name__} {self.name!r}: '{NVTE_FP8_COLLECTION_NAME}' variable {var_name!r} has "
                    f"shape {tuple(value.shape)}, the recipe needs {tuple(initial.shape)} (amax_history_len "
                    "changed since model.init?)"
                )
            state[field] = value
        return dataclasses.replace(quantizer, **state)


class DenseGeneral(TransformerEngineBase):
    """y = x @ kernel + bias over x's last dim: x [..., in] -> y [..., *features],
    in x's type (kernel and bias are cast to it), FP8 under an enabled autocast
    (transformer_engine.jax.dense.dense; FP8 needs multiples of 16 for the rows
    of x, in and prod(features)).

    Params: kernel [in, *features] and bias [*features] (use_bias), of type `dtype`.

    features: int or tuple of ints. kernel_init: None means default_kernel_init
    (variance scaling 1.0, fan_in, truncated normal). axis: -1 only (the last
    dim of x) so far. kernel_axes, bias_axes, input_axes and
    transpose_batch_sequence name logical sharding axes: accepted, and without a
    mesh (te-jax runs on one device) they change nothing, as in the reference.
    quantization_checkpoint_name (a rematerialization name for the quantized
    tensors) is accepted and unused so far. enable_low_rank_adaptation=True
    raises NotImplementedError (LoRA is not yet available in te-jax).
    """

    features: int | Sequence[int]
    kernel_init: Initializer | None = None
    kernel_axes: tuple[str, ...] = ()
    use_bias: bool = True
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: tuple[str, ...] = ()
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    axis: int | Sequence[int] = -1
    dtype: Any = jnp.float32
    input_axes: tuple[str, ...] = ()
    transpose_batch_sequence: bool = False
    quantization_checkpoint_name: str | None = None

    @nn.compact
    def __call__(self, inputs):
        features = _features(self.features)
        self._check_fields(inputs)
        kernel_init = default_kernel_init if self.kernel_init is None else self.kernel_init
        kernel = self.param("kernel", kernel_init, (inputs.shape[-1], *features), self.dtype)
        bias = self.param("bias", self.bias_init, features, self.dtype) if self.use_bias else None
        return dense(inputs, kernel, bias, quantizer_set=self.generate_quantizer_set())

    def _check_fields(self, inputs) -> None:
        if self.enable_low_rank_adaptation:
            raise NotImplementedError(
                "DenseGeneral: enable_low_rank_adaptation=True is not yet available in te-jax (no LoRA kernels)"
            )
        if jnp.ndim(inputs) < 1:
            raise ValueError("argument 'inputs' of DenseGeneral must have at least 1 dimension, got a scalar")
        axes = self.axis if isinstance(self.axis, Sequence) else (self.axis,)
        ndim = jnp.ndim(inputs)
        if len(axes) != 1 or not isinstance(axes[0], int) or axes[0] % ndim != ndim - 1 or not -ndim <= axes[0] < ndim:
            raise ValueError(
                f"field 'axis' of DenseGeneral must be -1 (the last dim of the inputs; contracting other or several "
                f"dims is not supported yet), got {self.axis!r} for inputs of {ndim} dims"
            )


def _features(features) -> tuple[int, ...]:
    """features as a tuple of positive ints, or a ValueError naming the field."""
    as_tuple = tuple(features) if isinstance(features, Sequence) else (features,)
    if not as_tuple or any(isinstance(f, bool) or not isinstance(f, numbers.Integral) or f < 1 for f in as_tuple):
        raise ValueError(
            f"field 'features' of DenseGeneral must be a positive int or a non-empty tuple of them, got {features!r}"
        )
    return tuple(int(f) for f in as_tuple)
