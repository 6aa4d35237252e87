"""Per-tensor FP8 quantizers as JAX pytrees.

A quantizer is an immutable value: quantizing returns the FP8 data and the
quantizer as it stands afterwards (with a delayed-scaling amax recorded), so
state flows through jit and grad like any other array.

    q = saturate(round_to_nearest_even(float32(x) * scale)),   dequantized as float32(q) * scale_inv

CurrentScaleQuantizer: scale = fp8_max / max(amax(x), amax_epsilon), from the
    tensor itself at each cast (rounded down to a power of 2 with power_2_scale).
MXFP8Quantizer: one power-of-two scale per block of 32 elements from the block
    itself (te/mxfp8.h); no state. Its copies are a BlockScaledTensor.
Float8BlockQuantizer: one FP32 scale per 1x128 block or 128x128 tile from the
    block itself (te/fp8_block.h); no state. A BlockScaledTensor too.
DelayedScaleQuantizer: scale comes from earlier steps. quantize() records
    max(amax_history[0], amax(x)) in amax_history[0]; update() then runs the
    recipe step (te/recipe.h): roll the history (the newest amax goes to the end,
    slot 0 is zeroed) and scale = (fp8_max * 2^-margin) / amax, amax the window
    max ("max") or the newest amax ("most_recent"); 0 or non-finite keeps the
    old scale.

Inside an op partitioned over a mesh (transformer_engine/jax/_partition.py)
every amax is max-reduced over the mesh axes (all but pp's) before it is used or
recorded, so each shard quantizes with the scale the whole tensor would give:
the delayed-scaling data-parallel amax reduction, and current scaling's global
amax (amax -> pmax -> scale -> quantize with that scale).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from transformer_engine.core.gemm_block import SCALING  # te_scaling_mode codes, one table
from transformer_engine.core.nvfp4 import RHT_SIGN_MASK

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


_AMAX_AXES: tuple[str, ...] = ()  # mesh axes amaxes are max-reduced over (while tracing a partitioned op)


@contextlib.contextmanager
def amax_reduction(axes: tuple[str, ...]):
    """Inside: every quantizer amax is jax.lax.pmax'ed over `axes` (in a shard_map body)."""
    global _AMAX_AXES
    previous, _AMAX_AXES = _AMAX_AXES, tuple(axes)
    try:
        yield
    finally:
        _AMAX_AXES = previous


def amax_reduction_active() -> bool:
    return bool(_AMAX_AXES)


def reduce_amax(amax):
    """amax max-reduced over the active reduction axes (unchanged outside a partitioned op)."""
    return jax.lax.pmax(amax, _AMAX_AXES) if _AMAX_AXES else amax


def _fp8_max(q_dtype) -> float:
    return float(jnp.finfo(q_dtype).max)


def scale_from_amax(amax, q_dtype, x_dtype, power_2_scale: bool, amax_epsilon: float):
    """Current scaling's scale (te/cast.h, te_cast_quantize_fp8_current_scaling), in float32:
    fp8_max / max(amax, eps); 1 for 0 / inf / NaN; the largest finite value of x's type where
    the division overflows; the mantissa cleared with power_2_scale."""
    a = jnp.maximum(amax, jnp.float32(amax_epsilon))
    bad = (a == 0) | ~jnp.isfinite(a)
    scale = jnp.float32(_fp8_max(q_dtype)) / jnp.where(bad, jnp.float32(1), a)
    scale = jnp.where(jnp.isinf(scale), jnp.float32(jnp.finfo(x_dtype).max), scale)
    if power_2_scale:
        bits = jax.lax.bitcast_convert_type(scale, jnp.uint32) & jnp.uint32(0xFF800000)
        scale = jax.lax.bitcast_convert_type(bits, jnp.float32)
    return jnp.where(bad, jnp.float32(1), scale)


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
        if amax_reduction_active():  # the global amax first: every shard then casts with one scale
            amax = reduce_amax(_ext().compute_amax(x))
            scale = scale_from_amax(amax, self.q_dtype, x.dtype, self.power_2_scale, self.amax_epsilon)
            row, col, scale_inv, _ = _ext().quantize_fp8(
                x, scale, jnp.zeros((1,), jnp.float32), self.q_dtype, rowwise=rowwise, columnwise=columnwise
            )
            return ScaledTensor(row, col, scale_inv), self
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
        (norm, activation) that wrote the FP8 copy with this scale itself. In a
        partitioned op amax is first max-reduced over the mesh, so every shard
        records the same history and computes the same next scale."""
        amax = reduce_amax(amax)
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


@dataclasses.dataclass(frozen=True)
class BlockScaledTensor:
    """A block-scaled tensor viewed as [M, K]: the rowwise copy and its scales, the
    columnwise copy and its scales (either pair may be None); `scaling` (static) is
    the te_scaling_mode code the GEMMs read them with. MXFP8 (4): both copies keep
    the [M, K] shape, only the blocks differ (1x32 / 32x1), E8M0 scales. FP8 block
    1-D (2) / 2-D (3): the columnwise copy is transposed ([K, M]), FP32 scales in
    te/fp8_block.h's GEMM-ready layout. NVFP4 (5): E2M1 packed two per byte
    (uint8 [M, K/2], columnwise [K, M/2] transposed), E4M3 scales, and each copy's
    global amax."""

    rowwise: jax.Array | None = None
    rowwise_scale_inv: jax.Array | None = None
    columnwise: jax.Array | None = None
    columnwise_scale_inv: jax.Array | None = None
    scaling: int = _static(SCALING["mxfp8"])
    rowwise_amax: jax.Array | None = None  # NVFP4 (5) only: each copy's global amax
    columnwise_amax: jax.Array | None = None

    def only(self, rowwise: bool) -> BlockScaledTensor:
        """This tensor with one copy kept (what a backward GEMM reads)."""
        if rowwise:
            return dataclasses.replace(self, columnwise=None, columnwise_scale_inv=None, columnwise_amax=None)
        return dataclasses.replace(self, rowwise=None, rowwise_scale_inv=None, rowwise_amax=None)


@dataclasses.dataclass(frozen=True, eq=False)
class MXFP8Quantizer:
    """MXFP8BlockScaling: E8M0 scales per 32-element block, from the block's amax. No
    state (update() returns it unchanged). use_2d_blocks: 32x32 tiles (the recipe's
    enable_2d_quantization for weights): rowwise and columnwise data are then identical."""

    scaling_mode: ClassVar[ScalingMode] = ScalingMode.MXFP8_1D_SCALING

    q_dtype: jnp.dtype = _static(jnp.dtype(jnp.float8_e4m3fn))
    use_2d_blocks: bool = _static(False)

    def quantize(self, x, *, rowwise=True, columnwise=False) -> tuple[BlockScaledTensor, MXFP8Quantizer]:
        """Returns (the MXFP8 copies of x viewed as [M, K], this quantizer unchanged).
        The blocks are local: inside a partitioned op each shard quantizes its own
        blocks, the same bytes as the whole tensor when shard edges fall on blocks."""
        k = x.shape[-1]
        row, row_si, col, col_si = _ext().quantize_mxfp8(
            x.reshape(-1, k),
            self.q_dtype,
            rowwise=rowwise,
            columnwise=columnwise,
            use_2d_blocks=self.use_2d_blocks,
        )
        return BlockScaledTensor(row, row_si, col, col_si, scaling=SCALING["mxfp8"]), self

    def update(self) -> MXFP8Quantizer:
        return self


@dataclasses.dataclass(frozen=True, eq=False)
class Float8BlockQuantizer:
    """Float8BlockScaling: one FP32 scale per 1x128 block (128x1 columnwise), or per
    128x128 tile with block_2d (the recipe's ``*_block_scaling_dim`` == 2: weights by
    default), from the block's amax (te/fp8_block.h); power_2_scale and amax_epsilon
    from the recipe's QParams. No state."""

    scaling_mode: ClassVar[ScalingMode] = ScalingMode.FP8_BLOCK_SCALING

    q_dtype: jnp.dtype = _static(jnp.dtype(jnp.float8_e4m3fn))
    block_2d: bool = _static(False)
    power_2_scale: bool = _static(True)
    amax_epsilon: float = _static(0.0)

    def quantize(self, x, *, rowwise=True, columnwise=False) -> tuple[BlockScaledTensor, Float8BlockQuantizer]:
        """Returns (the FP8-block copies of x viewed as [M, K], this quantizer unchanged)."""
        row, row_si, col, col_si = _ext().quantize_fp8_block(
            x.reshape(-1, x.shape[-1]),
            self.q_dtype,
            rowwise=rowwise,
            columnwise=columnwise,
            block_2d=self.block_2d,
            force_pow_2_scales=self.power_2_scale,
            amax_epsilon=self.amax_epsilon,
        )
        scaling = SCALING["fp8_block_2d" if self.block_2d else "fp8_block_1d"]
        return BlockScaledTensor(row, row_si, col, col_si, scaling=scaling), self

    def update(self) -> Float8BlockQuantizer:
        return self


def rng_state_from_key(key) -> jax.Array:
    """A legacy PRNG key (uint32 (2,), jax.random.PRNGKey) as NVFP4Quantizer's float32 (4,) rng_state."""
    words = jnp.asarray(key, jnp.uint32).reshape(2)
    halves = jnp.stack([words >> 16, words & 0xFFFF], axis=-1).reshape(4)
    return halves.astype(jnp.float32)


def _key_of(state) -> jax.Array:
    halves = state.astype(jnp.uint32).reshape(2, 2)
    return (halves[:, 0] << 16) | halves[:, 1]


@dataclasses.dataclass(frozen=True, eq=False)
class NVFP4Quantizer:
    """NVFP4BlockScaling (te/nvfp4.h): E2M1 data, E4M3 scales per 16 elements (16x16
    tiles with block_2d), a global scale from the tensor's amax (max-reduced over the
    mesh inside a partitioned op). random_hadamard: the columnwise copy (a wgrad
    operand) carries the random Hadamard transform with rht_sign_mask.
    stochastic_rounding draws its words from rng_state, a PRNG key kept as float32
    (4,) (its two uint32 words in 16-bit halves, exact: the state must be a float leaf
    to come back as the quantizer set's cotangent, as delayed scaling's does);
    quantize() returns the quantizer with the key advanced. rng_state_from_key()
    makes one. In a partitioned op each shard folds its mesh index into the draw:
    the shards round independently (and so differently from one device's run,
    which draws by global position)."""

    scaling_mode: ClassVar[ScalingMode] = ScalingMode.NVFP4_1D_SCALING

    rng_state: jax.Array | None = None
    block_2d: bool = _static(False)
    stochastic_rounding: bool = _static(False)
    random_hadamard: bool = _static(False)
    rht_sign_mask: int = _static(RHT_SIGN_MASK)

    def quantize(self, x, *, rowwise=True, columnwise=False) -> tuple[BlockScaledTensor, NVFP4Quantizer]:
        """Returns (the NVFP4 copies of x viewed as [M, K], this quantizer with its key advanced)."""
        x2 = x.reshape(-1, x.shape[-1])
        rht = self.random_hadamard and columnwise
        amax_row, amax_col = _ext().nvfp4_amax(x2, random_hadamard=rht, rht_sign_mask=self.rht_sign_mask)
        amax_row, amax_col = reduce_amax(amax_row), reduce_amax(amax_col)
        rng, after = None, self
        if self.stochastic_rounding:
            if self.rng_state is None:
                raise ValueError(
                    "NVFP4Quantizer with stochastic_rounding needs an rng_state "
                    "(rng_state_from_key(jax.random.PRNGKey(...)))"
                )
            key, draw = jax.random.split(_key_of(self.rng_state))
            if _AMAX_AXES:  # (in a partitioned op: each shard its own words, not copies of one draw)
                draw = jax.random.fold_in(draw, jax.lax.axis_index(_AMAX_AXES))
            rng, after = (
                jax.random.bits(draw, (4,), jnp.uint32),
                dataclasses.replace(self, rng_state=rng_state_from_key(key)),
            )
        row, row_s, col, col_s = _ext().quantize_nvfp4(
            x2,
            amax_row,
            amax_col,
            rng,
            rowwise=rowwise,
            columnwise=columnwise,
            block_2d=self.block_2d,
            stochastic_rounding=self.stochastic_rounding,
            random_hadamard=rht,
            rht_sign_mask=self.rht_sign_mask,
        )
        tensor = BlockScaledTensor(
            row, row_s, col, col_s, scaling=SCALING["nvfp4"], rowwise_amax=amax_row, columnwise_amax=amax_col
        )
        return tensor, after

    def update(self) -> NVFP4Quantizer:
        return self


for _cls in (
    CurrentScaleQuantizer,
    DelayedScaleQuantizer,
    MXFP8Quantizer,
    Float8BlockQuantizer,
    NVFP4Quantizer,
    BlockScaledTensor,
):
    jax.tree_util.register_dataclass(_cls)

Quantizer = CurrentScaleQuantizer | DelayedScaleQuantizer | MXFP8Quantizer | Float8BlockQuantizer | NVFP4Quantizer
