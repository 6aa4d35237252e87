"""Per-tensor FP8 quantizers as JAX pytrees.

A quantizer is an immutable value: quantizing returns the FP8 data and the
quantizer as it stands afterwards (with a delayed-scaling amax recorded), so
state flows through jit and grad like any other array.

    q = saturate(round_to_nearest_even(float32(x) * scale)),   dequantized as float32(q) * scale_inv

CurrentScaleQuantizer: scale = fp8_max / max(amax(x), amax_epsilon), from the
    tensor itself at each cast (rounded down to a power of 2 with power_2_scale).
DelayedScaleQuantizer: scale comes from earlier steps. quantize() records
    max(amax_history[0], amax(x)) in amax_history[0]; update() then runs the
    recipe step (te/recipe.h): roll the history (the newest amax goes to the end,
    slot 0 is zeroed) and scale = (fp8_max * 2^-margin) / amax, amax the window
    max ("max") or the newest amax ("most_recent"); 0 or non-finite keeps the
    old scale.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from .scaling_modes import ScalingMode


def _static(default):
    """A dataclass field that is pytree metadata (hashed into jit's cache key), not a leaf."""
    return dataclasses.field(default=default, metadata={"static": True})


class ScaledTensor(NamedTuple):
    """A per-tensor FP8 tensor: the rowwise copy (x's shape), the columnwise copy
    ([K, M], x viewed as [M, K] and transposed), either may be None, and the
    FP32 scale_inv (1,) that dequantizes both."""

    rowwise: jax.Array | None
    columnwise: jax.Array | None
    scale_inv: jax.Array


def _ext():
    # Imported on first use: building quantizers must not register the FFI targets.
    from .. import cpp_extensions

    return cpp_extensions


@dataclasses.dataclass(frozen=True, eq=False)
class CurrentScaleQuantizer:
    """Float8CurrentScaling: each cast scales the tensor by its own amax. No state."""

    scaling_mode: ClassVar[ScalingMode] = ScalingMode.CURRENT_TENSOR_SCALING

    q_dtype: jnp.dtype = _static(jnp.dtype(jnp.float8_e4m3fn))
    power_2_scale: bool = _static(False)
    amax_epsilon: float = _static(0.0)

    def quantize(self, x, *, rowwise=True, columnwise=False) -> tuple[ScaledTensor, CurrentScaleQuantizer]:
        """Returns (the FP8 copies of x, this quantizer unchanged)."""
        row, col, _, scale_inv, _ = _ext().quantize_fp8_current_scaling(
            x,
            self.q_dtype,
            rowwise=rowwise,
            columnwise=columnwise,
            force_pow_2_scales=self.power_2_scale,
            amax_epsilon=self.amax_epsilon,
        )
        return ScaledTensor(row, col, scale_inv), self

    def update(self) -> CurrentScaleQuantizer:
        return self


@dataclasses.dataclass(frozen=True, eq=False)
class DelayedScaleQuantizer:
    """DelayedScaling: scale (1,) float32 (starts at 1) and amax_history (L,)
    float32 (starts at 0; slot 0 collects the current step's amax) are pytree
    leaves; q_dtype, margin and amax_compute_algo are static."""

    scaling_mode: ClassVar[ScalingMode] = ScalingMode.DELAYED_TENSOR_SCALING

    scale: jax.Array = dataclasses.field(default_factory=lambda: jnp.ones((1,), jnp.float32))
    amax_history: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros((1024,), jnp.float32))
    q_dtype: jnp.dtype = _static(jnp.dtype(jnp.float8_e4m3fn))
    margin: float = _static(0.0)
    amax_compute_algo: str = _static("max")

    def quantize(self, x, *, rowwise=True, columnwise=False) -> tuple[ScaledTensor, DelayedScaleQuantizer]:
        """Quantizes x with the current scale; returns (the FP8 copies, this
        quantizer with max(amax_history[0], amax(x)) in amax_history[0])."""
        history = self.amax_history
        if history.ndim != 1 or history.shape[0] < 1 or jnp.dtype(history.dtype) != jnp.float32:
            raise ValueError(
                "argument 'amax_history' of DelayedScaleQuantizer must be float32 of shape (L,), L >= 1, got "
                f"{jnp.dtype(history.dtype).name} {tuple(history.shape)}"
            )
        row, col, scale_inv, amax = _ext().quantize_fp8(
            x, self.scale, history[:1], self.q_dtype, rowwise=rowwise, columnwise=columnwise
        )
        return ScaledTensor(row, col, scale_inv), self.record(amax)

    def record(self, amax) -> DelayedScaleQuantizer:
        """This quantizer with amax (float32 (1,), already max-accumulated with
        amax_history[0]) in slot 0: what quantize() leaves behind, for a kernel
        (norm, activation) that wrote the FP8 copy with this scale itself."""
        return dataclasses.replace(self, amax_history=self.amax_history.at[0].set(amax[0]))

    def update(self) -> DelayedScaleQuantizer:
        """The recipe step on this quantizer's history (one column of te/recipe.h's [L, n])."""
        history, scale, _ = _ext().delayed_scaling_update(
            self.amax_history.reshape(-1, 1),
            self.scale,
            self.q_dtype,
            margin=self.margin,
            amax_compute_algo=self.amax_compute_algo,
        )
        return dataclasses.replace(self, scale=scale, amax_history=history.reshape(-1))


for _cls in (CurrentScaleQuantizer, DelayedScaleQuantizer):
    jax.tree_util.register_dataclass(_cls)

Quantizer = CurrentScaleQuantizer | DelayedScaleQuantizer
