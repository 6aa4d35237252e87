"""activation: the MLP activations of the reference's activation_type tuples,
with a custom VJP over te-core's activation kernels (cpp_extensions.activation;
formulas there).

x has shape (..., ACT_DIM, K): ACT_DIM = len(activation_type), 1 for a plain
activation, 2 for a gated one, whose x[..., 0, :] is activated and x[..., 1, :]
linear. The output is (..., K) in x's type:

    ("gelu",)          gelu(x)                ("gelu", "linear")          gelu(a) * b      (geglu)
    ("relu",)          max(x, 0)              ("relu", "linear")          relu(a) * b      (reglu)
    ("silu",)          x sigmoid(x)           ("silu", "linear")          silu(a) * b      (swiglu)
    ("quick_gelu",)    x sigmoid(1.702 x)     ("quick_gelu", "linear")    qgelu(a) * b     (qgeglu)
    ("squared_relu",)  max(x, 0)^2            ("squared_relu", "linear")  srelu(a) * b     (sreglu)
    ("clamped_silu", "clamped_linear")        clamped_swiglu (activation_params: limit, alpha)

("sigmoid", "linear") (glu, sigmoid(a) * b) is te-core's and te-pytorch's GLU;
the reference's JAX table lacks it. A gated tuple may also be spelled with
"linear" first, as the reference's Flax LayerNormMLP accepts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

import jax

from ._partition import active_mesh
from .cpp_extensions import activation_bwd, activation_fwd

# activation_type tuple -> te-core's activation kind
ACTIVATION_KINDS = {
    ("gelu",): "gelu",
    ("gelu", "linear"): "geglu",
    ("silu",): "silu",
    ("silu", "linear"): "swiglu",
    ("relu",): "relu",
    ("relu", "linear"): "reglu",
    ("quick_gelu",): "qgelu",
    ("quick_gelu", "linear"): "qgeglu",
    ("squared_relu",): "srelu",
    ("squared_relu", "linear"): "sreglu",
    ("clamped_silu", "clamped_linear"): "clamped_swiglu",
    ("sigmoid", "linear"): "glu",
}
# clamped_swiglu's parameters and defaults (the reference's ClampedSwigluParams)
CLAMPED_SWIGLU_DEFAULTS = {"limit": 7.0, "alpha": 1.702}


def canonicalize_activation_type(activation_type) -> tuple[str, ...]:
    """The activation_type as a lower-case tuple, gated ones with "linear" second."""
    if isinstance(activation_type, str) or not isinstance(activation_type, Sequence):
        raise TypeError(
            "argument 'activation_type' must be a tuple of names such as ('gelu',) or ('silu', 'linear'), "
            f"got {activation_type!r}"
        )
    names = tuple(a.lower() if isinstance(a, str) else a for a in activation_type)
    if len(names) == 2 and names[0] in ("linear", "clamped_linear"):
        names = names[::-1]
    if names not in ACTIVATION_KINDS:
        known = ", ".join(str(k) for k in ACTIVATION_KINDS)
        raise ValueError(
            f"argument 'activation_type' must be one of {known} (callables are not supported); "
            f"got {tuple(activation_type)!r}"
        )
    return names


def activation_kind(activation_type) -> str:
    """te-core's kind name ("gelu", "swiglu", ...) of an activation_type tuple."""
    return ACTIVATION_KINDS[canonicalize_activation_type(activation_type)]


def activation_attributes(kind: str, activation_params) -> dict:
    """The limit/alpha keywords of cpp_extensions' activation calls: clamped_swiglu's
    activation_params (a mapping or an object with .limit and .alpha; None: the
    defaults). The other kinds take no parameters."""
    if kind != "clamped_swiglu":
        if activation_params is not None:
            raise ValueError(f"argument 'activation_params' is only for clamped_swiglu, got {activation_params!r}")
        return {}
    if activation_params is None:
        return dict(CLAMPED_SWIGLU_DEFAULTS)
    get = activation_params.get if isinstance(activation_params, Mapping) else partial(getattr, activation_params)
    unknown = set(activation_params) - set(CLAMPED_SWIGLU_DEFAULTS) if isinstance(activation_params, Mapping) else ()
    if unknown:
        raise ValueError(f"argument 'activation_params' has unknown keys {sorted(unknown)} (limit, alpha)")
    return {name: float(get(name, default)) for name, default in CLAMPED_SWIGLU_DEFAULTS.items()}


def check_activation_input(x, activation_type) -> tuple[str, int]:
    """(kind, ACT_DIM) after checking that x is (..., ACT_DIM, K)."""
    names = canonicalize_activation_type(activation_type)
    if x.ndim < 2 or x.shape[-2] != len(names):
        raise ValueError(
            f"argument 'x' must have shape (..., {len(names)}, K) for activation_type {names} "
            f"(ACT_DIM = len(activation_type) before the last dim), got {tuple(x.shape)}"
        )
    return ACTIVATION_KINDS[names], len(names)


def activation(x, activation_type=("gelu",), quantizer=None, act_params=None):
    """The activation of activation_type over x (..., ACT_DIM, K) -> (..., K), x's type.

    quantizer: None only (the FP8 activation output is fused into layernorm_mlp;
    a standalone FP8 result is not yet supported). act_params: clamped_swiglu's
    {"limit", "alpha"} (see activation_attributes).
    """
    kind, _ = check_activation_input(x, activation_type)
    if quantizer is not None:
        raise NotImplementedError(
            "activation: argument 'quantizer' is not yet supported (the FP8 activation output is fused into "
            "layernorm_mlp); pass quantizer=None"
        )
    attrs = tuple(sorted(activation_attributes(kind, act_params).items()))
    mesh = active_mesh()
    if mesh is not None:  # rows on the batch axes, K on tp; no collective (docs/te_jax.md)
        from ._sharded_ops import sharded_activation

        return sharded_activation(
            mesh, partial(_activation_fwd, kind=kind, attrs=attrs), partial(_activation_bwd, kind, attrs), x
        )
    return _activation(x, kind, attrs)


@partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _activation(x, kind, attrs):
    return _activation_fwd(x, kind, attrs)[0]


def _flat(x):
    """(..., ACT_DIM, K) as (..., ACT_DIM * K): the [activated | linear] halves the kernels read."""
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def _activation_fwd(x, kind, attrs):
    return activation_fwd(_flat(x), kind, **dict(attrs)), x


def _activation_bwd(kind, attrs, x, dy):
    return (activation_bwd(dy, _flat(x), kind, **dict(attrs)).reshape(x.shape),)


_activation.defvjp(_activation_fwd, _activation_bwd)
