"""Flax linen modules over te-jax's functional ops: DenseGeneral, LayerNorm,
LayerNormDenseGeneral and LayerNormMLP.

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

import jax
import jax.numpy as jnp

from ..activation import activation, canonicalize_activation_type
from ..dense import dense
from ..layernorm import canonicalize_norm_type, layernorm
from ..layernorm_dense import layernorm_dense
from ..layernorm_mlp import layernorm_mlp
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
        if template.scaling_mode is ScalingMode.NVFP4_1D_SCALING and self.has_rng("sr_rng"):
            # NVFP4's stochastic rounding draws from the module's "sr_rng" stream when the
            # apply gives one (rngs={"sr_rng": key}); without it, from PRNGKey(0) each call.
            return QuantizerFactory.create_set(get_fp8_recipe(), rng_key=self.make_rng("sr_rng"))
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
    """y = x @ kernel + bias over x's last dim: ``x [..., in] -> y [..., *features]``,
    in x's type (kernel and bias are cast to it), FP8 under an enabled autocast
    (transformer_engine.jax.dense.dense; FP8 needs multiples of 16 for the rows
    of x, in and prod(features)).

    Params: ``kernel [in, *features]`` and ``bias [*features]`` (use_bias), of type `dtype`.

    features: int or tuple of ints. kernel_init: None means default_kernel_init
    (variance scaling 1.0, fan_in, truncated normal). axis: -1 only (the last
    dim of x) so far. input_axes and kernel_axes: logical sharding axes (te's
    names or flax's, mapped through flax.linen.logical_axis_rules); with a mesh in
    scope the GEMMs partition by them (docs/te_jax.md), without one they change
    nothing. bias_axes (the bias follows the kernel's out dims) and
    transpose_batch_sequence are accepted.
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
        return dense(
            inputs,
            kernel,
            bias,
            input_axes=self.input_axes or None,
            kernel_axes=self.kernel_axes or None,
            quantizer_set=self.generate_quantizer_set(),
        )

    def _check_fields(self, inputs) -> None:
        check_dense_fields(self, inputs)


def check_dense_fields(module, inputs) -> None:
    """The LoRA and axis fields of a module with a dense layer (DenseGeneral and the LayerNorm* modules)."""
    kind = type(module).__name__
    if module.enable_low_rank_adaptation:
        raise NotImplementedError(
            f"{kind}: enable_low_rank_adaptation=True is not yet available in te-jax (no LoRA kernels)"
        )
    if jnp.ndim(inputs) < 1:
        raise ValueError(f"argument 'inputs' of {kind} must have at least 1 dimension, got a scalar")
    axes = module.axis if isinstance(module.axis, Sequence) else (module.axis,)
    ndim = jnp.ndim(inputs)
    if len(axes) != 1 or not isinstance(axes[0], int) or not -ndim <= axes[0] < ndim or axes[0] % ndim != ndim - 1:
        raise ValueError(
            f"field 'axis' of {kind} must be -1 (the last dim of the inputs; contracting other or several "
            f"dims is not supported yet), got {module.axis!r} for inputs of {ndim} dims"
        )


def _features(features, kind: str = "DenseGeneral") -> tuple[int, ...]:
    """features as a tuple of positive ints, or a ValueError naming the field."""
    as_tuple = tuple(features) if isinstance(features, Sequence) else (features,)
    if not as_tuple or any(isinstance(f, bool) or not isinstance(f, numbers.Integral) or f < 1 for f in as_tuple):
        raise ValueError(
            f"field 'features' of {kind} must be a positive int or a non-empty tuple of them, got {features!r}"
        )
    return tuple(int(f) for f in as_tuple)


# ---------------------------------------------------------------------------------------------
# LayerNorm, LayerNormDenseGeneral, LayerNormMLP
#
# Parameter names are the reference's: "scale" (gamma) and "ln_bias" (beta, LayerNorm only),
# "kernel"/"bias" (LayerNormDenseGeneral), "wi_kernel" [hidden, ACT_DIM, intermediate],
# "wi_bias" [ACT_DIM, intermediate], "wo_kernel" [intermediate, hidden], "wo_bias" [hidden]
# (LayerNormMLP). Parameters are created plain (no nn.Partitioned boxes); the *_axes fields name
# logical sharding axes that the ops partition by when a mesh is in scope (docs/te_jax.md). LayerNormMLP's two
# GEMMs take the fp8_metas postfixes "_0" (FC1) and "_1" (FC2), the reference's
# generate_quantizer_set("_0") / ("_1"); the variable names themselves ({x,kernel,grad}_0_scale,
# ...) are ours: the reference docs do not name them.
# ---------------------------------------------------------------------------------------------


def _scale_init(scale_init, zero_centered_gamma: bool):
    """The reference's default gamma init: ones, or zeros with zero_centered_gamma."""
    if scale_init is not None:
        return scale_init
    return nn.initializers.zeros if zero_centered_gamma else nn.initializers.ones


def _norm_params(module, hidden: int, input_dtype, bias_init):
    """(scale, ln_bias or None) of `module`, created in module.dtype and cast to the input's type."""
    norm_type = canonicalize_norm_type(module.layernorm_type)
    init = _scale_init(module.scale_init, module.zero_centered_gamma)
    scale = module.param("scale", init, (hidden,), module.dtype).astype(input_dtype)
    if norm_type == "rmsnorm":
        return scale, None
    return scale, module.param("ln_bias", bias_init, (hidden,), module.dtype).astype(input_dtype)


class LayerNorm(nn.Module):
    """LayerNorm (layernorm_type 'layernorm', params scale and ln_bias) or RMSNorm
    ('rmsnorm', param scale) over the last dim: transformer_engine.jax.layernorm.layernorm.

    scale_init None: ones, or zeros with zero_centered_gamma (then the weight is
    1 + scale). Params are of type `dtype`, cast to the input's type; the output
    has the input's type and shape. scale_axes, bias_axes and
    transpose_batch_sequence are accepted (under a mesh the norm runs on the rows'
    shards: the batch, and the sequence on tpsp; docs/te_jax.md).
    """

    epsilon: float = 1e-6
    layernorm_type: str = "layernorm"
    zero_centered_gamma: bool = False
    scale_init: Initializer | None = None
    scale_axes: tuple[str, ...] = ("embed",)
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: tuple[str, ...] = ("embed",)
    dtype: Any = jnp.float32
    transpose_batch_sequence: bool = False

    @nn.compact
    def __call__(self, x):
        scale, ln_bias = _norm_params(self, x.shape[-1], x.dtype, self.bias_init)
        return layernorm(x, scale, ln_bias, self.layernorm_type, self.zero_centered_gamma, self.epsilon)


class LayerNormDenseGeneral(TransformerEngineBase):
    """z = norm(x) @ kernel + bias, returned as (z, ln_output): ln_output is the
    norm's output with return_layernorm_output (then the norm and the GEMM run as
    two ops, as in the reference), else None. enable_layernorm=False skips the norm
    (and its params). z is divided by depth_scaling when given.

    Params: scale, ln_bias (norm; see LayerNorm), ``kernel [in, *features]``,
    ``bias [*features]`` (use_bias). kernel_init None: default_kernel_init. FP8 under an
    enabled autocast: one quantizer set, the norm writing the FP8 input of the GEMM
    (transformer_engine.jax.layernorm_dense). axis: -1 only; LoRA: not yet.
    return_layernorm_output defaults to False as in te_reference.md (some reference
    versions default it to True).
    """

    features: int | Sequence[int]
    enable_layernorm: bool = True
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Initializer | None = None
    scale_axes: tuple[str, ...] = ("embed",)
    ln_bias_init: Initializer = nn.initializers.zeros
    ln_bias_axes: tuple[str, ...] = ("embed",)
    kernel_init: Initializer | None = None
    kernel_axes: tuple[str, ...] = ()
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: tuple[str, ...] = ()
    return_layernorm_output: bool = False
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    axis: int | Sequence[int] = -1
    dtype: Any = jnp.float32
    layernorm_input_axes: tuple[str, ...] | None = None
    dot_input_axes: tuple[str, ...] | None = None
    depth_scaling: float | None = None

    @nn.compact
    def __call__(self, inputs):
        features = _features(self.features, "LayerNormDenseGeneral")
        check_dense_fields(self, inputs)
        hidden = inputs.shape[-1]
        norm = _norm_params(self, hidden, inputs.dtype, self.ln_bias_init) if self.enable_layernorm else None
        kernel_init = default_kernel_init if self.kernel_init is None else self.kernel_init
        kernel = self.param("kernel", kernel_init, (hidden, *features), self.dtype)
        bias = self.param("bias", self.bias_init, features, self.dtype) if self.use_bias else None
        quantizer_set = self.generate_quantizer_set()
        ln_output = None
        if norm is not None and not self.return_layernorm_output:
            z = layernorm_dense(
                inputs, kernel, *norm, bias, self.layernorm_type, self.zero_centered_gamma, self.epsilon,
                layernorm_input_axes=self.layernorm_input_axes, dot_input_axes=self.dot_input_axes,
                kernel_axes=self.kernel_axes or None, quantizer_set=quantizer_set,
            )  # fmt: skip
        else:
            y = inputs if norm is None else self._norm(inputs, *norm)
            ln_output = y if self.return_layernorm_output else None
            axes = {"input_axes": self.dot_input_axes, "kernel_axes": self.kernel_axes or None}
            z = dense(y, kernel, bias, **axes, quantizer_set=quantizer_set)
        if self.depth_scaling is not None:
            z = z / jnp.asarray(self.depth_scaling, z.dtype)
        return z, ln_output

    def _norm(self, x, scale, ln_bias):
        return layernorm(x, scale, ln_bias, self.layernorm_type, self.zero_centered_gamma, self.epsilon)


class LayerNormMLP(TransformerEngineBase):
    """y = act(norm(x) @ wi_kernel + wi_bias) @ wo_kernel + wo_bias, returned as
    (y, ln_output) (ln_output as in LayerNormDenseGeneral); y has x's shape.

    Params: scale, ln_bias (norm), wi_kernel [hidden, len(activations),
    intermediate_dim] (kernel_init applied to each [hidden, intermediate_dim] slice,
    stacked on axis -2, as the reference), wo_kernel [intermediate_dim, hidden],
    wi_bias [len(activations), intermediate_dim] and wo_bias [hidden] (use_bias).
    activations: an activation_type tuple of transformer_engine.jax.activation
    (("gelu",), ("silu", "linear"), ...); activation_params: clamped_swiglu's.
    Dropout of the activation output (intermediate_dropout_rate > 0 and not
    deterministic, rng collection intermediate_dropout_rng_name, broadcast over
    intermediate_hidden_dropout_dims) runs the ops unfused (layernorm, dense,
    activation, dropout, dense); so do return_layernorm_output and
    enable_layernorm=False. Otherwise one fused op, transformer_engine.jax.
    layernorm_mlp, with FP8 GEMMs under an enabled autocast. axis: -1 only; LoRA:
    not yet. Defaults of activations ("gelu",), intermediate_dropout_rate 0.0 and
    return_layernorm_output False follow te_reference.md.
    """

    intermediate_dim: int = 2048
    enable_layernorm: bool = True
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Initializer | None = None
    scale_axes: tuple[str, ...] = ("embed",)
    ln_bias_init: Initializer = nn.initializers.zeros
    ln_bias_axes: tuple[str, ...] = ("embed",)
    kernel_init: Initializer | None = None
    kernel_axes_1: tuple[str, ...] = ("embed", "act", "mlp")
    kernel_axes_2: tuple[str, ...] = ("mlp", "embed")
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    bias_axes_1: tuple[str, ...] = ("act", "mlp")
    bias_axes_2: tuple[str, ...] = ("embed",)
    return_layernorm_output: bool = False
    activations: Sequence[str] = ("gelu",)
    activation_params: Any = None
    intermediate_dropout_rng_name: str = "dropout"
    intermediate_dropout_rate: float = 0.0
    intermediate_hidden_dropout_dims: Sequence[int] = ()
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    axis: int | Sequence[int] = -1
    dtype: Any = jnp.float32
    layernorm_input_axes: tuple[str, ...] | None = None
    dot_1_input_axes: tuple[str, ...] | None = None
    dot_2_input_axes: tuple[str, ...] | None = None
    ffn1_ckpt_name: str = "ffn1"
    ffn2_ckpt_name: str = "ffn2"

    @nn.compact
    def __call__(self, inputs, deterministic: bool = False):
        check_dense_fields(self, inputs)
        activations = canonicalize_activation_type(self.activations)
        _features(self.intermediate_dim, "LayerNormMLP (intermediate_dim)")
        hidden, act_dim = inputs.shape[-1], len(activations)
        norm = _norm_params(self, hidden, inputs.dtype, self.ln_bias_init) if self.enable_layernorm else None
        wi, wo, wi_bias, wo_bias = self._mlp_params(hidden, act_dim)
        sets = (self.generate_quantizer_set("_0"), self.generate_quantizer_set("_1"))
        dropout = self.intermediate_dropout_rate > 0 and not deterministic
        if norm is not None and not (self.return_layernorm_output or dropout):
            y = layernorm_mlp(
                inputs, *norm, [wi, wo], [wi_bias, wo_bias], self.layernorm_type, self.zero_centered_gamma,
                self.epsilon, norm_input_axes=self.layernorm_input_axes, kernel_1_axes=self.kernel_axes_1,
                kernel_2_axes=self.kernel_axes_2, activation_type=activations, quantizer_sets=sets,
                activation_params=self.activation_params,
            )  # fmt: skip
            return y, None
        ln = inputs if norm is None else layernorm(
            inputs, *norm, self.layernorm_type, self.zero_centered_gamma, self.epsilon
        )  # fmt: skip
        fc1_axes = {"input_axes": self.dot_1_input_axes, "kernel_axes": self.kernel_axes_1}
        h = dense(ln, wi, wi_bias, **fc1_axes, quantizer_set=sets[0])  # [..., ACT_DIM, intermediate]
        a = activation(h, activations, act_params=self.activation_params)
        a = nn.Dropout(
            rate=self.intermediate_dropout_rate,
            broadcast_dims=tuple(self.intermediate_hidden_dropout_dims),
            rng_collection=self.intermediate_dropout_rng_name,
        )(a, deterministic=deterministic)
        y = dense(
            a, wo, wo_bias, input_axes=self.dot_2_input_axes, kernel_axes=self.kernel_axes_2, quantizer_set=sets[1]
        )
        return y, (ln if self.return_layernorm_output else None)

    def _mlp_params(self, hidden: int, act_dim: int):
        kernel_init = default_kernel_init if self.kernel_init is None else self.kernel_init

        def wi_init(key, shape, dtype):
            # one kernel_init draw per activation slice [hidden, intermediate], stacked on axis -2
            keys = jax.random.split(key, shape[1])
            return jnp.stack([kernel_init(k, (shape[0], shape[2]), dtype) for k in keys], axis=-2)

        wi = self.param("wi_kernel", wi_init, (hidden, act_dim, self.intermediate_dim), self.dtype)
        wo = self.param("wo_kernel", kernel_init, (self.intermediate_dim, hidden), self.dtype)
        if not self.use_bias:
            return wi, wo, None, None
        wi_bias = self.param("wi_bias", self.bias_init, (act_dim, self.intermediate_dim), self.dtype)
        wo_bias = self.param("wo_bias", self.bias_init, (hidden,), self.dtype)
        return wi, wo, wi_bias, wo_bias
